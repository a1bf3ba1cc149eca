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

  // Calls refused for being over the limit, and calls that failed with
  // INVALID_ARGUMENT, since start.
  int64_t rejected_busy() const { return rejected_busy_.load(std::memory_order_relaxed); }
  int64_t rejected_invalid() const { return rejected_invalid_.load(std::memory_order_relaxed); }

 private:
  class CallSlot;
  grpc::Status Invalid(const absl::Status& s);
  grpc::Status CheckKeys(const google::protobuf::RepeatedPtrField<v1::BlockKey>& keys);
  // The attached segment `name`, or null.
  std::shared_ptr<services::ShmSegment> Segment(const std::string& name);

  Store* const store_;
  const ServiceLimits limits_;
  std::atomic<int> active_calls_{0};
  std::atomic<int64_t> rejected_busy_{0};
  std::atomic<int64_t> rejected_invalid_{0};
  absl::Mutex shm_mu_;
  std::deque<std::shared_ptr<services::ShmSegment>> segments_ ABSL_GUARDED_BY(shm_mu_);
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_SERVER_KVSTORE_SERVICE_H_
