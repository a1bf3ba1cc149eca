#ifndef RINGLANE_ROUTER_TOKENIZER_BPE_H_
#define RINGLANE_ROUTER_TOKENIZER_BPE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

namespace ringlane::router {

// Says whether adjacent ids (left, right) merge, and if so into which id and
// with which priority (lower merges first).
using PairMergeFn =
    std::function<bool(int32_t left, int32_t right, double* priority, int32_t* merged)>;

// The merge loop every BPE tokenizer here shares: repeatedly merges the
// adjacent pair with the lowest priority, the leftmost on ties, until no pair
// merges. O(n log n): each adjacent pair's merge sits in a heap, and entries
// whose symbols changed since they were queued are skipped. llama2.c's run.c
// rescans every pair after each merge (quadratic) but picks the same pair.
std::vector<int32_t> MergeAdjacentPairs(const std::vector<int32_t>& ids, const PairMergeFn& find);

// A table of pair merges, (left id, right id) -> merged id with a priority,
// and the merge loop that BPE tokenizers share: repeatedly merge the adjacent
// pair with the lowest priority, the leftmost on ties, until none applies.
// Hugging Face BPE uses the merge's rank as priority; SentencePiece BPE the
// merged piece's negated score.
//
// Filled once while loading, then immutable; Apply is const and safe from any
// number of threads.
class BpeMerges {
 public:
  // Registers a merge; a later Add for the same pair replaces the earlier
  // one, as the Hugging Face loaders do for duplicated merge lines.
  void Add(int32_t left, int32_t right, double priority, int32_t merged);

  // Merges `symbols` (token ids; negative ids never merge) and returns the
  // result. O(n log n) in the number of symbols.
  std::vector<int32_t> Apply(const std::vector<int32_t>& symbols) const;

  size_t size() const { return merges_.size(); }

 private:
  struct Merge {
    double priority;
    int32_t merged;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* Find(int32_t left, int32_t right) const;

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_BPE_H_
