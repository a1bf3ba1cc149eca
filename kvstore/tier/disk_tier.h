// The disk tier: whole blocks in a RocksDB database in one directory, under
// a byte budget and an entry cap, evicted least recently used first. It
// survives restarts: the directory is reopened and its entries and their
// recency order are read back.
//
// Why RocksDB (see README, "The kvstore"): an entry must appear whole or not
// at all, across a crash of the daemon mid-write; RocksDB's write-ahead log
// gives that per write batch (point-in-time recovery drops a torn tail), its
// blob files keep large values out of the LSM tree (no rewrite of KV blocks
// on every compaction), and it checks its own CRCs on every read. A home-made
// file format would have to rebuild all of that.
//
// Layout: column family "meta" maps an encoded key to 24 bytes (payload
// size, XXH64, access tick); column family "blocks" maps it to the payload
// (blob files for values of kMinBlobBytes and up). Both are written and
// deleted in one WriteBatch, so they always agree. Only "meta" is read at
// start-up, which rebuilds the in-memory index: key -> (size, checksum,
// position in the LRU list). The index is bounded by max_entries.
//
// Every read checks the payload's size and XXH64 against "meta" (and RocksDB
// checks its blob and block CRCs): a mismatch or a RocksDB corruption error
// drops the entry, is counted and logged, and reads as DataLoss, never as a
// block.
//
// Thread-safe. mu_ guards the index and serializes writes (a write's batch
// and its index update happen together); reads of payloads run outside it.
#ifndef RINGLANE_KVSTORE_TIER_DISK_TIER_H_
#define RINGLANE_KVSTORE_TIER_DISK_TIER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/tier/block.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace ringlane::kvstore {

class DiskTier {
 public:
  // Values of at least this many bytes go to blob files.
  static constexpr int64_t kMinBlobBytes = 4096;

  struct Options {
    std::string dir;             // created when missing
    int64_t capacity_bytes = 0;  // payload bytes kept (RocksDB's own files come on top)
    int64_t max_entries = 1 << 20;
    // fsync the WAL on every write: survives a power loss, not only a
    // crash of the daemon, at the cost of a sync per block.
    bool sync_writes = false;
  };

  struct Stats {
    int64_t entries = 0;
    int64_t bytes = 0;  // payload bytes
    int64_t capacity_bytes = 0;
    int64_t evictions = 0;          // entries dropped to make room
    int64_t checksum_failures = 0;  // reads that failed verification
  };

  // Opens (or creates) the database in options.dir and rebuilds the index;
  // entries beyond the budget (it may have shrunk) are evicted oldest first.
  // InvalidArgument for bad options; Internal, with RocksDB's reason, when
  // the directory cannot be used (not writable, held by another kvstore,
  // damaged beyond recovery).
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const Options& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Stores the entry as the most recent, evicting LRU entries in the same
  // batch until it fits. A key already stored is only refreshed
  // (*new_entry false). FailedPrecondition when the entry alone is over the
  // budget; Internal when RocksDB fails the write (nothing changes).
  absl::Status Put(const std::string& key, const Block& block, bool* new_entry = nullptr);

  // The entry, verified and refreshed. NotFound when not stored; DataLoss
  // when its bytes failed verification (the entry is dropped); Internal on
  // another RocksDB error.
  absl::StatusOr<Block> Get(const std::string& key);
  bool Contains(const std::string& key) const;
  bool Touch(const std::string& key);

  // Removes every entry whose key starts with `prefix`; returns how many.
  absl::StatusOr<int64_t> EraseWithPrefix(std::string_view prefix);

  Stats stats() const;
  std::vector<std::string> KeysLruOrderForTesting() const;
  // Moves the memtables into SST and blob files, so a test can find the
  // bytes on disk.
  absl::Status FlushForTesting();
  // Stores `payload` with a claimed checksum that need not match it: a
  // stored value RocksDB itself considers intact but ours does not.
  absl::Status PutUncheckedForTesting(const std::string& key, const std::string& payload,
                                      uint64_t claimed_xxh64);

 private:
  struct Entry {
    int64_t bytes = 0;
    uint64_t xxh64 = 0;
    uint64_t tick = 0;                     // access order, persisted in "meta"
    std::list<std::string>::iterator lru;  // position in lru_
  };
  using Index = absl::flat_hash_map<std::string, Entry>;

  explicit DiskTier(const Options& options);
  absl::Status Load();
  absl::Status WriteLocked(const std::string& key, const std::string& payload, uint64_t xxh64,
                           bool* new_entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `key` after a failed verification (if it is still the entry that
  // was read: same tick).
  void DropCorrupt(const std::string& key, uint64_t tick, std::string_view why);
  void RefreshLocked(Index::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIndexLocked(Index::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  rocksdb::DB* db_ = nullptr;                    // owned; closed in the destructor
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;  // owned by db_'s handles_
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;

  mutable absl::Mutex mu_;
  Index index_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // front: least recently used
  uint64_t next_tick_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checksum_failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_TIER_DISK_TIER_H_
