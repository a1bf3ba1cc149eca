#include "router/request/tool_parser.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringlane::router {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kArgKeyOpen = "<arg_key>";
constexpr std::string_view kArgKeyClose = "</arg_key>";
constexpr std::string_view kArgValueOpen = "<arg_value>";
constexpr std::string_view kArgValueClose = "</arg_value>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// A GLM name or key longer than this without its terminator is not one
// (prose that happens to contain "<tool_call>"); bounds what is held back.
constexpr size_t kMaxGlmName = 128;
constexpr size_t kMaxGlmKey = 256;

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipWs(std::string_view s, size_t p) {
  while (p < s.size() && IsWs(s[p])) ++p;
  return p;
}

std::string_view Trim(std::string_view s) {
  size_t b = SkipWs(s, 0);
  size_t e = s.size();
  while (e > b && IsWs(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// s is non-empty and could still grow into marker.
bool IsProperPrefixOf(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

// Longest suffix of s that is a proper prefix of one of the markers: the text
// a stream must hold back because the next chunk may complete a marker.
size_t HeldSuffix(std::string_view s, const std::vector<std::string_view>& markers) {
  size_t held = 0;
  for (std::string_view m : markers) {
    for (size_t n = std::min(s.size(), m.size() - 1); n > held; --n) {
      if (s.substr(s.size() - n) == m.substr(0, n)) {
        held = n;
        break;
      }
    }
  }
  return held;
}

void AppendEscapedControl(char c, std::string* out) {
  switch (c) {
    case '\b':
      *out += "\\b";
      return;
    case '\f':
      *out += "\\f";
      return;
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default: {
      static constexpr char kHex[] = "0123456789abcdef";
      *out += "\\u00";
      *out += kHex[(static_cast<unsigned char>(c) >> 4) & 0xf];
      *out += kHex[static_cast<unsigned char>(c) & 0xf];
    }
  }
}

// The body of a JSON string literal. Bytes from 0x80 pass as they are: the
// text is UTF-8 from the detokenizer, and clients want the characters, not
// \u escapes.
void AppendJsonEscaped(std::string_view s, std::string* out) {
  out->reserve(out->size() + s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      AppendEscapedControl(c, out);
    } else {
      *out += c;
    }
  }
}

std::string JsonEscape(std::string_view s) {
  std::string out;
  AppendJsonEscaped(s, &out);
  return out;
}

std::string JsonQuote(std::string_view s) {
  std::string out(1, '"');
  AppendJsonEscaped(s, &out);
  out += '"';
  return out;
}

bool ValidJsonNumber(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    size_t b = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - b;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// Scans one JSON value a byte at a time and copies it out, keeping track of
// the last point where the copy could still be completed to valid JSON by
// appending closers only (inside a string, after "{" or "[", after a whole
// value). Text up to that point is safe to stream; what follows it (a key,
// a half number, a trailing comma) is held until the next such point. Raw
// control characters inside strings, which models do emit and strict JSON
// parsers reject, are escaped in the copy.
class JsonScanner {
 public:
  // Consumes a prefix of s, stopping after the value ends or at the first
  // byte that cannot continue it. Returns the bytes consumed.
  size_t Scan(std::string_view s) {
    size_t i = 0;
    while (i < s.size() && st_ != kDone && st_ != kError) {
      if (Step(s[i])) ++i;
    }
    return i;
  }
  bool done() const { return st_ == kDone; }
  bool error() const { return st_ == kError; }
  // The safe text not taken yet (after done(): the whole value).
  std::string TakeSafe() { return std::exchange(safe_, std::string()); }
  // What completes the taken text to valid JSON.
  const std::string& closers() const { return closers_; }

 private:
  enum State {
    kValue,
    kArrFirst,
    kObjFirst,
    kObjKey,
    kKey,
    kKeyEsc,
    kKeyHex,
    kColon,
    kStr,
    kStrEsc,
    kStrHex,
    kNumber,
    kLiteral,
    kAfterValue,
    kDone,
    kError,
  };

  // Returns whether c was consumed; a number or literal ends on the byte
  // after it, which is then looked at again in the new state.
  bool Step(char c) {
    bool consumed = StepState(c);
    if (st_ == kObjFirst || st_ == kArrFirst || st_ == kAfterValue || st_ == kStr || st_ == kDone) {
      safe_ += pending_;
      pending_.clear();
      closers_.assign(st_ == kStr ? 1 : 0, '"');
      for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) closers_ += *it == '{' ? '}' : ']';
    }
    return consumed;
  }

  bool StepState(char c) {
    switch (st_) {
      case kValue:
      case kArrFirst:
        if (IsWs(c)) return Keep(c);
        if (st_ == kArrFirst && c == ']') return Close(c);
        if (c == '{' || c == '[') {
          stack_.push_back(c);
          st_ = c == '{' ? kObjFirst : kArrFirst;
          return Keep(c);
        }
        if (c == '"') {
          st_ = kStr;
          return Keep(c);
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
          st_ = kNumber;
          word_ = c;
          return Keep(c);
        }
        if (c == 't' || c == 'f' || c == 'n') {
          st_ = kLiteral;
          word_ = c;
          return Keep(c);
        }
        return Fail();
      case kObjFirst:
      case kObjKey:
        if (IsWs(c)) return Keep(c);
        if (st_ == kObjFirst && c == '}') return Close(c);
        if (c == '"') {
          st_ = kKey;
          return Keep(c);
        }
        return Fail();
      case kKey:
      case kStr:
        if (c == '\\') {
          st_ = st_ == kKey ? kKeyEsc : kStrEsc;
          return Keep(c);
        }
        if (c == '"') {
          pending_ += c;
          if (st_ == kKey) {
            st_ = kColon;
          } else {
            ValueEnded();
          }
          return true;
        }
        if (static_cast<unsigned char>(c) < 0x20) {
          AppendEscapedControl(c, &pending_);
          return true;
        }
        return Keep(c);
      case kKeyEsc:
      case kStrEsc: {
        bool key = st_ == kKeyEsc;
        if (c == 'u') {
          hex_left_ = 4;
          st_ = key ? kKeyHex : kStrHex;
          return Keep(c);
        }
        if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Fail();
        st_ = key ? kKey : kStr;
        return Keep(c);
      }
      case kKeyHex:
      case kStrHex:
        if (!std::isxdigit(static_cast<unsigned char>(c))) return Fail();
        if (--hex_left_ == 0) st_ = st_ == kKeyHex ? kKey : kStr;
        return Keep(c);
      case kColon:
        if (IsWs(c)) return Keep(c);
        if (c != ':') return Fail();
        st_ = kValue;
        return Keep(c);
      case kNumber:
        if ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
          word_ += c;
          return Keep(c);
        }
        if (!ValidJsonNumber(word_)) return Fail();
        ValueEnded();
        return false;
      case kLiteral:
        if (c >= 'a' && c <= 'z') {
          word_ += c;
          bool prefix = false;
          for (std::string_view lit : {"true", "false", "null"}) {
            prefix = prefix || StartsWith(lit, word_);
          }
          if (!prefix) return Fail();
          return Keep(c);
        }
        if (word_ != "true" && word_ != "false" && word_ != "null") return Fail();
        ValueEnded();
        return false;
      case kAfterValue:
        if (IsWs(c)) return Keep(c);
        if (c == ',') {
          st_ = stack_.back() == '{' ? kObjKey : kValue;
          return Keep(c);
        }
        if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
          return Close(c);
        }
        return Fail();
      case kDone:
      case kError:
        return false;
    }
    return false;
  }

  bool Keep(char c) {
    pending_ += c;
    return true;
  }
  bool Close(char c) {
    pending_ += c;
    stack_.pop_back();
    ValueEnded();
    return true;
  }
  bool Fail() {
    st_ = kError;
    return false;
  }
  void ValueEnded() { st_ = stack_.empty() ? kDone : kAfterValue; }

  State st_ = kValue;
  std::vector<char> stack_;  // open '{' and '['
  std::string word_;         // the number or literal being read
  int hex_left_ = 0;
  std::string safe_, pending_, closers_;
};

enum class Res { kOk, kMore, kBad };

// Scans the JSON value at s[p]; on kOk sets *end past it and, when copy is
// given, the value's text as JsonScanner copies it.
Res ScanValue(std::string_view s, size_t p, size_t* end, std::string* copy = nullptr) {
  JsonScanner sc;
  size_t n = sc.Scan(s.substr(p));
  if (sc.error()) return Res::kBad;
  if (!sc.done()) return Res::kMore;
  *end = p + n;
  if (copy != nullptr) *copy = sc.TakeSafe();
  return Res::kOk;
}

std::optional<std::string> DecodeJsonString(std::string_view literal) {
  nlohmann::json j = nlohmann::json::parse(literal, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

struct CallObject {
  enum Kind {
    kMore,
    kBad,
    // Name known and declared, the arguments object starts at end: stream it.
    kStream,
    // The whole object read (the tail, or a call whose arguments came first,
    // were a string or were missing): arguments complete, end past "}".
    kWhole,
  } kind = kMore;
  std::string name;
  std::string arguments;
  size_t end = 0;
};

// Reads a {"name": N, "arguments": A} object from the start of s, as far as it
// can be decided; tail: s is what follows the streamed arguments (",..." or
// "}"), whose members are skipped. Members other than name, arguments and
// parameters (a "type" or "id" some models add) are skipped.
CallObject ReadCallObject(std::string_view s, bool tail,
                          const std::map<std::string, nlohmann::json>& tools) {
  CallObject r;
  auto bad = [&] {
    r.kind = CallObject::kBad;
    return r;
  };
  size_t p = 0;
  if (!tail) {
    p = SkipWs(s, p);
    if (p == s.size()) return r;
    if (s[p] != '{') return bad();
    ++p;
  }
  bool have_name = false;
  std::optional<std::string> args;
  bool first = !tail;        // right after "{": a member or "}"
  bool want_member = false;  // right after ",": a member
  for (;;) {
    p = SkipWs(s, p);
    if (p == s.size()) return r;
    if (!first && !want_member) {
      if (s[p] == ',') {
        ++p;
        want_member = true;
        continue;
      }
      if (s[p] != '}') return bad();
      ++p;
      break;
    }
    if (first && s[p] == '}') {
      ++p;
      break;
    }
    if (s[p] != '"') return bad();
    size_t e = 0;
    Res res = ScanValue(s, p, &e);
    if (res == Res::kBad) return bad();
    if (res == Res::kMore) return r;
    std::optional<std::string> key = DecodeJsonString(s.substr(p, e - p));
    if (!key) return bad();
    p = SkipWs(s, e);
    if (p == s.size()) return r;
    if (s[p] != ':') return bad();
    p = SkipWs(s, p + 1);
    if (p == s.size()) return r;
    if (!tail && *key == "name" && !have_name) {
      if (s[p] != '"') return bad();
      res = ScanValue(s, p, &e);
      if (res == Res::kBad) return bad();
      if (res == Res::kMore) return r;
      std::optional<std::string> name = DecodeJsonString(s.substr(p, e - p));
      if (!name || tools.count(*name) == 0) return bad();
      r.name = *name;
      have_name = true;
    } else if (!tail && (*key == "arguments" || *key == "parameters") && !args) {
      if (s[p] == '{' && have_name) {
        r.kind = CallObject::kStream;
        r.end = p;
        return r;
      }
      std::string copy;
      if (s[p] == '{') {
        res = ScanValue(s, p, &e, &copy);
        if (res == Res::kBad) return bad();
        if (res == Res::kMore) return r;
        args = std::move(copy);
      } else if (s[p] == '"') {
        res = ScanValue(s, p, &e);
        if (res == Res::kBad) return bad();
        if (res == Res::kMore) return r;
        std::optional<std::string> text = DecodeJsonString(s.substr(p, e - p));
        if (!text) return bad();
        std::string_view inner = Trim(*text);
        nlohmann::json j = nlohmann::json::parse(inner, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object()) return bad();
        args = std::string(inner);
      } else {
        return bad();
      }
    } else {
      res = ScanValue(s, p, &e);
      if (res == Res::kBad) return bad();
      if (res == Res::kMore) return r;
    }
    p = e;
    first = false;
    want_member = false;
  }
  if (!tail && !have_name) return bad();
  r.kind = CallObject::kWhole;
  r.arguments = args.value_or("{}");
  r.end = p;
  return r;
}

// Whether the declared schema makes parameter key of tool name a string, so
// that GLM writes its value raw.
bool ParamIsString(const std::map<std::string, nlohmann::json>& tools, const std::string& name,
                   const std::string& key) {
  auto tool = tools.find(name);
  if (tool == tools.end() || !tool->second.is_object()) return false;
  auto props = tool->second.find("properties");
  if (props == tool->second.end() || !props->is_object()) return false;
  auto prop = props->find(key);
  if (prop == props->end() || !prop->is_object()) return false;
  auto type = prop->find("type");
  if (type == prop->end()) return false;
  if (type->is_string()) return type->get<std::string>() == "string";
  if (type->is_array()) {
    for (const auto& t : *type) {
      if (t.is_string() && t.get<std::string>() == "string") return true;
    }
  }
  return false;
}

// A non-string GLM value: its JSON text when it is JSON, else a string.
std::string GlmValueJson(std::string_view v) {
  std::string_view t = Trim(v);
  if (!t.empty()) {
    nlohmann::json j = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return std::string(t);
  }
  return JsonQuote(v);
}

}  // namespace

struct OutputStreamParser::ArgsState {
  JsonScanner scanner;
};

OutputStreamParser::OutputStreamParser(ToolParserOptions options)
    : options_(std::move(options)),
      tools_(!options_.tool_parameters.empty()),
      in_reasoning_(options_.reasoning) {
  mode_ = in_reasoning_ ? Mode::kThinkStart : ContentStartMode();
}

OutputStreamParser::~OutputStreamParser() = default;
OutputStreamParser::OutputStreamParser(OutputStreamParser&&) noexcept = default;
OutputStreamParser& OutputStreamParser::operator=(OutputStreamParser&&) noexcept = default;

OutputStreamParser::Mode OutputStreamParser::ContentStartMode() const {
  if (options_.format == ToolFormat::kLlama31Json) {
    return tools_ ? Mode::kLlamaStart : Mode::kPlain;
  }
  return Mode::kText;
}

OutputDelta OutputStreamParser::Feed(std::string_view chunk) {
  if (finished_) return {};
  buf_.append(chunk.data(), chunk.size());
  Run(/*eof=*/false);
  return std::exchange(out_, OutputDelta());
}

OutputDelta OutputStreamParser::Finish() {
  if (finished_) return {};
  Run(/*eof=*/true);
  finished_ = true;
  // Trailing whitespace held in content_trim_ / reasoning_trim_ is dropped.
  return std::exchange(out_, OutputDelta());
}

void OutputStreamParser::Run(bool eof) {
  while (Step(eof)) {
  }
  buf_.erase(0, pos_);
  pos_ = 0;
}

void OutputStreamParser::EmitText(std::string_view s) {
  TrimState& trim = in_reasoning_ ? reasoning_trim_ : content_trim_;
  std::string& dst = in_reasoning_ ? out_.reasoning_content : out_.content;
  for (char c : s) {
    if (IsWs(c)) {
      if (trim.started) trim.pending += c;
    } else {
      dst += trim.pending;
      trim.pending.clear();
      dst += c;
      trim.started = true;
    }
  }
}

void OutputStreamParser::StartCall(const std::string& name) {
  open_index_ = next_index_++;
  ToolCallDelta d;
  d.index = open_index_;
  d.id = options_.id_prefix + std::to_string(open_index_);
  d.name = name;
  out_.tool_calls.push_back(std::move(d));
}

void OutputStreamParser::EmitArgs(std::string_view s) {
  if (s.empty() || open_index_ < 0) return;
  if (out_.tool_calls.empty() || out_.tool_calls.back().index != open_index_) {
    ToolCallDelta d;
    d.index = open_index_;
    out_.tool_calls.push_back(std::move(d));
  }
  out_.tool_calls.back().arguments.append(s.data(), s.size());
}

void OutputStreamParser::EndCall(std::string_view closers) {
  EmitArgs(closers);
  open_index_ = -1;
}

void OutputStreamParser::RejectCall() {
  if (options_.format == ToolFormat::kLlama31Json) {
    mode_ = Mode::kPlain;
    return;
  }
  // The marker is text after all; what followed it is scanned again as text.
  EmitText(std::string_view(buf_).substr(pos_, marker_len_));
  pos_ += marker_len_;
  mode_ = Mode::kText;
}

bool OutputStreamParser::SkipOptionalMarker(std::string_view rest, std::string_view marker,
                                            bool eof) {
  const size_t p = SkipWs(rest, 0);
  const std::string_view t = rest.substr(p);
  if (StartsWith(t, marker)) {
    pos_ += p + marker.size();
    return true;
  }
  return eof || !(t.empty() || IsProperPrefixOf(t, marker));
}

bool OutputStreamParser::Step(bool eof) {
  std::string_view rest = std::string_view(buf_).substr(pos_);
  switch (mode_) {
    case Mode::kThinkStart:
      if (!SkipOptionalMarker(rest, kThinkOpen, eof)) return false;
      mode_ = Mode::kText;
      return true;
    case Mode::kText:
      return StepText(eof);
    case Mode::kPlain:
      EmitText(rest);
      pos_ += rest.size();
      return !rest.empty();
    case Mode::kLlamaStart: {
      size_t p = SkipWs(rest, 0);
      std::string_view t = rest.substr(p);
      if (StartsWith(t, kPythonTag)) {
        p = SkipWs(rest, p + kPythonTag.size());
        t = rest.substr(p);
      } else if (IsProperPrefixOf(t, kPythonTag) && !eof) {
        return false;
      }
      if (t.empty() && !eof) return false;
      if (!t.empty() && t[0] == '{') {
        call_offset_ = p;
        marker_len_ = 0;
        mode_ = Mode::kJsonHeader;
      } else {
        mode_ = Mode::kPlain;
      }
      return true;
    }
    case Mode::kJsonHeader:
      return StepJsonHeader(eof);
    case Mode::kJsonArgs: {
      JsonScanner& sc = args_->scanner;
      if (rest.empty() && eof) {
        EndCall(sc.closers());
        mode_ = Mode::kDone;
        return true;
      }
      size_t n = sc.Scan(rest);
      pos_ += n;
      EmitArgs(sc.TakeSafe());
      if (sc.error()) {
        EndCall(sc.closers());
        mode_ = Mode::kDrop;
        return true;
      }
      if (sc.done()) {
        EndCall("");
        mode_ = Mode::kJsonTail;
        return true;
      }
      return n > 0;
    }
    case Mode::kJsonTail: {
      CallObject r = ReadCallObject(rest, /*tail=*/true, options_.tool_parameters);
      if (r.kind == CallObject::kMore && !eof) return false;
      if (r.kind != CallObject::kWhole) {
        mode_ = Mode::kDrop;
        return true;
      }
      pos_ += r.end;
      mode_ = options_.format == ToolFormat::kHermes ? Mode::kHermesClose : Mode::kLlamaAfter;
      return true;
    }
    case Mode::kHermesClose:
      // Anything else after a complete object ends the call: a missing
      // "</tool_call>" is tolerated and the text is scanned as text.
      if (!SkipOptionalMarker(rest, kCallClose, eof)) return false;
      mode_ = Mode::kText;
      return true;
    case Mode::kLlamaAfter: {
      size_t p = SkipWs(rest, 0);
      if (p == rest.size()) {
        if (!eof) return false;
        pos_ += p;
        mode_ = Mode::kDone;
        return true;
      }
      if (rest[p] == ';') {
        pos_ += p + 1;
        mode_ = Mode::kLlamaStart;
      } else {
        mode_ = Mode::kPlain;
      }
      return true;
    }
    case Mode::kGlmName:
      return StepGlmName(eof);
    case Mode::kGlmBetween: {
      size_t p = SkipWs(rest, 0);
      std::string_view t = rest.substr(p);
      if (StartsWith(t, kArgKeyOpen)) {
        pos_ += p + kArgKeyOpen.size();
        mode_ = Mode::kGlmKey;
        return true;
      }
      if (StartsWith(t, kCallClose)) {
        pos_ += p + kCallClose.size();
        EndCall(glm_any_ ? "}" : "{}");
        mode_ = Mode::kText;
        return true;
      }
      if (t.empty() || IsProperPrefixOf(t, kArgKeyOpen) || IsProperPrefixOf(t, kCallClose)) {
        if (eof) {
          EndCall(glm_any_ ? "}" : "{}");
          mode_ = Mode::kDone;
          return true;
        }
        pos_ += p;  // whitespace between the parts of a call is no text
        return p > 0;
      }
      EndCall(glm_any_ ? "}" : "{}");
      mode_ = Mode::kDrop;
      return true;
    }
    case Mode::kGlmKey: {
      size_t i = rest.substr(0, kMaxGlmKey + kArgKeyClose.size()).find(kArgKeyClose);
      if (i == std::string_view::npos) {
        if (rest.size() >= kMaxGlmKey + kArgKeyClose.size()) {
          EndCall(glm_any_ ? "}" : "{}");
          mode_ = Mode::kDrop;
          return true;
        }
        if (!eof) return false;
        EndCall(glm_any_ ? "}" : "{}");
        mode_ = Mode::kDone;
        return true;
      }
      glm_key_ = std::string(Trim(rest.substr(0, i)));
      pos_ += i + kArgKeyClose.size();
      mode_ = Mode::kGlmAfterKey;
      return true;
    }
    case Mode::kGlmAfterKey: {
      size_t p = SkipWs(rest, 0);
      std::string_view t = rest.substr(p);
      if (StartsWith(t, kArgValueOpen)) {
        pos_ += p + kArgValueOpen.size();
        if (ParamIsString(options_.tool_parameters, open_name_, glm_key_)) {
          // Declared strings stream as they come (code, long text).
          EmitArgs((glm_any_ ? ", " : "{") + JsonQuote(glm_key_) + ": \"");
          glm_any_ = true;
          mode_ = Mode::kGlmStrValue;
        } else {
          mode_ = Mode::kGlmValue;
        }
        return true;
      }
      if (t.empty() || IsProperPrefixOf(t, kArgValueOpen)) {
        if (eof) {
          EndCall(glm_any_ ? "}" : "{}");
          mode_ = Mode::kDone;
          return true;
        }
        pos_ += p;
        return p > 0;
      }
      EndCall(glm_any_ ? "}" : "{}");
      mode_ = Mode::kDrop;
      return true;
    }
    case Mode::kGlmValue: {
      size_t i = rest.find(kArgValueClose);
      if (i == std::string_view::npos) {
        if (!eof) return false;
        // A value cut off is dropped with its key.
        EndCall(glm_any_ ? "}" : "{}");
        mode_ = Mode::kDone;
        return true;
      }
      EmitArgs((glm_any_ ? ", " : "{") + JsonQuote(glm_key_) + ": " +
               GlmValueJson(rest.substr(0, i)));
      glm_any_ = true;
      pos_ += i + kArgValueClose.size();
      mode_ = Mode::kGlmBetween;
      return true;
    }
    case Mode::kGlmStrValue: {
      size_t i = rest.find(kArgValueClose);
      if (i != std::string_view::npos) {
        EmitArgs(JsonEscape(rest.substr(0, i)) + "\"");
        pos_ += i + kArgValueClose.size();
        mode_ = Mode::kGlmBetween;
        return true;
      }
      if (eof) {
        EmitArgs(JsonEscape(rest));
        pos_ += rest.size();
        EndCall("\"}");
        mode_ = Mode::kDone;
        return true;
      }
      size_t n = rest.size() - HeldSuffix(rest, {kArgValueClose});
      EmitArgs(JsonEscape(rest.substr(0, n)));
      pos_ += n;
      return n > 0;
    }
    case Mode::kDrop: {
      if (options_.format == ToolFormat::kLlama31Json) {
        pos_ += rest.size();
        return false;
      }
      size_t i = rest.find(kCallClose);
      if (i != std::string_view::npos) {
        pos_ += i + kCallClose.size();
        mode_ = Mode::kText;
        return true;
      }
      size_t n = eof ? rest.size() : rest.size() - HeldSuffix(rest, {kCallClose});
      pos_ += n;
      return false;
    }
    case Mode::kDone:
      pos_ += rest.size();
      return false;
  }
  return false;
}

bool OutputStreamParser::StepText(bool eof) {
  std::string_view rest = std::string_view(buf_).substr(pos_);
  std::vector<std::string_view> markers;
  if (in_reasoning_) markers.push_back(kThinkClose);
  bool calls = tools_ && options_.format != ToolFormat::kLlama31Json;
  if (calls) markers.push_back(kCallOpen);
  size_t at = std::string_view::npos;
  std::string_view found;
  for (std::string_view m : markers) {
    size_t i = rest.find(m);
    if (i < at) {
      at = i;
      found = m;
    }
  }
  if (at != std::string_view::npos) {
    EmitText(rest.substr(0, at));
    pos_ += at;
    if (found == kThinkClose) {
      pos_ += kThinkClose.size();
      in_reasoning_ = false;
      mode_ = ContentStartMode();
    } else {
      marker_len_ = kCallOpen.size();
      call_offset_ = kCallOpen.size();
      mode_ = options_.format == ToolFormat::kHermes ? Mode::kJsonHeader : Mode::kGlmName;
    }
    return true;
  }
  size_t n = eof ? rest.size() : rest.size() - HeldSuffix(rest, markers);
  EmitText(rest.substr(0, n));
  pos_ += n;
  return n > 0;
}

bool OutputStreamParser::StepJsonHeader(bool eof) {
  std::string_view rest = std::string_view(buf_).substr(pos_);
  CallObject r =
      ReadCallObject(rest.substr(call_offset_), /*tail=*/false, options_.tool_parameters);
  switch (r.kind) {
    case CallObject::kMore:
      if (!eof) return false;
      RejectCall();  // cut off before it was announced: text
      return true;
    case CallObject::kBad:
      RejectCall();
      return true;
    case CallObject::kStream:
      StartCall(r.name);
      pos_ += call_offset_ + r.end;
      args_ = std::make_unique<ArgsState>();
      mode_ = Mode::kJsonArgs;
      return true;
    case CallObject::kWhole:
      StartCall(r.name);
      EndCall(r.arguments);
      pos_ += call_offset_ + r.end;
      mode_ = options_.format == ToolFormat::kHermes ? Mode::kHermesClose : Mode::kLlamaAfter;
      return true;
  }
  return false;
}

bool OutputStreamParser::StepGlmName(bool eof) {
  std::string_view rest = std::string_view(buf_).substr(pos_);
  size_t start = SkipWs(rest, kCallOpen.size());
  std::string_view window = rest.substr(start, kMaxGlmName);
  size_t i = window.find_first_of("\n<");
  if (i == std::string_view::npos) {
    if (window.size() < kMaxGlmName && !eof) return false;
    RejectCall();
    return true;
  }
  i += start;
  size_t name_end = i;
  size_t consume = i;
  if (rest[i] == '\n') {
    consume = i + 1;
  } else {
    std::string_view t = rest.substr(i);
    if (!StartsWith(t, kArgKeyOpen) && !StartsWith(t, kCallClose)) {
      if ((IsProperPrefixOf(t, kArgKeyOpen) || IsProperPrefixOf(t, kCallClose)) && !eof) {
        return false;
      }
      RejectCall();
      return true;
    }
  }
  std::string name(Trim(rest.substr(start, name_end - start)));
  if (name.empty() || options_.tool_parameters.count(name) == 0) {
    RejectCall();
    return true;
  }
  StartCall(name);
  open_name_ = name;
  glm_any_ = false;
  pos_ += consume;
  mode_ = Mode::kGlmBetween;
  return true;
}

ParsedOutput ParseOutput(std::string_view text, const ToolParserOptions& options) {
  OutputStreamParser parser(options);
  ParsedOutput out;
  AppendDelta(parser.Feed(text), &out);
  AppendDelta(parser.Finish(), &out);
  return out;
}

void AppendDelta(const OutputDelta& delta, ParsedOutput* out) {
  out->content += delta.content;
  out->reasoning_content += delta.reasoning_content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.index < 0) continue;
    if (static_cast<size_t>(d.index) >= out->tool_calls.size()) {
      out->tool_calls.resize(d.index + 1);
    }
    ToolCall& call = out->tool_calls[d.index];
    if (!d.id.empty()) call.id = d.id;
    if (!d.name.empty()) call.name = d.name;
    call.arguments += d.arguments;
  }
}

}  // namespace ringlane::router
