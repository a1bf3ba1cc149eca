#include "router/grammar/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "router/grammar/grammar_internal.h"

namespace ringlane::router::grammar {

namespace internal {
namespace {

// Limits that make a runaway grammar refuse a byte instead of exhausting
// memory or time. Grammars made here stay far below them (a depth-32 JSON
// value needs about a hundred frames and a few dozen stacks).
constexpr size_t kMaxStacks = 4096;
constexpr size_t kMaxFrames = 1024;
constexpr int kMaxExpansions = 1 << 16;

// Expands `work` until every stack top is a byte set, writing the canonical
// state. False when a limit is hit.
bool Close(const Grammar& g, std::vector<std::vector<int32_t>> work, MatchState* out) {
  std::vector<std::vector<int32_t>> done;
  // Stacks already expanded through a reference: an epsilon cycle (a
  // repetition of something that may be empty) comes back to one of them.
  absl::flat_hash_set<std::vector<int32_t>> seen;
  bool accepting = false;
  int expansions = 0;
  while (!work.empty()) {
    std::vector<int32_t> st = std::move(work.back());
    work.pop_back();
    for (;;) {
      if (st.empty()) {
        accepting = true;
        break;
      }
      const int32_t pos = st.back();
      const int32_t e = g.elems[pos];
      const int32_t kind = e & 3;
      if (kind == kSet) {
        done.push_back(std::move(st));
        if (done.size() > kMaxStacks) return false;
        break;
      }
      if (kind == kEnd) {
        st.pop_back();
        continue;
      }
      if (++expansions > kMaxExpansions) return false;
      if (!seen.insert(st).second) break;
      const auto& alts = g.alts[e >> 2];
      // Tail call: a reference that ends its alternative leaves nothing to
      // return to, so repetition does not deepen the stack.
      if ((g.elems[pos + 1] & 3) == kEnd) {
        st.pop_back();
      } else {
        st.back() = pos + 1;
      }
      if (alts.empty() || st.size() >= kMaxFrames) break;
      for (size_t i = 1; i < alts.size(); ++i) {
        std::vector<int32_t> copy = st;
        copy.push_back(alts[i]);
        work.push_back(std::move(copy));
      }
      st.push_back(alts[0]);
    }
  }
  std::sort(done.begin(), done.end());
  done.erase(std::unique(done.begin(), done.end()), done.end());
  out->stacks.clear();
  out->accepting = accepting;
  for (const auto& st : done) {
    out->stacks.push_back(static_cast<int32_t>(st.size()));
    out->stacks.insert(out->stacks.end(), st.begin(), st.end());
  }
  return true;
}

}  // namespace

ByteSet NextBytes(const Grammar& g, const MatchState& s) {
  ByteSet u{};
  for (size_t i = 0; i < s.stacks.size(); i += s.stacks[i] + 1) {
    const ByteSet& t = g.sets[g.elems[s.stacks[i + s.stacks[i]]] >> 2];
    for (int w = 0; w < 4; ++w) u[w] |= t[w];
  }
  return u;
}

bool Step(const Grammar& g, const MatchState& in, uint8_t b, MatchState* out) {
  std::vector<std::vector<int32_t>> work;
  for (size_t i = 0; i < in.stacks.size(); i += in.stacks[i] + 1) {
    const int32_t len = in.stacks[i];
    const int32_t top = in.stacks[i + len];
    if (!Has(g.sets[g.elems[top] >> 2], b)) continue;
    std::vector<int32_t> st(in.stacks.begin() + i + 1, in.stacks.begin() + i + 1 + len);
    st.back() = top + 1;
    work.push_back(std::move(st));
  }
  if (work.empty()) return false;
  if (!Close(g, std::move(work), out)) return false;
  return out->accepting || !out->stacks.empty();
}

}  // namespace internal

using internal::ByteSet;
using internal::Elem;

// ---- GrammarBuilder::Impl: rule constructors ----

GrammarBuilder::Rule internal::RuleSet::Lit(std::string_view bytes) {
  Rule r = NewRule();
  std::vector<Elem> alt;
  for (char c : bytes) alt.push_back(Ch(c));
  AddAlt(r, std::move(alt));
  return r;
}

GrammarBuilder::Rule internal::RuleSet::Class(const ByteSet& s) {
  Rule r = NewRule();
  AddAlt(r, {S(s)});
  return r;
}

GrammarBuilder::Rule internal::RuleSet::Empty() {
  if (empty < 0) empty = Lit("");
  return empty;
}

GrammarBuilder::Rule internal::RuleSet::Seq(std::vector<Rule> parts) {
  Rule r = NewRule();
  std::vector<Elem> alt;
  for (Rule p : parts) alt.push_back(R(p));
  AddAlt(r, std::move(alt));
  return r;
}

GrammarBuilder::Rule internal::RuleSet::Alt(std::vector<Rule> alternatives) {
  Rule r = NewRule();
  for (Rule a : alternatives) AddAlt(r, {R(a)});
  return r;
}

GrammarBuilder::Rule internal::RuleSet::Repeat(Rule part, int min, int max) {
  if (min < 0) min = 0;
  if (max >= 0 && max < min) return Dead();
  std::vector<Elem> seq(min, R(part));
  if (max < 0) {
    Rule star = NewRule();
    AddAlt(star, {});
    AddAlt(star, {R(part), R(star)});
    seq.push_back(R(star));
  } else if (max > min) {
    // opt_k = "" | part opt_{k-1}: up to max - min more, each level a tail
    // call so matching never deepens the stack.
    Rule prev = -1;
    for (int k = 0; k < max - min; ++k) {
      Rule opt = NewRule();
      AddAlt(opt, {});
      if (prev < 0) {
        AddAlt(opt, {R(part)});
      } else {
        AddAlt(opt, {R(part), R(prev)});
      }
      prev = opt;
    }
    seq.push_back(R(prev));
  }
  Rule r = NewRule();
  AddAlt(r, std::move(seq));
  return r;
}

// ---- JSON pieces ----

// JSON whitespace between tokens is bounded so a small model cannot loop on
// it: nothing, one space, or one newline followed by up to 24 spaces or up
// to 8 tabs (enough for pretty-printed output twelve levels deep at two
// spaces). Never before the top-level value nor after it.
GrammarBuilder::Rule internal::RuleSet::Ws() {
  if (ws >= 0) return ws;
  Rule spaces = Repeat(Lit(" "), 0, 24);
  Rule tabs = Repeat(Lit("\t"), 1, 8);
  Rule nl = Lit("\n");
  ws = Alt({Empty(), Lit(" "), Seq({nl, spaces}), Seq({nl, tabs})});
  return ws;
}

GrammarBuilder::Rule internal::RuleSet::Comma() {
  if (comma < 0) comma = Seq({Ws(), Lit(","), Ws()});
  return comma;
}

// Every UTF-8 sequence of 2 to 4 bytes that encodes a scalar value (no
// overlong forms, no surrogates), as alternatives of `r`.
void internal::RuleSet::AddMultiByteChars(Rule r) {
  using internal::Range;
  const Elem c = S(Range(0x80, 0xbf));
  ByteSet e_mid = Range(0xe1, 0xec);
  internal::AddRange(&e_mid, 0xee, 0xef);
  AddAlt(r, {S(Range(0xc2, 0xdf)), c});
  AddAlt(r, {S(internal::Byte(0xe0)), S(Range(0xa0, 0xbf)), c});
  AddAlt(r, {S(e_mid), c, c});
  AddAlt(r, {S(internal::Byte(0xed)), S(Range(0x80, 0x9f)), c});
  AddAlt(r, {S(internal::Byte(0xf0)), S(Range(0x90, 0xbf)), c, c});
  AddAlt(r, {S(Range(0xf1, 0xf3)), c, c, c});
  AddAlt(r, {S(internal::Byte(0xf4)), S(Range(0x80, 0x8f)), c, c});
}

// One character of a JSON string's contents: printable ASCII other than
// '"' and '\\', a valid multi-byte UTF-8 sequence (no overlongs, no
// surrogates, nothing above U+10FFFF), or an escape. \u escapes name a
// scalar value: a surrogate only as a high-low pair, so every string
// decodes (nlohmann::json and Python refuse lone surrogates).
GrammarBuilder::Rule internal::RuleSet::StrChar() {
  if (str_char >= 0) return str_char;
  using internal::Range;
  ByteSet ascii = Range(0x20, 0x7f);
  ascii[0] &= ~(uint64_t{1} << '"');
  ascii[1] &= ~(uint64_t{1} << ('\\' - 64));
  ByteSet hex = Range('0', '9');
  internal::AddRange(&hex, 'a', 'f');
  internal::AddRange(&hex, 'A', 'F');
  ByteSet simple{};
  for (char c : std::string_view("\"\\/bfnrt")) internal::Add(&simple, static_cast<uint8_t>(c));
  ByteSet non_d = Range('0', '9');
  internal::AddRange(&non_d, 'a', 'c');
  internal::AddRange(&non_d, 'A', 'C');
  internal::AddRange(&non_d, 'e', 'f');
  internal::AddRange(&non_d, 'E', 'F');
  ByteSet d{};
  internal::Add(&d, 'd');
  internal::Add(&d, 'D');
  ByteSet high{};  // second hex digit of a high surrogate D800-DBFF
  for (char c : std::string_view("89abAB")) internal::Add(&high, static_cast<uint8_t>(c));
  ByteSet low{};  // of a low surrogate DC00-DFFF
  for (char c : std::string_view("cdefCDEF")) internal::Add(&low, static_cast<uint8_t>(c));
  Rule r = NewRule();
  str_char = r;
  const Elem bs = Ch('\\'), u = Ch('u'), h = S(hex);
  AddAlt(r, {S(ascii)});
  AddAlt(r, {bs, S(simple)});
  AddAlt(r, {bs, u, S(non_d), h, h, h});
  AddAlt(r, {bs, u, S(d), S(Range('0', '7')), h, h});
  AddAlt(r, {bs, u, S(d), S(high), h, h, bs, u, S(d), S(low), h, h});
  AddMultiByteChars(r);
  return r;
}

GrammarBuilder::Rule internal::RuleSet::JsonString(int min_chars, int max_chars) {
  return Seq({Lit("\""), Repeat(StrChar(), min_chars, max_chars), Lit("\"")});
}

// Digit counts are bounded (16 integer, 16 fraction, 2 exponent digits) so
// that a number cannot go on forever; two exponent digits also keep every
// number finite as a double (a third allows 1e999, which parsers refuse).
GrammarBuilder::Rule internal::RuleSet::JsonInteger() {
  if (integer >= 0) return integer;
  Rule digits = Class(internal::Range('0', '9'));
  Rule nat = Alt({Lit("0"), Seq({Class(internal::Range('1', '9')), Repeat(digits, 0, 15)})});
  integer = Seq({Optional(Lit("-")), nat});
  return integer;
}

GrammarBuilder::Rule internal::RuleSet::JsonNumber() {
  if (number >= 0) return number;
  Rule digits = Class(internal::Range('0', '9'));
  ByteSet e{};
  internal::Add(&e, 'e');
  internal::Add(&e, 'E');
  ByteSet sign{};
  internal::Add(&sign, '+');
  internal::Add(&sign, '-');
  Rule frac = Seq({Lit("."), Repeat(digits, 1, 16)});
  Rule exp = Seq({Class(e), Optional(Class(sign)), Repeat(digits, 1, 2)});
  number = Seq({JsonInteger(), Optional(frac), Optional(exp)});
  return number;
}

// Any JSON value nested at most kMaxJsonDepth containers deep.
constexpr int kMaxJsonDepth = 32;

GrammarBuilder::Rule internal::RuleSet::GenericValue(int depth) {
  if (value_at.empty()) {
    value_at.resize(kMaxJsonDepth + 1);
    object_at.resize(kMaxJsonDepth);
    for (int d = 0; d <= kMaxJsonDepth; ++d) value_at[d] = NewRule();
    Rule str = JsonString(0, -1);
    Rule scalars[] = {str, JsonNumber(), Lit("true"), Lit("false"), Lit("null")};
    for (int d = 0; d <= kMaxJsonDepth; ++d) {
      for (Rule s : scalars) AddAlt(value_at[d], {R(s)});
      if (d == kMaxJsonDepth) break;
      Rule child = value_at[d + 1];
      Rule member = Seq({str, Ws(), Lit(":"), Ws(), child});
      Rule members = Seq({member, Repeat(Seq({Comma(), member}), 0, -1), Ws(), Lit("}")});
      object_at[d] = Seq({Lit("{"), Ws(), Alt({Lit("}"), members})});
      Rule items = Seq({child, Repeat(Seq({Comma(), child}), 0, -1), Ws(), Lit("]")});
      Rule array = Seq({Lit("["), Ws(), Alt({Lit("]"), items})});
      AddAlt(value_at[d], {R(object_at[d])});
      AddAlt(value_at[d], {R(array)});
    }
  }
  return value_at[std::clamp(depth, 0, kMaxJsonDepth)];
}

GrammarBuilder::Rule internal::RuleSet::GenericObject(int depth) {
  GenericValue(0);
  return object_at[std::clamp(depth, 0, kMaxJsonDepth - 1)];
}

// ---- TextUntil ----

namespace {

// UTF-8 decoder states: 0 at a character boundary; 1-3 that many
// continuation bytes still due; 4-7 the restricted second byte after E0, ED,
// F0, F4. Returns the next state or -1.
int Utf8Next(int u, uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xbf;
  switch (u) {
    case 0:
      if (b < 0x80) return 0;
      if (b >= 0xc2 && b <= 0xdf) return 1;
      if (b == 0xe0) return 4;
      if (b == 0xed) return 5;
      if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) return 2;
      if (b == 0xf0) return 6;
      if (b >= 0xf1 && b <= 0xf3) return 3;
      if (b == 0xf4) return 7;
      return -1;
    case 1:
    case 2:
    case 3:
      return cont ? u - 1 : -1;
    case 4:
      return b >= 0xa0 && b <= 0xbf ? 1 : -1;
    case 5:
      return b >= 0x80 && b <= 0x9f ? 1 : -1;
    case 6:
      return b >= 0x90 && b <= 0xbf ? 2 : -1;
    case 7:
      return b >= 0x80 && b <= 0x8f ? 2 : -1;
  }
  return -1;
}

}  // namespace

