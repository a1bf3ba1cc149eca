#include "kvstore/tier/disk_tier.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kvstore/block_key.h"
#include "services/log.h"

namespace ringlane::kvstore {

namespace {

constexpr char kBlocksFamily[] = "blocks";
constexpr size_t kMetaBytes = 24;

void PutLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string EncodeMeta(int64_t bytes, uint64_t xxh64, uint64_t tick) {
  std::string m(kMetaBytes, '\0');
  PutLe64(m.data(), static_cast<uint64_t>(bytes));
  PutLe64(m.data() + 8, xxh64);
  PutLe64(m.data() + 16, tick);
  return m;
}

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(std::string(what), ": ", s.ToString()));
}

rocksdb::ColumnFamilyOptions BlocksFamilyOptions() {
  rocksdb::ColumnFamilyOptions o;
  // KV blocks are hundreds of KiB to MiB: as blob files they are written
  // once and never rewritten by compaction, which only moves the small
  // index records. Garbage collection rewrites blob files whose entries
  // were mostly evicted, so deleted payloads give their space back.
  o.enable_blob_files = true;
  o.min_blob_size = DiskTier::kMinBlobBytes;
  o.blob_compression_type = rocksdb::kNoCompression;
  o.enable_blob_garbage_collection = true;
  o.blob_garbage_collection_age_cutoff = 0.5;
  // Quantized or float KV data does not compress; spare the CPU.
  o.compression = rocksdb::kNoCompression;
  // The memtable holds whole values until a flush: 32 MiB x 2 bounds it.
  o.write_buffer_size = 32 << 20;
  o.max_write_buffer_number = 2;
  return o;
}

}  // namespace

DiskTier::DiskTier(const Options& options) : options_(options) {}

DiskTier::~DiskTier() {
  if (db_ == nullptr) return;
  for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
  db_->Close();
  delete db_;
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const Options& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("disk tier: empty directory");
  if (options.capacity_bytes < 1 || options.max_entries < 1) {
    return absl::InvalidArgumentError("disk tier: capacity and max entries must be positive");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("disk tier: cannot create ", options.dir, ": ", ec.message()));
  }
  if (!std::filesystem::is_directory(options.dir, ec)) {
    return absl::InternalError(absl::StrCat("disk tier: ", options.dir, " is not a directory"));
  }
  std::unique_ptr<DiskTier> t(new DiskTier(options));
  rocksdb::DBOptions db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  // Bounded resources: descriptors, background threads, RocksDB's own logs.
  db.max_open_files = 256;
  db.max_background_jobs = 2;
  db.keep_log_file_num = 2;
  db.info_log_level = rocksdb::WARN_LEVEL;
  // The default, said out loud: after a crash, recover up to the last intact
  // WAL record, so a torn batch (a block half-written) is gone, not half there.
  db.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kBlocksFamily, BlocksFamilyOptions()}};
  rocksdb::Status s = rocksdb::DB::Open(db, options.dir, families, &t->handles_, &t->db_);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("disk tier: cannot open ", options.dir, ": ",
                                            s.ToString(),
                                            s.IsIOError() ? " (in use by another kvstore?)" : ""));
  }
  t->meta_ = t->handles_[0];
  t->blocks_ = t->handles_[1];
  if (absl::Status st = t->Load(); !st.ok()) return st;
  return t;
}

