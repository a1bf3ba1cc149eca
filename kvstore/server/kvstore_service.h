// The KvStore gRPC service (proto/ringlane/v1/kvstore.proto) over a Store:
// every bound of a request is checked here, where the bytes arrive, before
// anything is kept. A Put stream holds at most one block's bytes at a time,
// and only the bytes that actually arrived (a client that claims a huge
// total_bytes and sends little costs little); Get streams a block from a
// shared payload without copying it.
//
// Synchronous handlers, called on gRPC's threads; thread-safe (the store
// is). Calls over max_concurrent_calls fail at once with RESOURCE_EXHAUSTED.
#ifndef RINGLANE_KVSTORE_SERVER_KVSTORE_SERVICE_H_
#define RINGLANE_KVSTORE_SERVER_KVSTORE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kvstore/store.h"
#include "ringlane/v1/kvstore.grpc.pb.h"
#include "services/rdma.h"
#include "services/shm_segment.h"

namespace ringlane::kvstore {

struct ServiceLimits {
  // Largest `data` of one Put chunk, and largest max_chunk_bytes a Get may
  // ask for.
  int64_t max_chunk_bytes = 4 << 20;
  // Largest block payload.
  int64_t max_block_bytes = 64 << 20;
  // Keys of one Get or Lookup.
  int max_keys_per_request = 4096;
  // Calls served at once (each Put may hold max_block_bytes).
  int max_concurrent_calls = 64;
  // Shared-memory transport (AttachShm): the directory segments must be in
  // ("" = off), their largest size, and how many stay attached (the oldest
  // is dropped for a new one; its client re-attaches).
  std::string shm_dir = "/dev/shm";
  int64_t max_shm_segment_bytes = int64_t{1} << 30;
  int max_shm_segments = 64;
  // RDMA transport (AttachRdma): the opened device, null when RDMA is off or
  // there is none (AttachRdma then fails with FAILED_PRECONDITION, saying
  // `rdma_unavailable`); the largest region one client gets, and how many
  // stay attached (each one queue pair and one registered, pinned buffer;
  // the oldest is dropped for a new one, its client re-attaches).
  std::shared_ptr<services::RdmaDevice> rdma_device;
  std::string rdma_unavailable = "RDMA is off on this kvstore";
  int64_t max_rdma_bytes = int64_t{256} << 20;
  int max_rdma_clients = 16;
};

// Get's chunk size when the request says 0.
inline constexpr int64_t kDefaultGetChunkBytes = 1 << 20;

class KvStoreService final : public v1::KvStore::Service {
 public:
  // `store` must outlive the service.
  KvStoreService(Store* store, const ServiceLimits& limits);

  grpc::Status Put(grpc::ServerContext* ctx, grpc::ServerReader<v1::KvBlockChunk>* reader,
                   v1::PutResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetRequest* req,
                   grpc::ServerWriter<v1::KvBlockChunk>* writer) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                      v1::LookupResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;
  grpc::Status DeleteModel(grpc::ServerContext* ctx, const v1::DeleteModelRequest* req,
                           v1::DeleteModelResponse* resp) override;
  grpc::Status AttachShm(grpc::ServerContext* ctx, const v1::AttachShmRequest* req,
                         v1::AttachShmResponse* resp) override;
  grpc::Status AttachRdma(grpc::ServerContext* ctx, const v1::AttachRdmaRequest* req,
                          v1::AttachRdmaResponse* resp) override;
  grpc::Status PutRdma(grpc::ServerContext* ctx, const v1::PutRdmaRequest* req,
                       v1::PutResponse* resp) override;
  grpc::Status GetRdma(grpc::ServerContext* ctx, const v1::GetRdmaRequest* req,
                       v1::GetRdmaResponse* resp) override;

  // A region of plain memory under a new name, as if a client had attached
  // it over RDMA (no queue pair; the test writes and reads its bytes
  // directly), for tests of PutRdma and GetRdma on machines without a
  // device. Returns the name; the bytes stay valid while the region is
  // attached.
  std::string AttachRdmaRegionForTesting(size_t size, uint8_t** data);
  // Regions attached now.
  int rdma_regions() const;

  // Calls refused for being over the limit, and calls that failed with
  // INVALID_ARGUMENT, since start.
  int64_t rejected_busy() const { return rejected_busy_.load(std::memory_order_relaxed); }
  int64_t rejected_invalid() const { return rejected_invalid_.load(std::memory_order_relaxed); }

 private:
  class CallSlot;
  struct RdmaRegion;
  grpc::Status Invalid(const absl::Status& s);
  grpc::Status CheckKeys(const google::protobuf::RepeatedPtrField<v1::BlockKey>& keys);
  // The attached segment `name`, or null.
  std::shared_ptr<services::ShmSegment> Segment(const std::string& name);
  // The attached RDMA region `name`, or null.
  std::shared_ptr<RdmaRegion> Region(const std::string& name);
  // Keeps `r`, dropping `previous` (the caller's older region) and the
  // oldest beyond max_rdma_clients.
  void AddRegion(std::shared_ptr<RdmaRegion> r, const std::string& previous);

  Store* const store_;
  const ServiceLimits limits_;
  std::atomic<int> active_calls_{0};
  std::atomic<int64_t> rejected_busy_{0};
  std::atomic<int64_t> rejected_invalid_{0};
  absl::Mutex shm_mu_;
  std::deque<std::shared_ptr<services::ShmSegment>> segments_ ABSL_GUARDED_BY(shm_mu_);
  // Never held together with shm_mu_. A call holds its region through the
  // shared_ptr, so a region dropped meanwhile is freed (queue pair
  // destroyed, buffer deregistered) when that call ends.
  mutable absl::Mutex rdma_mu_;
  std::deque<std::shared_ptr<RdmaRegion>> regions_ ABSL_GUARDED_BY(rdma_mu_);
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_SERVER_KVSTORE_SERVICE_H_
