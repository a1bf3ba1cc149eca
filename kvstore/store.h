// The kvstore's two tiers behind one interface: DRAM in front, the disk tier
// (optional) behind it. Put verifies a block's checksum and stores it in
// DRAM (and on disk too with write_through); what DRAM evicts is demoted to
// disk; a disk hit is copied back into DRAM (the disk copy stays, so a
// later demotion of it only refreshes it). Keys are encoded BlockKeys
// (block_key.h); the caller validates them.
//
// Thread-safe: called from every gRPC handler thread at once. The tiers have
// a mutex each and the store none; no path holds both tiers' mutexes (a
// demotion runs after DramTier::Insert returned), so there is no lock order
// to keep. Demotions run on the thread of the Put or Get that caused them,
// which is what slows a client that writes faster than the disk takes.
#ifndef RINGLANE_KVSTORE_STORE_H_
#define RINGLANE_KVSTORE_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/tier/block.h"
#include "kvstore/tier/disk_tier.h"
#include "kvstore/tier/dram_tier.h"
#include "ringlane/v1/kvstore.pb.h"

namespace ringlane::kvstore {

struct StoreOptions {
  int64_t dram_bytes = 1LL << 30;
  // Empty: no disk tier (DRAM evictions are dropped).
  std::string disk_dir;
  int64_t disk_bytes = 16LL << 30;
  int64_t disk_max_entries = 1 << 20;
  bool disk_sync_writes = false;
  // Every new block goes to disk at once as well, so a kill -9 loses
  // nothing that was acknowledged (DRAM still serves the hits).
  bool write_through = false;
};

class Store {
 public:
  // Opens the disk tier when options.disk_dir is set; its errors as
  // DiskTier::Open's.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);

  // Stores a block after checking XXH64(*payload) == xxh64: DataLoss (and a
  // count in checksum_failures_put) when not. *already_stored says whether
  // the key was stored before (then only its recency changes).
  // ResourceExhausted when no tier can hold a block this large.
  absl::Status Put(const std::string& key, std::shared_ptr<const std::string> payload,
                   uint64_t xxh64, bool* already_stored = nullptr);

  // The block, from DRAM or disk (refreshing it); NotFound, counted as a
  // miss, when no tier has it (a disk block that fails verification
  // included: it is dropped).
  absl::StatusOr<Block> Get(const std::string& key);
  bool Contains(const std::string& key) const;

  // Drops every entry of `model_id` in both tiers.
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(std::string_view model_id);

  // Writes every DRAM entry to disk (oldest first), for a graceful stop; a
  // no-op without a disk tier.
  void FlushDramToDisk();

  // Counts payload bytes a Get sent.
  void CountBytesOut(int64_t n) { bytes_out_.fetch_add(n, std::memory_order_relaxed); }

  v1::StatsResponse Stats() const;
  DiskTier* disk_for_testing() { return disk_.get(); }
  DramTier* dram_for_testing() { return &dram_; }

 private:
  explicit Store(const StoreOptions& options);
  // Hands DRAM's evicted entries to disk.
  void Demote(DramTier::Evicted evicted);

  const StoreOptions options_;
  DramTier dram_;
  std::unique_ptr<DiskTier> disk_;  // null without a disk tier

  // Counters since start (relaxed: each is read alone, for Stats).
  std::atomic<int64_t> hits_dram_{0};
  std::atomic<int64_t> hits_disk_{0};
  std::atomic<int64_t> misses_{0};
  std::atomic<int64_t> checksum_failures_put_{0};
  std::atomic<int64_t> demotions_{0};
  std::atomic<int64_t> bytes_in_{0};
  std::atomic<int64_t> bytes_out_{0};
  std::atomic<int64_t> blocks_stored_{0};
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_STORE_H_
