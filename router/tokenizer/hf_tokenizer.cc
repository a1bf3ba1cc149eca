#include "router/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "router/tokenizer/bpe.h"
#include "router/tokenizer/read_file.h"
#include "router/tokenizer/regex.h"
#include "router/tokenizer/utf8.h"

#ifdef RINGLANE_TOKENIZER_HAVE_ICU
#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#endif

namespace ringlane::router {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex, which the ByteLevel pre-tokenizer applies when
// use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Unicode White_Space, which Rust's char::is_whitespace tests.
constexpr std::string_view kWhitespaceRun =
    R"([\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]+)";
// Rust's is_ascii_punctuation or a Unicode P* category.
constexpr std::string_view kPunctuationChar =
    R"([\p{P}\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}])";
// Longer words are rare and would only bloat the cache.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

// GPT-2's reversible byte -> printable character map: printable Latin-1
// bytes map to themselves, the other 68 to U+0100 upwards in byte order.
struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::unordered_map<char32_t, uint8_t> char_to_byte;
};

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables* tables = [] {
    auto* t = new ByteLevelTables;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      utf8::Append(cp, &t->byte_to_char[b]);
      t->char_to_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return *tables;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xHH>" byte-fallback token stands for, or -1.
int BytePiece(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const int hi = HexDigit(token[3]);
  const int lo = HexDigit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string ByteTokenName(int byte) {
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", byte);
  return name;
}

void ReplaceAllLiteral(std::string_view from, std::string_view to, std::string* text) {
  if (from.empty() || text->find(from) == std::string::npos) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = text->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(*text, pos, hit - pos);
    out.append(to);
  }
  out.append(*text, pos);
  *text = std::move(out);
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Turns match ranges into the pieces `behavior` keeps, as tokenizers'
// NormalizedString::split does: matches (or, with `invert`, the text between
// them) are the delimiters.
std::vector<std::pair<size_t, size_t>> SplitRanges(
    size_t size, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
    Behavior behavior) {
  struct Part {
    size_t begin, end;
    bool delimiter;
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (const auto& [b, e] : matches) {
    if (b > pos) parts.push_back({pos, b, invert});
    parts.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < size) parts.push_back({pos, size, invert});

  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.delimiter) out.emplace_back(p.begin, p.end);
      }
      break;
    case Behavior::kIsolated:
      for (const Part& p : parts) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_delimiter = false;
      for (const Part& p : parts) {
        if (p.delimiter && !previous_delimiter && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_delimiter = p.delimiter;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_delimiter = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->delimiter && !previous_delimiter && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_delimiter = it->delimiter;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_delimiter = false;
      for (const Part& p : parts) {
        if (p.delimiter && previous_delimiter) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_delimiter = p.delimiter;
      }
      break;
    }
  }
  return out;
}

// A piece of text moving through the pre-tokenizers. `at_origin`: it starts
// at offset 0 of the original input, which Metaspace's "first" scheme asks.
struct Piece {
  std::string text;
  bool at_origin;
};

struct Normalizer {
  enum Kind { kPrepend, kReplace, kStrip, kUnicode, kLowercase } kind;
  std::string text;              // kPrepend: prefix; kReplace: literal pattern.
  std::string content;           // kReplace: replacement.
  std::unique_ptr<Regex> regex;  // kReplace with a Regex pattern.
  bool strip_left = false, strip_right = false;
  std::string form;  // kUnicode: "NFC", "NFD", "NFKC" or "NFKD".
};

struct PreTokenizer {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::unique_ptr<Regex> regex;  // kSplit; kByteLevel with use_regex.
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = false;
};

struct Decoder {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kByteLevel, kMetaspace } kind;
  std::string pattern;            // kReplace literal
  std::unique_ptr<Regex> regex;   // kReplace Regex
  std::string content;            // kReplace replacement; kStrip character; kMetaspace char
  int start = 0, stop = 0;        // kStrip
  bool strip_first_space = true;  // kMetaspace: prepend_scheme != never
};

struct AddedToken {
  int32_t id;
  std::string content;
  // What is looked for in text: `content`, normalized for normalized tokens.
  std::string match;
  bool special, lstrip, rstrip, single_word, normalized;
};

