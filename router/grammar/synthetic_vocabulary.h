// A synthetic vocabulary for measuring masks at realistic sizes (the
// grammar tests and ringlane-grammar-bench): every printable ASCII byte,
// then random pieces of 1-8 characters, a tenth of them multi-byte UTF-8.
#ifndef RINGLANE_ROUTER_GRAMMAR_SYNTHETIC_VOCABULARY_H_
#define RINGLANE_ROUTER_GRAMMAR_SYNTHETIC_VOCABULARY_H_

#include <memory>
#include <random>
#include <string>

#include "router/grammar/grammar.h"

namespace ringlane::router::grammar {

inline std::shared_ptr<const TokenVocabulary> SyntheticVocabulary(int size, unsigned seed = 7) {
  std::mt19937 rng(seed);
  auto v = std::make_shared<TokenVocabulary>();
  const char* pieces[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xe4\xb8\xad"};
  // The single bytes first, so no walk is stuck for want of a token.
  for (char c = 0x20; c < 0x7f; ++c) v->mid.push_back(std::string(1, c));
  while (static_cast<int>(v->mid.size()) < size) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < len; ++i) {
      if (rng() % 10 == 0) {
        s += pieces[rng() % 4];
      } else {
        s.push_back(static_cast<char>(0x20 + rng() % 95));
      }
    }
    v->mid.push_back(s);
  }
  v->first = v->mid;
  v->special.assign(v->mid.size(), false);
  return v;
}

}  // namespace ringlane::router::grammar

#endif  // RINGLANE_ROUTER_GRAMMAR_SYNTHETIC_VOCABULARY_H_
