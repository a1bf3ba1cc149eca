// A worker rank's link to its kvstore (services/kvstore_client.h): the
// background upload of blocks the router offloads, and the fetch of a prefix
// chain to restore. The step loop never waits on the store: an offload copies
// the block (on the step loop, before the round that may overwrite it) and
// queues it here; an upload thread puts queued blocks in batches. The queue
// is bounded in bytes; when full, new blocks are dropped and counted, which
// costs a later recomputation, never memory or a round's time.
//
// Thread-safe: Offload from the Rounds handler, Fetch from RestoreKvBlocks
// handlers, the upload thread inside.
#ifndef RINGLANE_WORKER_SERVER_KV_OFFLOAD_H_
#define RINGLANE_WORKER_SERVER_KV_OFFLOAD_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ringlane/v1/common.pb.h"
#include "services/kvstore_client.h"
#include "worker/server/worker_metrics.h"

namespace ringlane::worker {

struct KvStoreLinkOptions {
  // Upper bound on payload bytes waiting for upload.
  size_t max_queued_bytes = size_t{256} << 20;
  // Blocks per Put call.
  int max_batch_blocks = 16;
};

class KvStoreLink {
 public:
  // `metrics` (optional) is not owned and must outlive the link. Starts the
  // upload thread.
  KvStoreLink(std::unique_ptr<services::KvStoreClient> client, KvStoreLinkOptions options,
              WorkerMetrics* metrics);
  ~KvStoreLink();  // stops the upload thread; blocks still queued are dropped

  KvStoreLink(const KvStoreLink&) = delete;
  KvStoreLink& operator=(const KvStoreLink&) = delete;

  // Queues one block for upload with the checksum its producer (this rank)
  // computed, carried to the store so that bytes changed on the way are
  // refused there. False when the queue is full (dropped, counted).
  bool Offload(v1::BlockKey key, std::string payload, uint64_t xxh64);

  // The longest stored prefix of `keys`, every block verified (a block that
  // fails its checksum ends the prefix and is counted). The client's
  // deadline bounds the call.
  absl::StatusOr<services::KvGetResult> Fetch(absl::Span<const v1::BlockKey> keys);

  // Waits until every block queued so far was uploaded or dropped (tests,
  // drain).
  void Flush();

 private:
  struct Pending {
    v1::BlockKey key;
    std::string payload;
    uint64_t xxh64 = 0;
  };

  void UploadLoop();
  void SetUp(bool up);

  const std::unique_ptr<services::KvStoreClient> client_;
  std::chrono::steady_clock::time_point last_warning_{};  // upload thread only
  const KvStoreLinkOptions options_;
  WorkerMetrics* const metrics_;

  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int uploading_ ABSL_GUARDED_BY(mu_) = 0;  // blocks taken off the queue, not yet answered
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread uploader_;  // last: starts once the fields above exist
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_KV_OFFLOAD_H_
