#include "kvstore/store.h"

#include "absl/strings/str_cat.h"
#include "kvstore/block_key.h"
#include "services/log.h"

namespace ringlane::kvstore {

Store::Store(const StoreOptions& options) : options_(options), dram_(options.dram_bytes) {}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  std::unique_ptr<Store> s(new Store(options));
  if (!options.disk_dir.empty()) {
    auto disk = DiskTier::Open({.dir = options.disk_dir,
                                .capacity_bytes = options.disk_bytes,
                                .max_entries = options.disk_max_entries,
                                .sync_writes = options.disk_sync_writes});
    if (!disk.ok()) return disk.status();
    s->disk_ = std::move(*disk);
  }
  return s;
}

void Store::Demote(DramTier::Evicted evicted) {
  if (disk_ == nullptr) return;
  for (auto& [key, block] : evicted) {
    if (absl::Status st = disk_->Put(key, block); !st.ok()) {
      // The block is gone from DRAM and did not reach disk: a later Get
      // misses and the cluster recomputes it. Nothing wrong is served.
      RL_LOG(WARNING) << "demotion of " << DescribeEncodedKey(key) << " failed: " << st.message();
      continue;
    }
    demotions_.fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status Store::Put(const std::string& key, std::shared_ptr<const std::string> payload,
                        uint64_t xxh64, bool* already_stored) {
  if (already_stored != nullptr) *already_stored = false;
  if (PayloadXxh64(*payload) != xxh64) {
    checksum_failures_put_.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError("payload does not match its payload_xxh64");
  }
  bytes_in_.fetch_add(static_cast<int64_t>(payload->size()), std::memory_order_relaxed);
  // Equal keys mean equal bytes: a key stored anywhere only gets refreshed.
  if (dram_.Touch(key) || (disk_ != nullptr && disk_->Touch(key))) {
    if (already_stored != nullptr) *already_stored = true;
    return absl::OkStatus();
  }
  Block block{std::move(payload), xxh64};
  DramTier::Evicted evicted;
  bool is_new = false;
  const bool in_dram = dram_.Insert(key, block, &evicted, &is_new);
  Demote(std::move(evicted));
  bool on_disk = false;
  if (disk_ != nullptr && (options_.write_through || !in_dram)) {
    bool disk_new = false;
    if (absl::Status st = disk_->Put(key, block, &disk_new); st.ok()) {
      on_disk = true;
      is_new = is_new || disk_new;
    } else if (!in_dram) {
      return absl::ResourceExhaustedError(
          absl::StrCat("block of ", block.bytes(), " bytes: ", st.message()));
    }
  }
  if (!in_dram && !on_disk) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block of ", block.bytes(), " bytes does not fit the DRAM tier's ",
                     options_.dram_bytes, " bytes and there is no disk tier"));
  }
  if (is_new) blocks_stored_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<Block> Store::Get(const std::string& key) {
  if (std::optional<Block> b = dram_.Get(key)) {
    hits_dram_.fetch_add(1, std::memory_order_relaxed);
    return *b;
  }
  if (disk_ == nullptr) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return absl::NotFoundError("not stored");
  }
  absl::StatusOr<Block> b = disk_->Get(key);
  if (!b.ok()) {
    // DataLoss was counted and logged by the tier; to the caller it is a
    // miss like any other.
    if (b.status().code() == absl::StatusCode::kNotFound ||
        b.status().code() == absl::StatusCode::kDataLoss) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      return absl::NotFoundError("not stored");
    }
    return b.status();
  }
  hits_disk_.fetch_add(1, std::memory_order_relaxed);
  DramTier::Evicted evicted;
  dram_.Insert(key, *b, &evicted);
  Demote(std::move(evicted));
  return b;
}

bool Store::Contains(const std::string& key) const {
  return dram_.Contains(key) || (disk_ != nullptr && disk_->Contains(key));
}

absl::StatusOr<v1::DeleteModelResponse> Store::DeleteModel(std::string_view model_id) {
  const std::string prefix = ModelPrefix(model_id);
  v1::DeleteModelResponse r;
  r.set_num_dram_deleted(dram_.EraseWithPrefix(prefix));
  if (disk_ != nullptr) {
    absl::StatusOr<int64_t> n = disk_->EraseWithPrefix(prefix);
    if (!n.ok()) return n.status();
    r.set_num_disk_deleted(*n);
  }
  return r;
}

void Store::FlushDramToDisk() {
  if (disk_ == nullptr) return;
  DramTier::Evicted all = dram_.TakeAll();
  const size_t n = all.size();
  Demote(std::move(all));
  if (n > 0) RL_LOG(INFO) << "wrote " << n << " DRAM entries to the disk tier";
}

v1::StatsResponse Store::Stats() const {
  v1::StatsResponse r;
  const DramTier::Stats d = dram_.stats();
  r.mutable_dram()->set_entries(d.entries);
  r.mutable_dram()->set_bytes(d.bytes);
  r.mutable_dram()->set_capacity_bytes(d.capacity_bytes);
  r.mutable_dram()->set_evictions(d.evictions);
  r.mutable_dram()->set_hits(hits_dram_.load(std::memory_order_relaxed));
  if (disk_ != nullptr) {
    const DiskTier::Stats k = disk_->stats();
    r.mutable_disk()->set_entries(k.entries);
    r.mutable_disk()->set_bytes(k.bytes);
    r.mutable_disk()->set_capacity_bytes(k.capacity_bytes);
    r.mutable_disk()->set_evictions(k.evictions);
    r.set_checksum_failures_disk(k.checksum_failures);
  }
  r.mutable_disk()->set_hits(hits_disk_.load(std::memory_order_relaxed));
  r.set_misses(misses_.load(std::memory_order_relaxed));
  r.set_checksum_failures_put(checksum_failures_put_.load(std::memory_order_relaxed));
  r.set_demotions(demotions_.load(std::memory_order_relaxed));
  r.set_bytes_in(bytes_in_.load(std::memory_order_relaxed));
  r.set_bytes_out(bytes_out_.load(std::memory_order_relaxed));
  r.set_blocks_stored(blocks_stored_.load(std::memory_order_relaxed));
  return r;
}

}  // namespace ringlane::kvstore