// Finds added tokens in text, leftmost first and longest at a position, as
// the aho-corasick automaton in tokenizers does.
class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;
    int32_t id;  // -1 for text between tokens.
  };

  void Build(const std::vector<AddedToken>* tokens, bool normalized, const Regex* word_char) {
    word_char_ = word_char;
    for (const AddedToken& t : *tokens) {
      if (t.normalized != normalized || t.match.empty()) continue;
      by_first_byte_[static_cast<unsigned char>(t.match[0])].push_back(&t);
    }
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->match.size() > b->match.size();
      });
    }
  }

  std::vector<Segment> Split(std::string_view text) const {
    std::vector<Segment> out;
    size_t done = 0;  // End of the last token emitted.
    size_t i = 0;
    while (i < text.size()) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, t->match.size(), t->match) == 0 &&
            (!t->single_word || StandsAlone(text, i, i + t->match.size()))) {
          hit = t;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i;
      size_t end = i + hit->match.size();
      if (hit->lstrip) {
        while (begin > done) {
          size_t prev = begin - 1;
          while (prev > done && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
          const utf8::Unit u = utf8::Scan(text, prev);
          if (u.kind != utf8::Unit::kChar || !utf8::IsWhitespace(u.code_point)) break;
          begin = prev;
        }
      }
      if (hit->rstrip) {
        while (end < text.size()) {
          const utf8::Unit u = utf8::Scan(text, end);
          if (u.kind != utf8::Unit::kChar || !utf8::IsWhitespace(u.code_point)) break;
          end += u.length;
        }
      }
      if (begin > done) out.push_back({done, begin, -1});
      out.push_back({begin, end, hit->id});
      done = i = end;
    }
    if (done < text.size()) out.push_back({done, text.size(), -1});
    return out;
  }

 private:
  bool IsWordChar(std::string_view ch) const {
    std::vector<std::pair<size_t, size_t>> m;
    return word_char_->FindAll(ch, &m).ok() && !m.empty();
  }

  // single_word: no word character right before or after the match.
  bool StandsAlone(std::string_view text, size_t begin, size_t end) const {
    if (begin > 0) {
      size_t prev = begin - 1;
      while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
      if (IsWordChar(text.substr(prev, begin - prev))) return false;
    }
    if (end < text.size()) {
      const utf8::Unit u = utf8::Scan(text, end);
      if (IsWordChar(text.substr(end, u.length))) return false;
    }
    return true;
  }

  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
  const Regex* word_char_ = nullptr;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string source;

  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  bool has_decoder = false;
  std::vector<Decoder> decoders;

  // The BPE model.
  std::unordered_map<std::string, int32_t> vocab;
  BpeMerges merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_ids;

  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_ids;
  std::unique_ptr<Regex> word_char;
  AddedTokenMatcher raw_matcher;
  AddedTokenMatcher normalized_matcher;

  // Framing tokens Encode adds with add_special_tokens.
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
  int32_t bos = -1;
  int32_t eos = -1;

  enum class IdKind : uint8_t { kNone, kModel, kAdded, kSpecial };
  std::vector<std::string> id_to_token;
  std::vector<IdKind> id_kind;

  mutable absl::Mutex cache_mu;
  // Word -> its BPE ids; cleared when full.
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);

  absl::Status Normalize(std::string_view in, std::string* out) const;
  absl::Status PreTokenize(std::string text, bool at_origin, std::vector<Piece>* words) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  std::optional<int32_t> Lookup(std::string_view token) const {
    if (auto it = added_ids.find(std::string(token)); it != added_ids.end()) return it->second;
    if (auto it = vocab.find(std::string(token)); it != vocab.end()) return it->second;
    return std::nullopt;
  }
};

namespace {

// ------------------------------------------------------------------ parsing

class Parser {
 public:
  explicit Parser(HfTokenizer::Impl* impl) : t_(*impl) {}

  absl::Status Parse(const json& root, const json* config);

 private:
  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(t_.source, ": ", what));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(t_.source, ": ", what));
  }
  static std::string TypeOf(const json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string()
               ? j["type"].get<std::string>()
               : std::string("(no type)");
  }
  static bool Bool(const json& j, const char* key, bool fallback) {
    return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
  }
  static std::string String(const json& j, const char* key, std::string fallback) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
  }
  // A {"String": s} or {"Regex": r} pattern: sets `literal` or `regex`.
  absl::Status Pattern(const json& j, const char* where, std::string* literal,
                       std::unique_ptr<Regex>* regex);

  absl::Status Model(const json& model);
  absl::Status AddedTokens(const json& list);
  absl::Status NormalizerNode(const json& j);
  absl::Status PreTokenizerNode(const json& j);
  absl::Status DecoderNode(const json& j, bool* fused);
  absl::Status PostProcessorNode(const json& j);
  absl::Status Config(const json& config);

  HfTokenizer::Impl& t_;
};

absl::Status Parser::Pattern(const json& j, const char* where, std::string* literal,
                             std::unique_ptr<Regex>* regex) {
  if (!j.is_object()) return Invalid(absl::StrCat(where, ": pattern is not an object"));
  if (j.contains("String") && j["String"].is_string()) {
    *literal = j["String"].get<std::string>();
    return absl::OkStatus();
  }
  if (j.contains("Regex") && j["Regex"].is_string()) {
    absl::StatusOr<std::unique_ptr<Regex>> r = Regex::Compile(j["Regex"].get<std::string>(), false);
    if (!r.ok()) return Invalid(absl::StrCat(where, ": ", r.status().message()));
    *regex = std::move(*r);
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(where, ": pattern has neither String nor Regex"));
}

