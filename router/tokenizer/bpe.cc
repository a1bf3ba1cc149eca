#include "router/tokenizer/bpe.h"

#include <limits>
#include <queue>

namespace ringlane::router {
namespace {

// Symbols form a doubly linked list over their initial positions, so merging
// is O(1) and list order equals position order.
struct Symbol {
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  int32_t id;
  size_t prev;
  size_t next;
  // Bumped whenever the symbol changes or is absorbed; queued candidates that
  // recorded an older version are stale.
  uint32_t version;
};

struct Candidate {
  double priority;
  size_t left;
  size_t right;
  uint32_t left_version;
  uint32_t right_version;
  int32_t merged;
};

// Max-heap comparator that pops the lowest priority first and, on ties, the
// smallest left position, i.e. the leftmost pair.
struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.left > b.left;
  }
};

}  // namespace

void BpeMerges::Add(int32_t left, int32_t right, double priority, int32_t merged) {
  merges_[Key(left, right)] = Merge{priority, merged};
}

const BpeMerges::Merge* BpeMerges::Find(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  const auto it = merges_.find(Key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> MergeAdjacentPairs(const std::vector<int32_t>& ids, const PairMergeFn& find) {
  const size_t n = ids.size();
  if (n < 2) return ids;
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i) {
    symbols[i] =
        Symbol{ids[i], i == 0 ? Symbol::kNone : i - 1, i + 1 == n ? Symbol::kNone : i + 1, 0};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue;
  const auto consider = [&](size_t left) {
    const size_t right = symbols[left].next;
    double priority = 0;
    int32_t merged = -1;
    if (!find(symbols[left].id, symbols[right].id, &priority, &merged)) return;
    queue.push(
        Candidate{priority, left, right, symbols[left].version, symbols[right].version, merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate best = queue.top();
    queue.pop();
    Symbol& left = symbols[best.left];
    Symbol& right = symbols[best.right];
    if (left.version != best.left_version || right.version != best.right_version ||
        left.next != best.right) {
      continue;
    }
    left.id = best.merged;
    ++left.version;
    ++right.version;
    left.next = right.next;
    if (right.next != Symbol::kNone) symbols[right.next].prev = best.left;
    if (left.prev != Symbol::kNone) consider(left.prev);
    if (left.next != Symbol::kNone) consider(best.left);
  }
  // Only right-hand symbols are absorbed, so position 0 still heads the list.
  std::vector<int32_t> merged;
  for (size_t i = 0; i != Symbol::kNone; i = symbols[i].next) merged.push_back(symbols[i].id);
  return merged;
}

std::vector<int32_t> BpeMerges::Apply(const std::vector<int32_t>& ids) const {
  if (merges_.empty()) return ids;
  return MergeAdjacentPairs(ids, [this](int32_t l, int32_t r, double* priority, int32_t* merged) {
    const Merge* m = Find(l, r);
    if (m == nullptr) return false;
    *priority = m->priority;
    *merged = m->merged;
    return true;
  });
}

}  // namespace ringlane::router