absl::Status DiskTier::Load() {
  struct Found {
    uint64_t tick;
    std::string key;
    int64_t bytes;
    uint64_t xxh64;
  };
  std::vector<Found> found;
  rocksdb::WriteBatch bad;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice v = it->value();
    if (v.size() != kMetaBytes) {
      // Not ours (or damaged): drop both halves rather than guess.
      bad.Delete(meta_, it->key());
      bad.Delete(blocks_, it->key());
      continue;
    }
    found.push_back({GetLe64(v.data() + 16), it->key().ToString(),
                     static_cast<int64_t>(GetLe64(v.data())), GetLe64(v.data() + 8)});
  }
  if (!it->status().ok()) return FromRocks(it->status(), "disk tier: reading the index");
  it.reset();
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.tick < b.tick; });
  absl::MutexLock lock(&mu_);
  for (auto& f : found) {
    lru_.push_back(f.key);
    bytes_ += f.bytes;
    next_tick_ = std::max(next_tick_, f.tick + 1);
    index_.emplace(std::move(f.key), Entry{f.bytes, f.xxh64, f.tick, std::prev(lru_.end())});
  }
  // A restart with a smaller budget keeps the most recent entries.
  int64_t dropped = 0;
  while (!lru_.empty() && (bytes_ > options_.capacity_bytes ||
                           static_cast<int64_t>(index_.size()) > options_.max_entries)) {
    auto victim = index_.find(lru_.front());
    bad.Delete(meta_, victim->first);
    bad.Delete(blocks_, victim->first);
    EraseIndexLocked(victim);
    ++dropped;
  }
  if (bad.Count() > 0) {
    if (absl::Status st = FromRocks(db_->Write(rocksdb::WriteOptions(), &bad), "disk tier: trim");
        !st.ok()) {
      return st;
    }
  }
  RL_LOG(INFO) << "disk tier " << options_.dir << ": " << index_.size() << " entries, " << bytes_
               << " bytes" << (dropped ? absl::StrCat(" (", dropped, " dropped over budget)") : "");
  return absl::OkStatus();
}

void DiskTier::EraseIndexLocked(Index::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void DiskTier::RefreshLocked(Index::iterator it) {
  it->second.tick = next_tick_++;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  // Recency survives a restart only approximately (this write is not
  // synced); losing it only reorders eviction.
  rocksdb::WriteOptions wo;
  (void)db_->Put(wo, meta_, it->first,
                 EncodeMeta(it->second.bytes, it->second.xxh64, it->second.tick));
}

absl::Status DiskTier::WriteLocked(const std::string& key, const std::string& payload,
                                   uint64_t xxh64, bool* new_entry) {
  if (new_entry != nullptr) *new_entry = false;
  if (auto it = index_.find(key); it != index_.end()) {
    RefreshLocked(it);
    return absl::OkStatus();
  }
  const int64_t n = static_cast<int64_t>(payload.size());
  if (n > options_.capacity_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "disk tier: a block of ", n, " bytes exceeds the tier's ", options_.capacity_bytes));
  }
  // Evictions and the new entry in one batch: after a crash either all of
  // it happened or none of it.
  rocksdb::WriteBatch batch;
  std::vector<std::string> victims;
  int64_t bytes = bytes_;
  int64_t entries = static_cast<int64_t>(index_.size());
  for (auto v = lru_.begin(); v != lru_.end() && (bytes + n > options_.capacity_bytes ||
                                                  entries + 1 > options_.max_entries);
       ++v) {
    batch.Delete(meta_, *v);
    batch.Delete(blocks_, *v);
    bytes -= index_.find(*v)->second.bytes;
    --entries;
    victims.push_back(*v);
  }
  const uint64_t tick = next_tick_++;
  batch.Put(meta_, key, EncodeMeta(n, xxh64, tick));
  batch.Put(blocks_, key, payload);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  if (absl::Status st = FromRocks(db_->Write(wo, &batch), "disk tier: write"); !st.ok()) return st;
  for (const auto& v : victims) EraseIndexLocked(index_.find(v));
  evictions_ += static_cast<int64_t>(victims.size());
  lru_.push_back(key);
  bytes_ += n;
  index_.emplace(key, Entry{n, xxh64, tick, std::prev(lru_.end())});
  if (new_entry != nullptr) *new_entry = true;
  return absl::OkStatus();
}

absl::Status DiskTier::Put(const std::string& key, const Block& block, bool* new_entry) {
  absl::MutexLock lock(&mu_);
  return WriteLocked(key, *block.payload, block.xxh64, new_entry);
}

absl::Status DiskTier::PutUncheckedForTesting(const std::string& key, const std::string& payload,
                                              uint64_t claimed_xxh64) {
  absl::MutexLock lock(&mu_);
  return WriteLocked(key, payload, claimed_xxh64, nullptr);
}