absl::Status Parser::Model(const json& model) {
  if (!model.is_object()) return Invalid("\"model\" is missing or not an object");
  const std::string type = String(model, "type", "BPE");
  if (type != "BPE") {
    return Unsupported(absl::StrCat("model type ", type, " is not supported (only BPE)"));
  }
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0) {
    return Unsupported("BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!String(model, key, "").empty()) {
      return Unsupported(absl::StrCat("BPE ", key, " is not supported"));
    }
  }
  t_.fuse_unk = Bool(model, "fuse_unk", false);
  t_.byte_fallback = Bool(model, "byte_fallback", false);
  t_.ignore_merges = Bool(model, "ignore_merges", false);

  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Invalid("model.vocab is missing or not an object");
  }
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat("model.vocab[\"", token, "\"] is not a valid id"));
    }
    t_.vocab[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  const std::string unk = String(model, "unk_token", "");
  if (!unk.empty()) {
    const auto it = t_.vocab.find(unk);
    if (it == t_.vocab.end()) {
      return Invalid(absl::StrCat("model.unk_token \"", unk, "\" is not in the vocabulary"));
    }
    t_.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = t_.vocab.find(ByteTokenName(b));
    t_.byte_ids[b] = it == t_.vocab.end() ? -1 : it->second;
  }

  if (!model.contains("merges") || !model["merges"].is_array()) {
    return Invalid("model.merges is missing or not an array");
  }
  const json& merges = model["merges"];
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    if (m.is_string()) {
      // Legacy "a b": tokens cannot contain a space in this form.
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos) {
        return Invalid(absl::StrCat("model.merges[", rank, "] \"", line, "\" is not \"a b\""));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Invalid(absl::StrCat("model.merges[", rank, "] is neither \"a b\" nor [a, b]"));
    }
    const auto l = t_.vocab.find(left);
    const auto r = t_.vocab.find(right);
    const auto merged = t_.vocab.find(left + right);
    if (l == t_.vocab.end() || r == t_.vocab.end() || merged == t_.vocab.end()) {
      return Invalid(absl::StrCat("model.merges[", rank, "] (\"", left, "\", \"", right,
                                  "\") uses or makes a token that is not in the vocabulary"));
    }
    t_.merges.Add(l->second, r->second, static_cast<double>(rank), merged->second);
  }
  return absl::OkStatus();
}

absl::Status Parser::AddedTokens(const json& list) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return Invalid("added_tokens is not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() >= std::numeric_limits<int32_t>::max() || !a.contains("content") ||
        !a["content"].is_string()) {
      return Invalid(absl::StrCat("added_tokens[", i, "] needs an integer id and a content"));
    }
    AddedToken t;
    t.id = static_cast<int32_t>(a["id"].get<int64_t>());
    t.content = a["content"].get<std::string>();
    t.special = Bool(a, "special", false);
    t.lstrip = Bool(a, "lstrip", false);
    t.rstrip = Bool(a, "rstrip", false);
    t.single_word = Bool(a, "single_word", false);
    t.normalized = Bool(a, "normalized", !t.special);
    t_.added_ids[t.content] = t.id;
    t_.added.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::Status Parser::NormalizerNode(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return Invalid("normalizer Sequence without a normalizers array");
    }
    for (const json& n : j["normalizers"]) {
      absl::Status s = NormalizerNode(n);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Normalizer n;
  if (type == "Prepend") {
    n.kind = Normalizer::kPrepend;
    n.text = String(j, "prepend", "");
  } else if (type == "Replace") {
    n.kind = Normalizer::kReplace;
    n.content = String(j, "content", "");
    absl::Status s = Pattern(j.value("pattern", json()), "Replace normalizer", &n.text, &n.regex);
    if (!s.ok()) return s;
  } else if (type == "Strip") {
    n.kind = Normalizer::kStrip;
    n.strip_left = Bool(j, "strip_left", true);
    n.strip_right = Bool(j, "strip_right", true);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" ||
             type == "Lowercase") {
#ifdef RINGLANE_TOKENIZER_HAVE_ICU
    n.kind = type == "Lowercase" ? Normalizer::kLowercase : Normalizer::kUnicode;
    n.form = type;
#else
    return Unsupported(absl::StrCat("normalizer ", type,
                                    " needs ICU, which this build lacks (install libicu-dev "
                                    "and reconfigure)"));
#endif
  } else {
    return Unsupported(absl::StrCat("normalizer type ", type, " is not supported"));
  }
  t_.normalizers.push_back(std::move(n));
  return absl::OkStatus();
}