// A right-linear grammar of the product of a UTF-8 decoder and a KMP matcher
// of `terminator`. A text may end only where appending the terminator
// makes its first occurrence the appended one, so a parser that cuts at the
// first terminator gets the whole text back.
GrammarBuilder::Rule internal::RuleSet::TextUntil(std::string_view term) {
  const int n = static_cast<int>(term.size());
  std::vector<int> fail(n, 0);
  for (int i = 1, k = 0; i < n; ++i) {
    while (k > 0 && term[i] != term[k]) k = fail[k - 1];
    if (term[i] == term[k]) ++k;
    fail[i] = k;
  }
  auto kmp = [&](int j, uint8_t b) {
    while (j > 0 && static_cast<uint8_t>(term[j]) != b) j = fail[j - 1];
    if (static_cast<uint8_t>(term[j]) == b) ++j;
    return j;
  };
  auto may_end = [&](int j) {
    for (int i = 0; i < n; ++i) {
      j = kmp(j, static_cast<uint8_t>(term[i]));
      if (j == n) return i == n - 1;
    }
    return true;
  };
  // State key j * 8 + u; rules made as they are reached.
  std::map<int, Rule> rule_of;
  std::vector<int> todo;
  auto get = [&](int key) {
    auto [it, inserted] = rule_of.try_emplace(key, -1);
    if (inserted) {
      it->second = NewRule();
      todo.push_back(key);
    }
    return it->second;
  };
  Rule start = get(0);
  while (!todo.empty()) {
    const int key = todo.back();
    todo.pop_back();
    const int j = key / 8, u = key % 8;
    const Rule r = rule_of[key];
    if (u == 0 && (n == 0 || may_end(j))) AddAlt(r, {});
    std::map<int, ByteSet> by_target;
    for (int b = 0; b < 256; ++b) {
      const int nu = Utf8Next(u, static_cast<uint8_t>(b));
      if (nu < 0) continue;
      const int nj = n == 0 ? 0 : kmp(j, static_cast<uint8_t>(b));
      if (nj == n) continue;
      internal::Add(&by_target[nj * 8 + nu], static_cast<uint8_t>(b));
    }
    for (const auto& [target, set] : by_target) AddAlt(r, {S(set), R(get(target))});
  }
  return start;
}

