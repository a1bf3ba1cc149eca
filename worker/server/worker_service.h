// The gRPC Worker service of one rank (proto/ringlane/v1/worker.proto): model
// and shard info, the Rounds stream, KV block export and import. Its handlers
// only enqueue operations on the group's step loop (GroupMember::steps()),
// which runs them in order on the current formation, and wait for the
// results. A stream is tied to the epoch it started in and ends with
// UNAVAILABLE when the group breaks. Called on gRPC's handler threads;
// thread-safe.
#ifndef RINGLANE_WORKER_SERVER_WORKER_SERVICE_H_
#define RINGLANE_WORKER_SERVER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ringlane/v1/worker.grpc.pb.h"
#include "worker/server/group.h"
#include "worker/server/kv_offload.h"
#include "worker/server/worker_metrics.h"

namespace ringlane::worker {

struct WorkerIdentity {
  std::string model_id;
  std::string model_revision;
  std::string backend = "cpu";
  std::string group;
  int rank = 0;
  int world_size = 1;
  // The kvstore this rank uses ("" when none) and its blocks' layout
  // fingerprint (KvLayoutFingerprint), advertised and put in every key.
  std::string kvstore_address;
  uint64_t kv_layout_fingerprint = 0;
  // Every rank's blocks hold the same bytes (a latent cache, computed whole
  // on each rank): the kvstore keeps one copy under a rank-shared key, which
  // rank 0 alone writes and every rank reads.
  bool kv_rank_shared = false;
  // WorkerInfo.moe_sharding: "tp", "ep", or "" without MoE.
  std::string moe_sharding;
  // WorkerInfo.draft_model_id and max_proposed_drafts (rank 0 with a draft
  // model; empty and 0 otherwise).
  std::string draft_model_id;
  int max_proposed_drafts = 0;
};

// What shapes a block's bytes beyond the fields of BlockKey: the backend and
// every layer's cache kind and geometry, under a layout version. Equal
// fingerprints mean payloads that can be exchanged.
uint64_t KvLayoutFingerprint(const std::string& backend, const std::vector<LayerCacheSpec>& caches);

class WorkerService final : public ringlane::v1::Worker::Service {
 public:
  // `group`, `metrics` and `kvstore` (both optional) are not owned and must
  // outlive the service.
  // `layer_caches` is what this rank's backend keeps per layer
  // (backend/factory.h LayerCaches), advertised in GetInfo.
  WorkerService(GroupMember* group, const ModelConfig& config, const KvPoolSpec& kv_pool,
                int64_t kv_block_bytes, std::vector<LayerCacheSpec> layer_caches, WorkerIdentity id,
                WorkerMetrics* metrics, KvStoreLink* kvstore = nullptr);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const ringlane::v1::GetInfoRequest* req,
                       ringlane::v1::WorkerInfo* info) override;
  grpc::Status Rounds(grpc::ServerContext* ctx,
                      grpc::ServerReaderWriter<ringlane::v1::RoundResult, ringlane::v1::RoundPlan>*
                          stream) override;
  grpc::Status ExportKvBlocks(grpc::ServerContext* ctx,
                              const ringlane::v1::ExportKvBlocksRequest* req,
                              grpc::ServerWriter<ringlane::v1::KvBlockChunk>* writer) override;
  grpc::Status ImportKvBlocks(grpc::ServerContext* ctx,
                              grpc::ServerReader<ringlane::v1::KvBlockChunk>* reader,
                              ringlane::v1::ImportKvBlocksResponse* resp) override;
  grpc::Status RestoreKvBlocks(grpc::ServerContext* ctx,
                               const ringlane::v1::RestoreKvBlocksRequest* req,
                               ringlane::v1::RestoreKvBlocksResponse* resp) override;

  // Refuses new Rounds streams and ends the open one after its plan in
  // progress (drain on SIGTERM).
  void Drain() { draining_ = true; }

 private:
  // `with_state`: the entry of a block with its state checkpoint.
  ringlane::v1::BlockKey KeyFor(const std::string& prefix_hash, bool with_state = false) const;
  // Copies the plan's offload blocks out of the pool (ordered before its
  // round) and queues them for upload.
  void Offload(const ringlane::v1::RoundPlan& plan);

  GroupMember* const group_;
  const ModelConfig config_;
  const KvPoolSpec kv_pool_;
  const int64_t kv_block_bytes_;
  const std::vector<LayerCacheSpec> layer_caches_;
  const WorkerIdentity id_;
  WorkerMetrics* const metrics_;
  KvStoreLink* const kvstore_;
  const int64_t state_bytes_;  // one lane's recurrent state (0: no recurrent layers)
  uint64_t checkpoint_layout_fingerprint_ = 0;
  std::atomic<bool> stream_open_{false};
  std::atomic<bool> draining_{false};
};

// The DType enum of the contracts for the engine's.
ringlane::v1::DType ToProto(DType t);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_WORKER_SERVICE_H_