absl::Status Parser::PreTokenizerNode(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  PreTokenizer p;
  const auto compile = [&](std::string_view pattern) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Regex>> r = Regex::Compile(pattern, false);
    if (!r.ok()) return Invalid(absl::StrCat(type, " pre-tokenizer: ", r.status().message()));
    p.regex = std::move(*r);
    return absl::OkStatus();
  };
  const auto behavior = [&](const std::string& name, Behavior* out) -> absl::Status {
    static const std::pair<const char*, Behavior> kNames[] = {
        {"Removed", Behavior::kRemoved},
        {"Isolated", Behavior::kIsolated},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious},
        {"MergedWithNext", Behavior::kMergedWithNext},
        {"Contiguous", Behavior::kContiguous}};
    for (const auto& [n, b] : kNames) {
      if (name == n) {
        *out = b;
        return absl::OkStatus();
      }
    }
    return Invalid(absl::StrCat(type, " pre-tokenizer: unknown behavior \"", name, "\""));
  };
  absl::Status s;
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return Invalid("pre_tokenizer Sequence without a pretokenizers array");
    }
    for (const json& n : j["pretokenizers"]) {
      s = PreTokenizerNode(n);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    std::string literal;
    s = Pattern(j.value("pattern", json()), "Split pre-tokenizer", &literal, &p.regex);
    if (s.ok() && p.regex == nullptr) {
      absl::StatusOr<std::unique_ptr<Regex>> r = Regex::Compile(literal, true);
      if (!r.ok()) return Invalid(r.status().message());
      p.regex = std::move(*r);
    }
    if (s.ok()) s = behavior(String(j, "behavior", "Isolated"), &p.behavior);
    p.invert = Bool(j, "invert", false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::kByteLevel;
    p.add_prefix_space = Bool(j, "add_prefix_space", true);
    if (Bool(j, "use_regex", true)) s = compile(kGpt2Pattern);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::kMetaspace;
    p.replacement = String(j, "replacement", "\xE2\x96\x81");
    p.split = Bool(j, "split", true);
    // Older files say add_prefix_space instead of prepend_scheme.
    const std::string scheme =
        String(j, "prepend_scheme", Bool(j, "add_prefix_space", true) ? "always" : "never");
    if (scheme == "always") {
      p.prepend = PreTokenizer::kAlways;
    } else if (scheme == "first") {
      p.prepend = PreTokenizer::kFirst;
    } else if (scheme == "never") {
      p.prepend = PreTokenizer::kNever;
    } else {
      return Invalid(
          absl::StrCat("Metaspace pre-tokenizer: unknown prepend_scheme \"", scheme, "\""));
    }
  } else if (type == "Digits") {
    p.kind = PreTokenizer::kSplit;
    s = compile(Bool(j, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "Whitespace") {
    p.kind = PreTokenizer::kSplit;
    p.behavior = Behavior::kRemoved;
    p.invert = true;
    s = compile(R"(\w+|[^\w\s]+)");
  } else if (type == "WhitespaceSplit") {
    p.kind = PreTokenizer::kSplit;
    p.behavior = Behavior::kRemoved;
    s = compile(kWhitespaceRun);
  } else if (type == "Punctuation") {
    p.kind = PreTokenizer::kSplit;
    s = compile(kPunctuationChar);
    if (s.ok()) s = behavior(String(j, "behavior", "Isolated"), &p.behavior);
  } else {
    return Unsupported(absl::StrCat("pre_tokenizer type ", type, " is not supported"));
  }
  if (!s.ok()) return s;
  t_.pre_tokenizers.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status Parser::DecoderNode(const json& j, bool* fused) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  Decoder d;
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) {
      return Invalid("decoder Sequence without a decoders array");
    }
    for (const json& n : j["decoders"]) {
      absl::Status s = DecoderNode(n, fused);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (type == "Replace") {
    d.kind = Decoder::kReplace;
    d.content = String(j, "content", "");
    absl::Status s = Pattern(j.value("pattern", json()), "Replace decoder", &d.pattern, &d.regex);
    if (!s.ok()) return s;
  } else if (type == "ByteFallback") {
    d.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::kFuse;
    *fused = true;
  } else if (type == "Strip") {
    d.kind = Decoder::kStrip;
    d.content = String(j, "content", " ");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
    if (d.content.empty() || utf8::Scan(d.content, 0).length != d.content.size()) {
      return Invalid("Strip decoder: content must be one character");
    }
    // Stripping the end of the whole text would mean holding back output
    // until the sequence ends, which streaming cannot do.
    if (*fused && d.stop > 0) {
      return Unsupported("Strip decoder with stop > 0 after Fuse is not supported");
    }
  } else if (type == "ByteLevel") {
    d.kind = Decoder::kByteLevel;
  } else if (type == "Metaspace") {
    d.kind = Decoder::kMetaspace;
    d.content = String(j, "replacement", "\xE2\x96\x81");
    const std::string scheme =
        String(j, "prepend_scheme", Bool(j, "add_prefix_space", true) ? "always" : "never");
    d.strip_first_space = scheme != "never";
  } else {
    return Unsupported(absl::StrCat("decoder type ", type, " is not supported"));
  }
  t_.decoders.push_back(std::move(d));
  return absl::OkStatus();
}

absl::Status Parser::PostProcessorNode(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return Invalid("post_processor Sequence without a processors array");
    }
    for (const json& n : j["processors"]) {
      absl::Status s = PostProcessorNode(n);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // Only adjusts offsets.
  std::vector<int32_t> prefix, suffix;
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) {
      return Invalid("TemplateProcessing without a single template");
    }
    const json specials = j.value("special_tokens", json::object());
    bool seen_sequence = false;
    for (const json& item : j["single"]) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return Invalid("TemplateProcessing: template item is neither Sequence nor SpecialToken");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        return Invalid(absl::StrCat("TemplateProcessing: special token \"", name,
                                    "\" is not in special_tokens"));
      }
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) {
          return Invalid(
              absl::StrCat("TemplateProcessing: ids of \"", name, "\" are not integers"));
        }
        (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 ||
          !j[key][1].is_number_integer()) {
        return Invalid(absl::StrCat(type, ": ", key, " is not [token, id]"));
      }
    }
    prefix.push_back(j["cls"][1].get<int32_t>());
    suffix.push_back(j["sep"][1].get<int32_t>());
  } else {
    return Unsupported(absl::StrCat("post_processor type ", type, " is not supported"));
  }
  // A later processor frames what the earlier ones produced.
  t_.prefix.insert(t_.prefix.begin(), prefix.begin(), prefix.end());
  t_.suffix.insert(t_.suffix.end(), suffix.begin(), suffix.end());
  return absl::OkStatus();
}

