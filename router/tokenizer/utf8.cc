#include "router/tokenizer/utf8.h"

namespace ringlane::router::utf8 {

Unit Scan(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {Unit::kChar, 1, lead};
  size_t need;
  char32_t cp;
  // The second byte's range is narrower than 80..BF after some leads; that
  // is what rules out overlong forms, surrogates and values past U+10FFFF.
  unsigned char lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {Unit::kInvalid, 1, 0xFFFD};
  }
  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= text.size()) return {Unit::kIncomplete, text.size() - pos, 0xFFFD};
    const unsigned char c = byte(pos + i);
    const unsigned char min = i == 1 ? lo : 0x80;
    const unsigned char max = i == 1 ? hi : 0xBF;
    if (c < min || c > max) return {Unit::kInvalid, i, 0xFFFD};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {Unit::kChar, need + 1, cp};
}

size_t FirstInvalid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Unit u = Scan(text, pos);
    if (u.kind != Unit::kChar) return pos;
    pos += u.length;
  }
  return text.size();
}

std::string ToValid(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Unit u = Scan(text, pos);
    if (u.kind == Unit::kChar) {
      out.append(text.substr(pos, u.length));
    } else {
      out.append(kReplacementChar);
    }
    pos += u.length;
  }
  return out;
}

void Append(char32_t cp, std::string* out) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace ringlane::router::utf8
