// The client end of the kvstore (proto/ringlane/v1/kvstore.proto), for the
// router and the workers: batched puts of whole blocks (chunked, with their
// XXH64), the longest stored prefix of a chain (every block verified on
// receipt), lookups, stats and deletes.
//
// Every call has a short deadline (KvStoreClientOptions::deadline) and never
// waits for a connection (wait_for_ready off), so a store that is down fails
// a call at once with UNAVAILABLE and one that is frozen fails it with
// DEADLINE_EXCEEDED after the deadline: the caller recomputes instead
// (failing open is its job; this client only never blocks past the
// deadline). The channel reconnects by itself, with its backoff capped at
// max_reconnect_backoff, so use resumes soon after the store is back.
// Nothing throws.
//
// Thread-safe: calls may run on many threads at once over one channel.
#ifndef RINGLANE_SERVICES_KVSTORE_CLIENT_H_
#define RINGLANE_SERVICES_KVSTORE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ringlane/v1/kvstore.grpc.pb.h"
#include "services/shm_segment.h"

namespace ringlane::services {

struct KvStoreClientOptions {
  // Whole-call deadline of every RPC (a Put or Get stream included).
  std::chrono::milliseconds deadline{300};
  // Largest data per chunk sent, and asked for on Get.
  int64_t max_chunk_bytes = 1 << 20;
  // Largest block accepted from a Get; a larger one ends the prefix there.
  int64_t max_block_bytes = 64 << 20;
  // Cap on the channel's reconnect backoff (gRPC's default grows to 120 s).
  std::chrono::milliseconds max_reconnect_backoff{1000};
  // Same-node transport: a shared-memory segment of this many bytes in
  // `shm_dir`, attached to the store on first use (KvStore.AttachShm);
  // payloads that fit go through it, the rest and every call of a store that
  // cannot see the segment (another node) go over gRPC. 0 = gRPC only.
  int64_t shm_bytes = 0;
  std::string shm_dir = "/dev/shm";
};

// A block to put: its key, its payload (borrowed for the call) and,
// optionally, the XXH64 its producer computed. Giving the producer's
// checksum carries it end to end: bytes that changed between the producer
// and here are rejected by the store (DATA_LOSS) instead of stored.
struct KvBlockToPut {
  v1::BlockKey key;
  std::string_view payload;
  std::optional<uint64_t> xxh64;
};

// A block read back, verified.
struct KvStoredBlock {
  v1::BlockKey key;
  std::string payload;
  uint64_t xxh64 = 0;
};

struct KvGetResult {
  // The verified blocks, a prefix of the keys asked for (possibly empty).
  std::vector<KvStoredBlock> blocks;
  // Why the prefix ended before the last key: OK when the store had no more
  // of it; DATA_LOSS when the next block failed verification; the call's
  // error (DEADLINE_EXCEEDED, UNAVAILABLE, ...) when it broke after some
  // blocks had arrived.
  absl::Status stopped;
};

class KvStoreClient {
 public:
  // A client over `channel` (tests, or a channel the caller configured).
  KvStoreClient(std::shared_ptr<grpc::Channel> channel, KvStoreClientOptions options = {});
  // A channel to the kvstore at `address` with the daemon's peer
  // credentials (services/grpc_security.h) and the client's channel
  // arguments (message sizes, reconnect backoff).
  static std::unique_ptr<KvStoreClient> Connect(const std::string& address,
                                                KvStoreClientOptions options = {});

  // Stores the blocks in one Put stream. The store's response, or the
  // call's error: INVALID_ARGUMENT (a bad key or size), DATA_LOSS (a payload
  // that does not match its xxh64; blocks before it are stored),
  // DEADLINE_EXCEEDED, UNAVAILABLE, ...
  absl::StatusOr<v1::PutResponse> Put(absl::Span<const KvBlockToPut> blocks);

  // The longest stored prefix of `keys`, each block checked against its
  // XXH64 (a mismatch ends the prefix there and counts in
  // checksum_failures()). An error only when nothing arrived and the call
  // failed; a call that broke later returns what arrived (see KvGetResult).
  absl::StatusOr<KvGetResult> GetPrefix(absl::Span<const v1::BlockKey> keys);

  absl::StatusOr<v1::LookupResponse> Lookup(absl::Span<const v1::BlockKey> keys);
  absl::StatusOr<v1::StatsResponse> Stats();
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(const std::string& model_id);

  // Blocks received whose bytes failed verification, since construction.
  int64_t checksum_failures() const { return checksum_failures_.load(std::memory_order_relaxed); }
  // Payload bytes that went through shared memory, either way, since
  // construction; whether the segment is attached now.
  int64_t shm_bytes_moved() const { return shm_bytes_moved_.load(std::memory_order_relaxed); }
  bool shm_attached() const;
  const KvStoreClientOptions& options() const { return options_; }

 private:
  void Prepare(grpc::ClientContext* ctx) const;
  // With shm_mu_ held: whether this call may use the segment, attaching it
  // first when it is not (at most every few seconds after a refusal).
  bool UseShm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shm_mu_);
  // A call failed: if the store no longer knows the segment (it restarted),
  // attach again next time.
  void NoteShmFailure(const grpc::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shm_mu_);

  const KvStoreClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
  std::atomic<int64_t> checksum_failures_{0};
  std::atomic<int64_t> shm_bytes_moved_{0};
  // One call at a time uses the segment.
  mutable absl::Mutex shm_mu_;
  std::unique_ptr<ShmSegment> shm_ ABSL_GUARDED_BY(shm_mu_);
  bool shm_attached_ ABSL_GUARDED_BY(shm_mu_) = false;
  std::chrono::steady_clock::time_point shm_retry_at_ ABSL_GUARDED_BY(shm_mu_){};
};

// The channel arguments Connect uses (message sizes from `options`,
// reconnect backoff), for callers that build their own channel.
grpc::ChannelArguments KvStoreChannelArguments(const KvStoreClientOptions& options);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_KVSTORE_CLIENT_H_
