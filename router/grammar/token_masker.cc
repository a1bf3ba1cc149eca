#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "router/grammar/grammar.h"
#include "router/grammar/grammar_internal.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router::grammar {

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::FromTokenizer(
    const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  if (n <= 0) return absl::InvalidArgumentError("tokenizer has an empty vocabulary");
  auto v = std::make_shared<TokenVocabulary>();
  v->mid.resize(n);
  v->first.resize(n);
  v->special.resize(n);
  for (int32_t t = 0; t < n; ++t) {
    v->special[t] = tokenizer.IsSpecial(t);
    if (v->special[t]) continue;
    // Unused ids fail or give nothing; empty bytes are never allowed.
    absl::StatusOr<std::string> mid = tokenizer.TokenBytes(t);
    if (mid.ok()) v->mid[t] = *std::move(mid);
    DecodeState state;
    std::string first;
    if (tokenizer.DecodeToken(t, /*skip_special_tokens=*/true, &state, &first).ok()) {
      v->first[t] = std::move(first);
    }
  }
  return v;
}

namespace {

using internal::MatchState;

// A byte trie of token strings; node 0 is the root. Built node by node,
// then laid out flat (FlatTrie) for the walks.
struct Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;  // sorted by byte
    std::vector<int32_t> tokens;                    // tokens ending here
  };
  std::vector<Node> nodes{1};

  void Insert(std::string_view bytes, int32_t token) {
    int32_t n = 0;
    for (char c : bytes) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto& kids = nodes[n].kids;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1}));
      if (it != kids.end() && it->first == b) {
        n = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(nodes.size());
        kids.insert(it, {b, child});
        nodes.emplace_back();
        n = child;
      }
    }
    nodes[n].tokens.push_back(token);
  }
};

// The trie in depth-first preorder, as parallel arrays: a walk is one
// forward scan that jumps over a refused node's subtree (`end`), so it
// touches memory in order instead of chasing a pointer per node (the
// node-by-node walk spent most of a large mask on cache misses).
struct FlatTrie {
  std::vector<uint8_t> byte;       // the byte leading into node i (unused for 0)
  std::vector<int32_t> depth;      // root 0
  std::vector<int32_t> end;        // one past node i's subtree
  std::vector<int32_t> tok_begin;  // node i's tokens: toks[tok_begin[i], tok_begin[i + 1])
  std::vector<int32_t> toks;
  int32_t max_depth = 0;

  explicit FlatTrie(const Trie& t) {
    // (trie node, byte, depth); children pushed in reverse to pop in order.
    std::vector<std::tuple<int32_t, uint8_t, int32_t>> todo{{0, 0, 0}};
    std::vector<int32_t> open;  // flat indices whose subtree is still being laid out
    while (!todo.empty()) {
      auto [node, b, d] = todo.back();
      todo.pop_back();
      const int32_t i = static_cast<int32_t>(byte.size());
      while (!open.empty() && depth[open.back()] >= d) {
        end[open.back()] = i;
        open.pop_back();
      }
      byte.push_back(b);
      depth.push_back(d);
      end.push_back(-1);
      tok_begin.push_back(static_cast<int32_t>(toks.size()));
      toks.insert(toks.end(), t.nodes[node].tokens.begin(), t.nodes[node].tokens.end());
      max_depth = std::max(max_depth, d);
      open.push_back(i);
      const auto& kids = t.nodes[node].kids;
      for (auto it = kids.rbegin(); it != kids.rend(); ++it)
        todo.emplace_back(it->second, it->first, d + 1);
    }
    for (int32_t i : open) end[i] = static_cast<int32_t>(byte.size());
    tok_begin.push_back(static_cast<int32_t>(toks.size()));
  }
};

// One mask computation: the states met while walking the trie, interned,
// with their byte transitions memoized. Inside a string most bytes lead to
// the same few states, so most trie nodes cost one table lookup.
class Walk {
 public:
  Walk(const Grammar& g, const MatchState& start) : g_(g) { Intern(start); }

  void Run(const FlatTrie& trie, const std::vector<bool>* skip, std::string* mask) {
    // State after the bytes of the path to the node at each depth.
    std::vector<int32_t> sid_at(static_cast<size_t>(trie.max_depth) + 1, 0);
    const int32_t n = static_cast<int32_t>(trie.byte.size());
    for (int32_t i = 1; i < n;) {
      const int32_t parent = sid_at[trie.depth[i] - 1];
      const uint8_t b = trie.byte[i];
      const int32_t sid = internal::Has(next_bytes_[parent], b) ? Next(parent, b) : kDead;
      if (sid < 0) {
        i = trie.end[i];
        continue;
      }
      sid_at[trie.depth[i]] = sid;
      for (int32_t k = trie.tok_begin[i]; k < trie.tok_begin[i + 1]; ++k) {
        const int32_t t = trie.toks[k];
        if (skip != nullptr && (*skip)[t]) continue;
        (*mask)[t >> 3] |= static_cast<char>(1 << (t & 7));
      }
      ++i;
    }
  }

 private:
  static constexpr int32_t kUnknown = -2, kDead = -1;