absl::Status Parser::Config(const json& config) {
  // bos_token/eos_token are strings or AddedToken objects ({"content": ...}).
  const auto token_id = [&](const char* key, int32_t* id) -> absl::Status {
    if (!config.contains(key) || config[key].is_null()) return absl::OkStatus();
    const json& v = config[key];
    std::string name;
    if (v.is_string()) {
      name = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      name = v["content"].get<std::string>();
    } else {
      return Invalid(absl::StrCat("tokenizer_config.json: ", key, " is not a token"));
    }
    std::optional<int32_t> found = t_.Lookup(name);
    if (!found) {
      return Invalid(
          absl::StrCat("tokenizer_config.json: ", key, " \"", name, "\" is not in the vocabulary"));
    }
    *id = *found;
    return absl::OkStatus();
  };
  absl::Status s = token_id("bos_token", &t_.bos);
  if (s.ok()) s = token_id("eos_token", &t_.eos);
  if (!s.ok()) return s;
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean() && t_.bos >= 0) {
    const bool has = !t_.prefix.empty() && t_.prefix.front() == t_.bos;
    if (config["add_bos_token"].get<bool>() && !has) t_.prefix.insert(t_.prefix.begin(), t_.bos);
    if (!config["add_bos_token"].get<bool>() && has) t_.prefix.erase(t_.prefix.begin());
  }
  if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean() && t_.eos >= 0) {
    const bool has = !t_.suffix.empty() && t_.suffix.back() == t_.eos;
    if (config["add_eos_token"].get<bool>() && !has) t_.suffix.push_back(t_.eos);
    if (!config["add_eos_token"].get<bool>() && has) t_.suffix.pop_back();
  }
  return absl::OkStatus();
}

