// A suffix trie of token sequences cut at a fixed depth, with occurrence
// counts: the index behind suffix decoding (SuffixDecoding, Oliaro et al.
// 2024). Every start position s of an indexed sequence contributes the path
// seq[s .. s + max_depth); a node's count is how many such paths pass
// through it, so the most frequent child of the node reached by a context's
// suffix is the continuation seen most often after that context.
//
// A cut trie instead of a full suffix tree: drafting only ever needs a
// pattern of a few tokens and a continuation of a few more, so depth is
// bounded by (pattern + continuation), memory is at most max_depth nodes per
// indexed token, and removing a sequence (the global cache's eviction, the
// per-request window sliding) is the same walk as adding it.
//
// Not thread-safe.
#ifndef RINGLANE_ROUTER_SPEC_SUFFIX_TRIE_H_
#define RINGLANE_ROUTER_SPEC_SUFFIX_TRIE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace ringlane::router {

class SuffixTrie {
 public:
  explicit SuffixTrie(int max_depth);

  int max_depth() const { return max_depth_; }
  // Nodes in use, the root excluded (for memory bounds and tests).
  int64_t nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()) - 1; }

  // Indexes every suffix of `tokens` (each cut at max_depth); Remove undoes
  // an Add of the same tokens exactly.
  void Add(absl::Span<const int32_t> tokens);
  void Remove(absl::Span<const int32_t> tokens);

  // One sequence indexed as it grows: Append(t) adds t to the paths of the
  // last max_depth - 1 starts and starts a new one, so after appending
  // t_0..t_n the trie holds what Add(t_0..t_n) would. DropFront removes the
  // paths of the oldest start (a sliding window over the sequence): `tokens`
  // are the sequence's tokens from that start on.
  void Append(int32_t token);
  void DropFront(absl::Span<const int32_t> tokens);

  struct Match {
    int length = 0;    // tokens of the context's suffix found (0 = none)
    int32_t node = 0;  // the node that suffix ends at
  };
  // The longest suffix of `context`, at most `max_pattern` tokens and less
  // than max_depth, that is a path from the root and has a continuation.
  Match LongestMatch(absl::Span<const int32_t> context, int max_pattern) const;
  // Up to `max_tokens` tokens after `m`, each the most frequent child of the
  // last (ties: the smaller token id, so drafts are deterministic), stopping
  // at a child seen on less than `min_fraction` of its parent's paths.
  std::vector<int32_t> Continue(Match m, int max_tokens, double min_fraction = 0) const;

 private:
  struct Node {
    int32_t token = -1;
    int32_t depth = 0;
    int32_t count = 0;
    std::vector<int32_t> children;
  };
  static uint64_t Key(int32_t node, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
           static_cast<uint32_t>(token);
  }
  int32_t Child(int32_t node, int32_t token) const;
  // The child for `token`, created when missing; its count goes up by one.
  int32_t Increment(int32_t node, int32_t token);
  // Lowers the count of `node`'s child for `token`, freeing it at zero
  // (children of a freed node have count zero too and were freed first).
  int32_t Decrement(int32_t node, int32_t token);
  void Walk(absl::Span<const int32_t> path, bool add);

  const int max_depth_;
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<int32_t> free_;
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  // Append: the nodes of the open paths, shallowest last.
  std::vector<int32_t> open_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SPEC_SUFFIX_TRIE_H_
