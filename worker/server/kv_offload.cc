#include "worker/server/kv_offload.h"

#include <chrono>
#include <utility>

#include "services/log.h"

namespace ringlane::worker {

KvStoreLink::KvStoreLink(std::unique_ptr<services::KvStoreClient> client,
                         KvStoreLinkOptions options, WorkerMetrics* metrics)
    : client_(std::move(client)),
      options_(options),
      metrics_(metrics),
      uploader_([this] { UploadLoop(); }) {}

KvStoreLink::~KvStoreLink() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  uploader_.join();
}

void KvStoreLink::SetUp(bool up) {
  if (metrics_) metrics_->kvstore_up->Set(up ? 1 : 0);
}

bool KvStoreLink::Offload(v1::BlockKey key, std::string payload, uint64_t xxh64) {
  absl::MutexLock l(&mu_);
  if (stop_ || queued_bytes_ + payload.size() > options_.max_queued_bytes) {
    if (metrics_) metrics_->kvstore_offload_dropped->Increment();
    return false;
  }
  queued_bytes_ += payload.size();
  if (metrics_) metrics_->kvstore_queued_bytes->Set(static_cast<double>(queued_bytes_));
  queue_.push_back(Pending{std::move(key), std::move(payload), xxh64});
  return true;
}

void KvStoreLink::Flush() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](KvStoreLink* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->stop_ || (self->queue_.empty() && self->uploading_ == 0);
      },
      this));
}

void KvStoreLink::UploadLoop() {
  for (;;) {
    std::vector<Pending> batch;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](KvStoreLink* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stop_ || !self->queue_.empty();
          },
          this));
      if (stop_) return;
      while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch_blocks) {
        queued_bytes_ -= queue_.front().payload.size();
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      uploading_ = static_cast<int>(batch.size());
      if (metrics_) metrics_->kvstore_queued_bytes->Set(static_cast<double>(queued_bytes_));
    }
    std::vector<services::KvBlockToPut> puts;
    puts.reserve(batch.size());
    size_t bytes = 0;
    for (const Pending& p : batch) {
      puts.push_back(services::KvBlockToPut{p.key, p.payload, p.xxh64});
      bytes += p.payload.size();
    }
    absl::StatusOr<v1::PutResponse> r = client_->Put(puts);
    SetUp(r.ok());
    if (metrics_) {
      if (r.ok()) {
        metrics_->kvstore_offload_stored->Increment(static_cast<double>(batch.size()));
        metrics_->kvstore_bytes_out->Increment(static_cast<double>(bytes));
      } else {
        metrics_->kvstore_offload_failed->Increment(static_cast<double>(batch.size()));
      }
    }
    if (!r.ok()) {
      // Fail open: the blocks are recomputed if they are ever wanted again.
      // At most one line per 10 s: a store that is down fails every batch.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_warning_ >= std::chrono::seconds(10)) {
        last_warning_ = now;
        RL_LOG(WARNING) << "kvstore put of " << batch.size()
                        << " blocks failed (dropped; later recomputed): " << r.status().message();
      }
    }
    absl::MutexLock l(&mu_);
    uploading_ = 0;
  }
}

absl::StatusOr<services::KvGetResult> KvStoreLink::Fetch(absl::Span<const v1::BlockKey> keys) {
  const int64_t failures_before = client_->checksum_failures();
  absl::StatusOr<services::KvGetResult> r = client_->GetPrefix(keys);
  SetUp(r.ok() && (r->stopped.ok() || absl::IsDataLoss(r->stopped)));
  if (metrics_) {
    metrics_->kvstore_checksum_failures->Increment(
        static_cast<double>(client_->checksum_failures() - failures_before));
    if (r.ok()) {
      size_t bytes = 0;
      for (const services::KvStoredBlock& b : r->blocks) bytes += b.payload.size();
      metrics_->kvstore_bytes_in->Increment(static_cast<double>(bytes));
    }
  }
  return r;
}

}  // namespace ringlane::worker