// Bounded: characters counted, so the KMP state would multiply by the
// count; excluding the terminator's first byte keeps it one rule per
// character instead, and a text without that byte cannot hold the
// terminator.
GrammarBuilder::Rule internal::RuleSet::TextUntil(std::string_view term, int min_chars,
                                                  int max_chars) {
  if (min_chars <= 0 && max_chars < 0) return TextUntil(term);
  using internal::Range;
  ByteSet ascii = Range(0x00, 0x7f);
  const uint8_t first = term.empty() ? 0 : static_cast<uint8_t>(term[0]);
  if (!term.empty() && first < 0x80) ascii[first >> 6] &= ~(uint64_t{1} << (first & 63));
  Rule ch = NewRule();
  AddAlt(ch, {S(ascii)});
  AddMultiByteChars(ch);
  return Repeat(ch, std::max(min_chars, 0), max_chars);
}

// ---- GrammarBuilder ----

GrammarBuilder::GrammarBuilder() : impl_(std::make_unique<Impl>()) {}
GrammarBuilder::~GrammarBuilder() = default;

GrammarBuilder::Rule GrammarBuilder::Literal(std::string_view bytes) { return impl_->Lit(bytes); }
GrammarBuilder::Rule GrammarBuilder::Seq(std::vector<Rule> parts) {
  return impl_->Seq(std::move(parts));
}
GrammarBuilder::Rule GrammarBuilder::Alt(std::vector<Rule> alternatives) {
  return impl_->Alt(std::move(alternatives));
}
GrammarBuilder::Rule GrammarBuilder::Repeat(Rule part, int min, int max) {
  return impl_->Repeat(part, min, max);
}
GrammarBuilder::Rule GrammarBuilder::TextUntil(std::string_view terminator) {
  return impl_->TextUntil(terminator);
}
GrammarBuilder::Rule GrammarBuilder::TextUntil(std::string_view terminator, int min_chars,
                                               int max_chars) {
  return impl_->TextUntil(terminator, min_chars, max_chars);
}
GrammarBuilder::Rule GrammarBuilder::JsonValue() { return impl_->GenericValue(0); }
GrammarBuilder::Rule GrammarBuilder::JsonObject() { return impl_->GenericObject(0); }

