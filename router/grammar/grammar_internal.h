// The compiled grammar, the matcher's state and the builder's rule tables,
// shared by grammar.cc, json_schema.cc and token_masker.cc. Not part of the
// interface: nothing outside router/grammar/ includes this.
#ifndef RINGLANE_ROUTER_GRAMMAR_GRAMMAR_INTERNAL_H_
#define RINGLANE_ROUTER_GRAMMAR_GRAMMAR_INTERNAL_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/grammar/grammar.h"

namespace ringlane::router::grammar {

namespace internal {

using ByteSet = std::array<uint64_t, 4>;

inline bool Has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void Add(ByteSet* s, uint8_t b) { (*s)[b >> 6] |= uint64_t{1} << (b & 63); }
inline void AddRange(ByteSet* s, int lo, int hi) {
  for (int b = lo; b <= hi; ++b) Add(s, static_cast<uint8_t>(b));
}
inline ByteSet Range(int lo, int hi) {
  ByteSet s{};
  AddRange(&s, lo, hi);
  return s;
}
inline ByteSet Byte(uint8_t b) {
  ByteSet s{};
  Add(&s, b);
  return s;
}

// A compiled element is kind | id << 2: a byte set (id into Grammar::sets),
// a rule reference (id = rule), or the end of an alternative.
enum ElemKind : int32_t { kEnd = 0, kSet = 1, kRef = 2 };

// A set of pushdown stacks, canonical so that equal states compare and hash
// equal (the mask cache and the masker's transition memo rely on it).
// `stacks` holds each stack as [length, bottom position, ..., top
// position], the stacks sorted lexicographically and without duplicates;
// every top position is a byte-set element. `accepting`: some path has
// consumed the whole start rule.
struct MatchState {
  std::vector<int32_t> stacks;
  bool accepting = false;

  friend bool operator==(const MatchState& a, const MatchState& b) {
    return a.accepting == b.accepting && a.stacks == b.stacks;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MatchState& s) {
    return H::combine(std::move(h), s.stacks, s.accepting);
  }
};

// The bytes some stack of `s` accepts next (the union of the top sets).
ByteSet NextBytes(const Grammar& g, const MatchState& s);
// `out` = `in` after byte `b`; false when no stack of `in` takes `b` (or the
// stack cap is hit, which refuses the byte rather than grow without bound).
bool Step(const Grammar& g, const MatchState& in, uint8_t b, MatchState* out);

// A rule element while building: a byte set or a reference.
struct Elem {
  ElemKind kind;
  int32_t id;
};

}  // namespace internal

// Immutable after GrammarBuilder::Build.
class Grammar {
 public:
  // Alternatives laid end to end, each closed by a kEnd element; a stack
  // position is an index into `elems`.
  std::vector<int32_t> elems;
  // Per rule, the position of each alternative's first element.
  std::vector<std::vector<int32_t>> alts;
  std::vector<internal::ByteSet> sets;
  internal::MatchState initial;
};

struct Matcher::State {
  internal::MatchState s;
};

namespace internal {

// The builder's rule tables and constructors (GrammarBuilder::Impl is one).
struct RuleSet {
  using Rule = GrammarBuilder::Rule;
  using Elem = internal::Elem;

  std::vector<std::vector<std::vector<Elem>>> rules;
  std::vector<internal::ByteSet> sets;
  absl::flat_hash_map<internal::ByteSet, int32_t> set_ids;

  // Lazily made shared pieces (-1 until first use).
  Rule ws = -1;
  Rule comma = -1;
  Rule str_char = -1;
  Rule number = -1;
  Rule integer = -1;
  Rule empty = -1;
  // Generic JSON: value_at[d] is any value nested inside d containers.
  std::vector<Rule> value_at;
  std::vector<Rule> object_at;

  Rule NewRule() {
    rules.emplace_back();
    return static_cast<Rule>(rules.size() - 1);
  }
  void AddAlt(Rule r, std::vector<Elem> alt) { rules[r].push_back(std::move(alt)); }
  Elem S(const internal::ByteSet& s) {
    auto [it, inserted] = set_ids.try_emplace(s, static_cast<int32_t>(sets.size()));
    if (inserted) sets.push_back(s);
    return Elem{internal::kSet, it->second};
  }
  Elem Ch(char c) { return S(internal::Byte(static_cast<uint8_t>(c))); }
  static Elem R(Rule r) { return Elem{internal::kRef, r}; }

  Rule Lit(std::string_view bytes);
  Rule Class(const internal::ByteSet& s);
  Rule Seq(std::vector<Rule> parts);
  Rule Alt(std::vector<Rule> alternatives);
  Rule Repeat(Rule part, int min, int max);
  Rule Empty();
  Rule Optional(Rule r) { return Alt({r, Empty()}); }
  Rule Dead() { return NewRule(); }

  Rule Ws();
  Rule Comma();
  void AddMultiByteChars(Rule r);
  Rule StrChar();
  Rule JsonString(int min_chars, int max_chars);
  Rule JsonNumber();
  Rule JsonInteger();
  Rule GenericValue(int depth);
  Rule GenericObject(int depth);
  Rule TextUntil(std::string_view terminator);
  Rule TextUntil(std::string_view terminator, int min_chars, int max_chars);

  absl::StatusOr<Rule> CompileSchema(const nlohmann::ordered_json& schema,
                                     std::string_view field_path);
};

}  // namespace internal

struct GrammarBuilder::Impl : internal::RuleSet {};

}  // namespace ringlane::router::grammar

#endif  // RINGLANE_ROUTER_GRAMMAR_GRAMMAR_INTERNAL_H_