absl::Status Parser::Parse(const json& root, const json* config) {
  if (!root.is_object()) return Invalid("top level is not a JSON object");
  absl::Status s = Model(root.value("model", json()));
  if (s.ok()) s = AddedTokens(root.value("added_tokens", json()));
  if (s.ok()) s = NormalizerNode(root.value("normalizer", json()));
  if (s.ok()) s = PreTokenizerNode(root.value("pre_tokenizer", json()));
  bool fused = false;
  if (s.ok()) {
    t_.has_decoder = root.contains("decoder") && !root["decoder"].is_null();
    s = DecoderNode(root.value("decoder", json()), &fused);
  }
  if (s.ok()) s = PostProcessorNode(root.value("post_processor", json()));
  if (!s.ok()) return s;

  // Id tables over the model vocabulary and the added tokens; an added token
  // wins where both name an id.
  int32_t size = 0;
  for (const auto& [token, id] : t_.vocab) size = std::max(size, id + 1);
  for (const AddedToken& a : t_.added) size = std::max(size, a.id + 1);
  t_.id_to_token.assign(size, std::string());
  t_.id_kind.assign(size, HfTokenizer::Impl::IdKind::kNone);
  for (const auto& [token, id] : t_.vocab) {
    t_.id_to_token[id] = token;
    t_.id_kind[id] = HfTokenizer::Impl::IdKind::kModel;
  }
  for (const AddedToken& a : t_.added) {
    t_.id_to_token[a.id] = a.content;
    t_.id_kind[a.id] =
        a.special ? HfTokenizer::Impl::IdKind::kSpecial : HfTokenizer::Impl::IdKind::kAdded;
  }
  // Every framing id must be a token: Encode adds them to every prompt, and
  // an id inside the table's range that no token has would not decode.
  for (const std::vector<int32_t>* ids : {&t_.prefix, &t_.suffix}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= size || t_.id_kind[id] == HfTokenizer::Impl::IdKind::kNone) {
        return Invalid(absl::StrCat("post_processor id ", id, " is unknown"));
      }
    }
  }

  // Normalized added tokens are looked for in normalized text, so their
  // own text is normalized the same way first.
  for (AddedToken& a : t_.added) {
    a.match = a.content;
    if (a.normalized && !t_.normalizers.empty()) {
      s = t_.Normalize(a.content, &a.match);
      if (!s.ok()) return s;
    }
  }
  absl::StatusOr<std::unique_ptr<Regex>> word = Regex::Compile(R"(^\w$)", false);
  if (!word.ok()) return word.status();
  t_.word_char = std::move(*word);
  t_.raw_matcher.Build(&t_.added, /*normalized=*/false, t_.word_char.get());
  t_.normalized_matcher.Build(&t_.added, /*normalized=*/true, t_.word_char.get());

  if (!t_.prefix.empty()) t_.bos = t_.prefix.front();
  if (config != nullptr) {
    s = Config(*config);
    if (!s.ok()) return s;
  }
  if (t_.eos < 0) {
    // tokenizer.json does not say which token ends a text; these are the
    // names the common model families use.
    for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|eot_id|>"}) {
      const auto it = t_.added_ids.find(name);
      if (it != t_.added_ids.end()) {
        t_.eos = it->second;
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ------------------------------------------------------------------- encode

absl::Status HfTokenizer::Impl::Normalize(std::string_view in, std::string* out) const {
  std::string text(in);
  for (const Normalizer& n : normalizers) {
    switch (n.kind) {
      case Normalizer::kPrepend:
        if (!text.empty()) text.insert(0, n.text);
        break;
      case Normalizer::kReplace:
        if (n.regex != nullptr) {
          absl::StatusOr<std::string> r = n.regex->ReplaceAll(text, n.content);
          if (!r.ok()) return r.status();
          text = std::move(*r);
        } else {
          ReplaceAllLiteral(n.text, n.content, &text);
        }
        break;
      case Normalizer::kStrip: {
        size_t begin = 0, end = text.size();
        while (n.strip_left && begin < end) {
          const utf8::Unit u = utf8::Scan(text, begin);
          if (!utf8::IsWhitespace(u.code_point)) break;
          begin += u.length;
        }
        while (n.strip_right && end > begin) {
          size_t prev = end - 1;
          while (prev > begin && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
          if (!utf8::IsWhitespace(utf8::Scan(text, prev).code_point)) break;
          end = prev;
        }
        text = text.substr(begin, end - begin);
        break;
      }
      case Normalizer::kUnicode:
      case Normalizer::kLowercase: {
#ifdef RINGLANE_TOKENIZER_HAVE_ICU
        UErrorCode error = U_ZERO_ERROR;
        std::string result;
        if (n.kind == Normalizer::kLowercase) {
          icu::UnicodeString::fromUTF8(text).toLower(icu::Locale::getRoot()).toUTF8String(result);
        } else {
          const icu::Normalizer2* form = n.form == "NFC"   ? icu::Normalizer2::getNFCInstance(error)
                                         : n.form == "NFD" ? icu::Normalizer2::getNFDInstance(error)
                                         : n.form == "NFKC"
                                             ? icu::Normalizer2::getNFKCInstance(error)
                                             : icu::Normalizer2::getNFKDInstance(error);
          if (U_SUCCESS(error)) {
            icu::StringByteSink<std::string> sink(&result);
            form->normalizeUTF8(0, text, sink, nullptr, error);
          }
        }
        if (U_FAILURE(error)) {
          return absl::InternalError(
              absl::StrCat(source, ": ICU ", n.form, " failed: ", u_errorName(error)));
        }
        text = std::move(result);
#endif
        break;
      }
    }
  }
  *out = std::move(text);
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::PreTokenize(std::string text, bool at_origin,
                                            std::vector<Piece>* words) const {
  std::vector<Piece> pieces;
  pieces.push_back(Piece{std::move(text), at_origin});
  std::vector<Piece> next;
  std::vector<std::pair<size_t, size_t>> matches;
  const auto split = [&](const Piece& p, const Regex& regex, bool invert,
                         Behavior behavior) -> absl::Status {
    matches.clear();
    absl::Status s = regex.FindAll(p.text, &matches);
    if (!s.ok()) return s;
    for (const auto& [b, e] : SplitRanges(p.text.size(), matches, invert, behavior)) {
      if (e > b) next.push_back(Piece{p.text.substr(b, e - b), p.at_origin && b == 0});
    }
    return absl::OkStatus();
  };
  for (const PreTokenizer& step : pre_tokenizers) {
    next.clear();
    for (Piece& p : pieces) {
      absl::Status s;
      switch (step.kind) {
        case PreTokenizer::kSplit:
          s = split(p, *step.regex, step.invert, step.behavior);
          break;
        case PreTokenizer::kByteLevel: {
          if (step.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
          const size_t first = next.size();
          if (step.regex != nullptr) {
            s = split(p, *step.regex, false, Behavior::kIsolated);
          } else {
            next.push_back(std::move(p));
          }
          const auto& table = ByteLevel().byte_to_char;
          for (size_t i = first; i < next.size(); ++i) {
            std::string mapped;
            mapped.reserve(next[i].text.size() * 2);
            for (char c : next[i].text) mapped.append(table[static_cast<unsigned char>(c)]);
            next[i].text = std::move(mapped);
          }
          break;
        }
        case PreTokenizer::kMetaspace: {
          ReplaceAllLiteral(" ", step.replacement, &p.text);
          const bool prepend = step.prepend == PreTokenizer::kAlways ||
                               (step.prepend == PreTokenizer::kFirst && p.at_origin);
          if (prepend && p.text.compare(0, step.replacement.size(), step.replacement) != 0) {
            p.text.insert(0, step.replacement);
          }
          if (!step.split) {
            next.push_back(std::move(p));
            break;
          }
          // Each replacement character starts a new piece.
          size_t begin = 0;
          for (size_t hit = p.text.find(step.replacement, 1); hit != std::string::npos;
               hit = p.text.find(step.replacement, hit + step.replacement.size())) {
            next.push_back(Piece{p.text.substr(begin, hit - begin), p.at_origin && begin == 0});
            begin = hit;
          }
          next.push_back(Piece{p.text.substr(begin), p.at_origin && begin == 0});
          break;
        }
      }
      if (!s.ok()) return s;
    }
    pieces.swap(next);
  }
  for (Piece& p : pieces) {
    if (!p.text.empty()) words->push_back(std::move(p));
  }
  return absl::OkStatus();
}

void HfTokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    const auto it = vocab.find(std::string(word));
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    absl::MutexLock lock(&cache_mu);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool last_unk = false;
  std::string ch;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = utf8::Scan(word, pos).length;
    ch.assign(word.substr(pos, len));
    pos += len;
    if (const auto it = vocab.find(ch); it != vocab.end()) {
      symbols.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) symbols.push_back(byte_ids[static_cast<unsigned char>(c)]);
      last_unk = false;
      continue;
    }
    // Without an unk token the character is dropped, as tokenizers does.
    if (unk_id >= 0 && !(fuse_unk && last_unk)) symbols.push_back(unk_id);
    last_unk = unk_id >= 0;
  }
  std::vector<int32_t> merged = merges.Apply(symbols);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::move(key), std::move(merged));
  }
}

