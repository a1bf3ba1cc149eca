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
// Payloads travel by one of three transports, chosen per call: RDMA verbs
// when a region is attached (KvStore.AttachRdma; one-sided WRITE and READ
// of a registered buffer), else a shared-memory segment when attached (a
// store on the same node), else inline in the gRPC stream. A transport
// failure (no device, an attach refused, a work completion error, a
// transfer not done by the call's deadline, a store that lost the region)
// never fails a call: the call goes on over the next transport, and RDMA is
// attached again later, with a backoff of 1 s doubling to 60 s.
//
// Thread-safe: calls may run on many threads at once over one channel.
#ifndef RINGLANE_SERVICES_KVSTORE_CLIENT_H_
#define RINGLANE_SERVICES_KVSTORE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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
#include "services/rdma.h"
#include "services/shm_segment.h"

namespace ringlane::services {

// The client's end of an attached RDMA region: a local buffer the size of
// the store's region, at the same offsets, and the one-sided transfers
// between the two. The real one is a verbs endpoint (RdmaEndpoint, with the
// region's address and rkey); tests put a fake over plain memory. Used by
// one call at a time; after a failed transfer it is dropped, never reused.
class KvRdmaLink {
 public:
  virtual ~KvRdmaLink() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
  // Local [offset, offset + length) to the region, and back, done or failed
  // by `deadline`.
  virtual absl::Status Write(size_t offset, size_t length,
                             std::chrono::steady_clock::time_point deadline) = 0;
  virtual absl::Status Read(size_t offset, size_t length,
                            std::chrono::steady_clock::time_point deadline) = 0;
};

// An attached region: the link to it, its name in the store and its size.
struct KvRdmaAttachment {
  std::unique_ptr<KvRdmaLink> link;
  std::string region;
  int64_t size_bytes = 0;
};

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
  // RDMA transport: a buffer of this many bytes registered on `rdma_device`
  // (its name empty: the first device), attached to the store on first use
  // (KvStore.AttachRdma); the leading payloads of a call that fit go by
  // RDMA, the rest by the next transport. 0 = no RDMA (the daemons set it
  // only where ResolveRdma found a device).
  int64_t rdma_bytes = 0;
  RdmaDeviceSpec rdma_device;
  // Tests on machines without a device: attaches through this instead of
  // verbs and AttachRdma (a fake link over a region the test made in the
  // store with KvStoreService::AttachRdmaRegionForTesting).
  std::function<absl::StatusOr<KvRdmaAttachment>()> rdma_attach_for_testing;
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
  // The same for RDMA: payload bytes moved by RDMA WRITE and READ (and
  // stored or verified), and whether a region is attached now.
  int64_t rdma_bytes_moved() const { return rdma_bytes_moved_.load(std::memory_order_relaxed); }
  bool rdma_attached() const;
  const KvStoreClientOptions& options() const { return options_; }

 private:
  using Deadline = std::chrono::system_clock::time_point;
  void Prepare(grpc::ClientContext* ctx) const;
  void Prepare(grpc::ClientContext* ctx, Deadline deadline) const;
  // Put and GetPrefix over shared memory when attached, else gRPC.
  absl::StatusOr<v1::PutResponse> PutOverShmOrGrpc(absl::Span<const KvBlockToPut> blocks,
                                                   Deadline deadline);
  absl::StatusOr<KvGetResult> GetOverShmOrGrpc(absl::Span<const v1::BlockKey> keys,
                                               Deadline deadline);
  // With rdma_mu_ held: whether this call may use RDMA, attaching first when
  // not attached and the backoff has passed.
  bool UseRdma(Deadline deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
  absl::Status AttachRdma(Deadline deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
  // The verbs half of AttachRdma: a queue pair and buffer, the rpc, the
  // connection to the store's queue pair.
  absl::StatusOr<KvRdmaAttachment> AttachRdmaVerbs(Deadline deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
  // Drops the region after a transport failure (destroying the queue pair
  // stops any transfer still in flight) and schedules the next attach.
  void DropRdma(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
  // Puts the leading blocks that fit in the region: nullopt after a
  // transport failure before the store took any (the caller sends them
  // another way), else the call's outcome; *done says how many were put.
  std::optional<absl::StatusOr<v1::PutResponse>> PutOverRdma(absl::Span<const KvBlockToPut> blocks,
                                                             Deadline deadline, size_t* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
  // Reads the leading blocks of `keys` that fit in the region into r->blocks,
  // verified. True when the rest of the prefix is to be read another way
  // (the region was full, or the transport failed); false when the prefix
  // ended (r->stopped says why when not OK); an error when the call failed.
  absl::StatusOr<bool> GetOverRdma(absl::Span<const v1::BlockKey> keys, Deadline deadline,
                                   KvGetResult* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rdma_mu_);
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
  std::atomic<int64_t> rdma_bytes_moved_{0};
  // One call at a time uses the region. Never held with shm_mu_: a call
  // releases it before it goes on over shared memory or gRPC.
  mutable absl::Mutex rdma_mu_;
  std::shared_ptr<RdmaDevice> rdma_device_ ABSL_GUARDED_BY(rdma_mu_);
  // Connected to the store's region when set.
  std::unique_ptr<KvRdmaLink> rdma_ ABSL_GUARDED_BY(rdma_mu_);
  std::string rdma_region_ ABSL_GUARDED_BY(rdma_mu_);
  // Bytes both ends' buffers have (the smaller of the two).
  int64_t rdma_size_ ABSL_GUARDED_BY(rdma_mu_) = 0;
  // The region attached last, for the store to drop at the next attach.
  std::string rdma_previous_region_ ABSL_GUARDED_BY(rdma_mu_);
  std::chrono::steady_clock::time_point rdma_retry_at_ ABSL_GUARDED_BY(rdma_mu_){};
  std::chrono::milliseconds rdma_backoff_ ABSL_GUARDED_BY(rdma_mu_){0};
  // Whether the failure being backed off from was logged (once per outage).
  bool rdma_failure_logged_ ABSL_GUARDED_BY(rdma_mu_) = false;
};

// The channel arguments Connect uses (message sizes from `options`,
// reconnect backoff), for callers that build their own channel.
grpc::ChannelArguments KvStoreChannelArguments(const KvStoreClientOptions& options);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_KVSTORE_CLIENT_H_