  int32_t Intern(MatchState s) {
    auto [it, inserted] = ids_.try_emplace(std::move(s), static_cast<int32_t>(states_.size()));
    if (inserted) {
      states_.push_back(&it->first);
      next_bytes_.push_back(internal::NextBytes(g_, it->first));
      trans_.emplace_back();
      trans_.back().fill(kUnknown);
    }
    return it->second;
  }

  int32_t Next(int32_t sid, uint8_t b) {
    int32_t cached = trans_[sid][b];
    if (cached != kUnknown) return cached;
    MatchState out;
    int32_t r = kDead;
    if (internal::Step(g_, *states_[sid], b, &out)) r = Intern(std::move(out));
    trans_[sid][b] = r;
    return r;
  }

  const Grammar& g_;
  // Node map: states_ points at its keys, which must not move on rehash.
  absl::node_hash_map<MatchState, int32_t> ids_;
  std::vector<const MatchState*> states_;
  std::vector<internal::ByteSet> next_bytes_;
  std::vector<std::array<int32_t, 256>> trans_;
};

}  // namespace

struct TokenMasker::Impl {
  std::shared_ptr<const TokenVocabulary> vocab;
  int32_t size = 0;
  std::vector<bool> stop;
  std::vector<bool> special;
  // Tokens whose `first` bytes differ from `mid`: at the start the mid
  // trie skips them and the first trie holds their first bytes.
  std::vector<bool> first_differs;
  std::optional<FlatTrie> mid_trie, first_trie;

  // Masks by (state, at_start). Cleared when full: bounded memory, and
  // the result never depends on what is cached.
  static constexpr size_t kCacheEntries = 256;
  mutable absl::Mutex mu;
  mutable absl::flat_hash_map<std::pair<MatchState, bool>, std::string> cache ABSL_GUARDED_BY(mu);

  const std::string& Bytes(int32_t t, bool at_start) const {
    return at_start && t < static_cast<int32_t>(vocab->first.size()) ? vocab->first[t]
                                                                     : vocab->mid[t];
  }
};

TokenMasker::TokenMasker(std::shared_ptr<const TokenVocabulary> vocab,
                         std::vector<int32_t> stop_ids)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.vocab = std::move(vocab);
  m.size = static_cast<int32_t>(m.vocab->mid.size());
  m.stop.assign(m.size, false);
  for (int32_t s : stop_ids) {
    if (s >= 0 && s < m.size) m.stop[s] = true;
  }
  m.special.assign(m.size, false);
  m.first_differs.assign(m.size, false);
  Trie mid, first;
  for (int32_t t = 0; t < m.size; ++t) {
    m.special[t] = t < static_cast<int32_t>(m.vocab->special.size()) && m.vocab->special[t];
    if (m.stop[t] || m.special[t]) continue;
    const std::string& mid_bytes = m.vocab->mid[t];
    const std::string& first_bytes = m.Bytes(t, /*at_start=*/true);
    if (!mid_bytes.empty()) mid.Insert(mid_bytes, t);
    if (first_bytes != mid_bytes) {
      m.first_differs[t] = true;
      if (!first_bytes.empty()) first.Insert(first_bytes, t);
    }
  }
  m.mid_trie.emplace(mid);
  m.first_trie.emplace(first);
}

TokenMasker::~TokenMasker() = default;

int32_t TokenMasker::vocab_size() const { return impl_->size; }

std::string TokenMasker::Mask(const Matcher& m, bool at_start) const {
  const MatchState& s = m.state_->s;
  auto key = std::make_pair(s, at_start);
  {
    absl::MutexLock lock(&impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  std::string mask((impl_->size + 7) / 8, '\0');
  Walk walk(*m.grammar_, s);
  walk.Run(*impl_->mid_trie, at_start ? &impl_->first_differs : nullptr, &mask);
  if (at_start) walk.Run(*impl_->first_trie, nullptr, &mask);
  if (s.accepting) {
    for (int32_t t = 0; t < impl_->size; ++t) {
      if (impl_->stop[t]) mask[t >> 3] |= static_cast<char>(1 << (t & 7));
    }
  }
  absl::MutexLock lock(&impl_->mu);
  if (impl_->cache.size() >= Impl::kCacheEntries) impl_->cache.clear();
  impl_->cache.emplace(std::move(key), mask);
  return mask;
}

bool TokenMasker::Allows(const Matcher& m, bool at_start, int32_t token) const {
  if (token < 0 || token >= impl_->size) return false;
  if (impl_->stop[token]) return m.Accepting();
  if (impl_->special[token]) return false;
  const std::string& bytes = impl_->Bytes(token, at_start);
  return !bytes.empty() && m.CanAdvance(bytes);
}

bool TokenMasker::Advance(Matcher* m, bool at_start, int32_t token) const {
  if (token < 0 || token >= impl_->size) return false;
  if (impl_->stop[token]) return m->Accepting();
  if (impl_->special[token]) return false;
  const std::string& bytes = impl_->Bytes(token, at_start);
  return !bytes.empty() && m->Advance(bytes);
}

}  // namespace ringlane::router::grammar