absl::StatusOr<GrammarBuilder::Rule> GrammarBuilder::JsonSchema(const nlohmann::json& schema,
                                                                std::string_view field_path) {
  return impl_->CompileSchema(nlohmann::ordered_json(schema), field_path);
}
absl::StatusOr<GrammarBuilder::Rule> GrammarBuilder::JsonSchema(
    const nlohmann::ordered_json& schema, std::string_view field_path) {
  return impl_->CompileSchema(schema, field_path);
}

namespace {

// Rules with one short alternative are copied into their users: fewer
// frames to push and pop per byte. `chain` stops recursive rules.
void Emit(const internal::RuleSet& b, const std::vector<Elem>& alt, std::vector<int>* chain,
          std::vector<int32_t>* out) {
  for (const Elem& e : alt) {
    if (e.kind == internal::kRef && chain->size() < 8 && b.rules[e.id].size() == 1 &&
        b.rules[e.id][0].size() <= 64 &&
        std::find(chain->begin(), chain->end(), e.id) == chain->end()) {
      chain->push_back(e.id);
      Emit(b, b.rules[e.id][0], chain, out);
      chain->pop_back();
    } else {
      out->push_back(e.id << 2 | e.kind);
    }
  }
}

}  // namespace

std::shared_ptr<const Grammar> GrammarBuilder::Build(Rule start) {
  auto g = std::make_shared<Grammar>();
  g->sets = impl_->sets;
  g->alts.resize(impl_->rules.size());
  std::vector<int> chain;
  for (size_t r = 0; r < impl_->rules.size(); ++r) {
    for (const auto& alt : impl_->rules[r]) {
      g->alts[r].push_back(static_cast<int32_t>(g->elems.size()));
      chain.assign(1, static_cast<int>(r));
      Emit(*impl_, alt, &chain, &g->elems);
      g->elems.push_back(internal::kEnd);
    }
  }
  // The start rule is entered as if referenced from an empty stack.
  std::vector<std::vector<int32_t>> seeds;
  if (start >= 0 && start < static_cast<Rule>(g->alts.size())) {
    for (int32_t a : g->alts[start]) seeds.push_back({a});
  }
  if (!internal::Close(*g, std::move(seeds), &g->initial)) g->initial = {};
  return g;
}