void DiskTier::DropCorrupt(const std::string& key, uint64_t tick, std::string_view why) {
  absl::MutexLock lock(&mu_);
  ++checksum_failures_;
  RL_LOG(WARNING) << "disk tier: block " << DescribeEncodedKey(key) << " failed verification ("
                  << why << "); dropped";
  auto it = index_.find(key);
  if (it == index_.end() || it->second.tick != tick) return;
  rocksdb::WriteBatch batch;
  batch.Delete(meta_, key);
  batch.Delete(blocks_, key);
  (void)db_->Write(rocksdb::WriteOptions(), &batch);
  EraseIndexLocked(it);
}

absl::StatusOr<Block> DiskTier::Get(const std::string& key) {
  int64_t bytes = 0;
  uint64_t xxh64 = 0;
  uint64_t tick = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError("not stored");
    bytes = it->second.bytes;
    xxh64 = it->second.xxh64;
    tick = it->second.tick;
  }
  // The read runs without mu_: a payload of MiB should not stall the
  // index. An entry evicted meanwhile reads as NotFound.
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::string value;
  rocksdb::Status s = db_->Get(ro, blocks_, key, &value);
  if (s.IsNotFound()) {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end() || it->second.tick != tick) return absl::NotFoundError("evicted");
    // Indexed but without a payload: the halves disagree.
  }
  if (s.IsNotFound() || s.IsCorruption()) {
    DropCorrupt(key, tick, s.IsNotFound() ? "payload missing" : "storage checksum");
    return absl::DataLossError("stored block failed verification");
  }
  if (!s.ok()) return FromRocks(s, "disk tier: read");
  if (static_cast<int64_t>(value.size()) != bytes || PayloadXxh64(value) != xxh64) {
    DropCorrupt(key, tick, "payload XXH64 mismatch");
    return absl::DataLossError("stored block failed verification");
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) RefreshLocked(it);
  }
  return Block{std::make_shared<const std::string>(std::move(value)), xxh64};
}

bool DiskTier::Contains(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

bool DiskTier::Touch(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  RefreshLocked(it);
  return true;
}

absl::StatusOr<int64_t> DiskTier::EraseWithPrefix(std::string_view prefix) {
  absl::MutexLock lock(&mu_);
  const std::string end = PrefixSuccessor(prefix);
  rocksdb::WriteBatch batch;
  std::vector<std::string> doomed;
  if (end.empty()) {
    for (const auto& [k, e] : index_) {
      if (std::string_view(k).substr(0, prefix.size()) == prefix) doomed.push_back(k);
    }
    for (const auto& k : doomed) {
      batch.Delete(meta_, k);
      batch.Delete(blocks_, k);
    }
  } else {
    // Ranges also catch anything under the prefix the index does not know.
    batch.DeleteRange(meta_, rocksdb::Slice(prefix.data(), prefix.size()), end);
    batch.DeleteRange(blocks_, rocksdb::Slice(prefix.data(), prefix.size()), end);
    for (const auto& [k, e] : index_) {
      if (std::string_view(k).substr(0, prefix.size()) == prefix) doomed.push_back(k);
    }
  }
  if (absl::Status st = FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "disk tier: delete");
      !st.ok()) {
    return st;
  }
  for (const auto& k : doomed) EraseIndexLocked(index_.find(k));
  return static_cast<int64_t>(doomed.size());
}

DiskTier::Stats DiskTier::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{.entries = static_cast<int64_t>(index_.size()),
               .bytes = bytes_,
               .capacity_bytes = options_.capacity_bytes,
               .evictions = evictions_,
               .checksum_failures = checksum_failures_};
}

std::vector<std::string> DiskTier::KeysLruOrderForTesting() const {
  absl::MutexLock lock(&mu_);
  return {lru_.begin(), lru_.end()};
}

absl::Status DiskTier::FlushForTesting() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return FromRocks(db_->Flush(fo, handles_), "disk tier: flush");
}

}  // namespace ringlane::kvstore
