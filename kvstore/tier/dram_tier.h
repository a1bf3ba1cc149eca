// The DRAM tier: whole blocks in memory under a byte budget, evicted least
// recently used first. A hit (Get) refreshes an entry's recency; Contains
// does not. Eviction does not drop data itself: Insert hands the entries it
// pushed out back to the caller (oldest first), who demotes them to disk.
//
// The budget counts each entry's payload plus its key and a fixed overhead
// (kEntryOverheadBytes), so that many tiny blocks cannot grow the index past
// it. Payloads are shared: an entry evicted while a Get streams it stays
// alive until that Get is done.
//
// Thread-safe: every method takes mu_; none calls out while holding it.
#ifndef RINGLANE_KVSTORE_TIER_DRAM_TIER_H_
#define RINGLANE_KVSTORE_TIER_DRAM_TIER_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/tier/block.h"

namespace ringlane::kvstore {

class DramTier {
 public:
  // Per-entry bookkeeping charged against the budget besides payload and key
  // (the map slot, the list node, the shared_ptr control block).
  static constexpr int64_t kEntryOverheadBytes = 128;

  struct Stats {
    int64_t entries = 0;
    int64_t bytes = 0;  // payload bytes
    int64_t capacity_bytes = 0;
    int64_t evictions = 0;  // entries pushed out by Insert
  };

  using Evicted = std::vector<std::pair<std::string, Block>>;

  explicit DramTier(int64_t capacity_bytes);
  DramTier(const DramTier&) = delete;
  DramTier& operator=(const DramTier&) = delete;

  // Stores `block` under `key` as the most recent entry, evicting least
  // recently used entries into *evicted until it fits. A key already stored
  // keeps its bytes (equal keys mean equal bytes) and is only refreshed.
  // Returns false, storing nothing and evicting nothing, when the entry
  // alone exceeds the budget; true otherwise. *new_entry says whether the
  // key was not stored before.
  bool Insert(const std::string& key, Block block, Evicted* evicted, bool* new_entry = nullptr);

  // The entry, refreshed to most recent; nullopt when not stored.
  std::optional<Block> Get(const std::string& key);
  // Whether `key` is stored; recency unchanged.
  bool Contains(const std::string& key) const;
  // Refreshes `key` if stored; false when not.
  bool Touch(const std::string& key);

  // Removes every entry whose key starts with `prefix`; returns how many.
  int64_t EraseWithPrefix(std::string_view prefix);
  // Removes and returns every entry, oldest first (the shutdown flush).
  Evicted TakeAll();

  Stats stats() const;
  // Keys from least to most recently used.
  std::vector<std::string> KeysLruOrderForTesting() const;

 private:
  struct Entry {
    Block block;
    std::list<std::string>::iterator lru;  // position in lru_
  };

  static int64_t Charge(const std::string& key, const Block& b) {
    return b.bytes() + static_cast<int64_t>(key.size()) + kEntryOverheadBytes;
  }
  void EraseLocked(absl::flat_hash_map<std::string, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // front: least recently used
  int64_t charged_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // what the budget counts
  int64_t payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_TIER_DRAM_TIER_H_