std::shared_ptr<const Grammar> JsonObjectGrammar() {
  static const std::shared_ptr<const Grammar> g = [] {
    GrammarBuilder b;
    return b.Build(b.JsonObject());
  }();
  return g;
}

absl::StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(const nlohmann::json& schema,
                                                                 std::string_view field_path) {
  return JsonSchemaGrammar(nlohmann::ordered_json(schema), field_path);
}

absl::StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(
    const nlohmann::ordered_json& schema, std::string_view field_path) {
  GrammarBuilder b;
  absl::StatusOr<GrammarBuilder::Rule> r = b.JsonSchema(schema, field_path);
  if (!r.ok()) return r.status();
  return b.Build(*r);
}

// ---- Matcher ----

Matcher::Matcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>(State{grammar_->initial})) {}
Matcher::Matcher(const Matcher& o)
    : grammar_(o.grammar_), state_(std::make_unique<State>(*o.state_)) {}
Matcher& Matcher::operator=(const Matcher& o) {
  if (this != &o) {
    grammar_ = o.grammar_;
    state_ = std::make_unique<State>(*o.state_);
  }
  return *this;
}
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;
Matcher::~Matcher() = default;

bool Matcher::CanAdvance(std::string_view bytes) const {
  internal::MatchState cur = state_->s, next;
  for (char c : bytes) {
    if (!internal::Step(*grammar_, cur, static_cast<uint8_t>(c), &next)) return false;
    std::swap(cur, next);
  }
  return true;
}

bool Matcher::Advance(std::string_view bytes) {
  internal::MatchState cur = state_->s, next;
  for (char c : bytes) {
    if (!internal::Step(*grammar_, cur, static_cast<uint8_t>(c), &next)) return false;
    std::swap(cur, next);
  }
  state_->s = std::move(cur);
  return true;
}

bool Matcher::Accepting() const { return state_->s.accepting; }
bool Matcher::Finished() const { return state_->s.accepting && state_->s.stacks.empty(); }

}  // namespace ringlane::router::grammar