// ------------------------------------------------------------------- public

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(
    const std::string& tokenizer_json_path, const std::string& tokenizer_config_path) {
  absl::StatusOr<std::string> text = ReadWholeFile(tokenizer_json_path);
  if (!text.ok()) return text.status();
  std::string config;
  std::string source = tokenizer_json_path;
  if (!tokenizer_config_path.empty()) {
    absl::StatusOr<std::string> c = ReadWholeFile(tokenizer_config_path);
    if (!c.ok()) return c.status();
    config = std::move(*c);
    absl::StrAppend(&source, " (with ", tokenizer_config_path, ")");
  }
  return FromJson(*text, config, source);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  const std::string& src = impl->source;
  const json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": tokenizer.json is not valid JSON"));
  }
  json config;
  if (!tokenizer_config_json.empty()) {
    config = json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": tokenizer_config.json is not a JSON object"));
    }
  }
  absl::Status status;
  // The parser checks types before reading values; this only catches what
  // slipped through (e.g. a number out of int32 range), so that no
  // exception leaves the library.
  try {
    status = Parser(impl.get()).Parse(root, config.is_null() ? nullptr : &config);
  } catch (const json::exception& e) {
    status = absl::InvalidArgumentError(absl::StrCat(src, ": ", e.what()));
  }
  if (!status.ok()) return status;
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                         bool add_special_tokens) const {
  const Impl& t = *impl_;
  if (const size_t bad = utf8::FirstInvalid(text); bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 at byte ", bad, " (", t.source, ")"));
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = t.prefix;
  std::string normalized;
  std::vector<Piece> words;
  for (const AddedTokenMatcher::Segment& seg : t.raw_matcher.Split(text)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    absl::Status s = t.Normalize(text.substr(seg.begin, seg.end - seg.begin), &normalized);
    if (!s.ok()) return s;
    for (const AddedTokenMatcher::Segment& sub : t.normalized_matcher.Split(normalized)) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      words.clear();
      s = t.PreTokenize(normalized.substr(sub.begin, sub.end - sub.begin),
                        seg.begin == 0 && sub.begin == 0, &words);
      if (!s.ok()) return s;
      for (const Piece& w : words) t.EncodeWord(w.text, &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

absl::Status HfTokenizer::DecodeToken(int32_t id, bool skip_special_tokens, DecodeState* state,
                                      std::string* out) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= static_cast<int32_t>(t.id_kind.size()) ||
      t.id_kind[id] == HfTokenizer::Impl::IdKind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is not in the vocabulary of ", t.source));
  }
  const Impl::IdKind kind = t.id_kind[id];
  state->prev_id = id;
  if (skip_special_tokens && kind == HfTokenizer::Impl::IdKind::kSpecial) return absl::OkStatus();
  std::string text = t.id_to_token[id];
  if (!t.has_decoder) {
    // tokenizers joins tokens with spaces when there is no decoder.
    if (state->num_rendered > 0) text.insert(0, " ");
  }
  const bool added = kind != HfTokenizer::Impl::IdKind::kModel;
  bool fused = false;
  for (const Decoder& d : t.decoders) {
    switch (d.kind) {
      case Decoder::kReplace:
        if (d.regex == nullptr) {
          ReplaceAllLiteral(d.pattern, d.content, &text);
        } else if (utf8::FirstInvalid(text) == text.size()) {
          // A lone byte from ByteFallback cannot match and PCRE2 needs UTF-8.
          absl::StatusOr<std::string> r = d.regex->ReplaceAll(text, d.content);
          if (!r.ok()) return r.status();
          text = std::move(*r);
        }
        break;
      case Decoder::kByteFallback:
        if (const int byte = BytePiece(text); byte >= 0) text.assign(1, static_cast<char>(byte));
        break;
      case Decoder::kFuse:
        fused = true;
        break;
      case Decoder::kStrip: {
        if (fused) {
          // After Fuse the whole text is one token: strip its start only.
          while (!state->text_started && state->leading_stripped < d.start &&
                 text.compare(0, d.content.size(), d.content) == 0) {
            text.erase(0, d.content.size());
            ++state->leading_stripped;
          }
          break;
        }
        for (int i = 0; i < d.start && text.compare(0, d.content.size(), d.content) == 0; ++i) {
          text.erase(0, d.content.size());
        }
        for (int i = 0;
             i < d.stop && text.size() >= d.content.size() &&
             text.compare(text.size() - d.content.size(), d.content.size(), d.content) == 0;
             ++i) {
          text.resize(text.size() - d.content.size());
        }
        break;
      }
      case Decoder::kByteLevel: {
        // Added tokens are plain text (transformers decodes them apart from
        // the byte-level pieces). A token with a character outside the byte
        // table is kept as it is, as tokenizers does.
        if (added) break;
        const auto& table = ByteLevel().char_to_byte;
        std::string bytes;
        bool ok = true;
        for (size_t pos = 0; pos < text.size() && ok;) {
          const utf8::Unit u = utf8::Scan(text, pos);
          const auto it = table.find(u.code_point);
          ok = u.kind == utf8::Unit::kChar && it != table.end();
          if (ok) bytes.push_back(static_cast<char>(it->second));
          pos += u.length;
        }
        if (ok) text = std::move(bytes);
        break;
      }
      case Decoder::kMetaspace:
        ReplaceAllLiteral(d.content, " ", &text);
        if (d.strip_first_space && state->num_rendered == 0 && !text.empty() && text[0] == ' ') {
          text.erase(0, 1);
        }
        break;
    }
  }
  out->append(text);
  state->text_started = state->text_started || !text.empty();
  ++state->num_rendered;
  return absl::OkStatus();
}

int32_t HfTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_kind.size()); }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }

std::vector<int32_t> HfTokenizer::StopIds() const {
  if (impl_->eos < 0) return {};
  return {impl_->eos};
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] == HfTokenizer::Impl::IdKind::kSpecial;
}

std::string_view HfTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_to_token[id];
}

std::optional<int32_t> HfTokenizer::TokenToId(std::string_view token) const {
  return impl_->Lookup(token);
}

}  // namespace ringlane::router
