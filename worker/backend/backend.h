// The compute backend of a worker rank: it owns the KV pool's memory and runs
// rounds over the model. The CPU backend is always built; a CUDA backend comes
// where the toolkit is present. Like leveldb's Env, each call documents its
// failures; none throws.
//
// A backend is created by the group's formation thread and then driven only by
// the worker's step loop thread (worker/server/step_loop.h), which runs rounds
// and KV block moves in one order; its methods are not thread-safe. Backends
// are made through worker/backend/factory.h.
#ifndef RINGLANE_WORKER_BACKEND_BACKEND_H_
#define RINGLANE_WORKER_BACKEND_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/round.h"

namespace ringlane::worker {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  // The cache each layer keeps on this rank (the model graph's), one entry
  // per layer; AllocateKvPool sizes the pool for them.
  virtual std::vector<LayerCacheSpec> layer_caches() const = 0;

  // (Re)allocates the KV pool; previous contents are gone. InvalidArgument for
  // a bad spec, ResourceExhausted when memory runs out.
  virtual absl::Status AllocateKvPool(const KvPoolSpec& spec) = 0;
  virtual const KvPoolSpec& kv_pool() const = 0;
  // Positions one block id covers in a round's block table: the pool's
  // block_size, times the group's size under decode context parallel (each
  // rank's block holds every world-th of those positions).
  virtual int block_tokens() const { return kv_pool().block_size; }
  virtual int context_parallel() const { return 1; }

  // Runs one round: the block copies in order, then one forward pass that
  // writes every new token's K/V into its slot and returns the logits asked
  // for. InvalidArgument (and nothing written) when a token, position or
  // block id is out of range, the blocks do not cover the positions, two
  // sequences would write the same slot, or a block is copied onto itself;
  // FailedPrecondition before AllocateKvPool.
  virtual absl::StatusOr<RoundOutput> Step(const RoundInput& round) = 0;

  // Copies one KV block out of / into the pool (for offload and prefix reuse
  // across ranks). InvalidArgument for a bad id or a payload of the wrong size.
  virtual int64_t kv_block_bytes() const = 0;
  virtual absl::Status ExportKvBlock(int32_t block, std::vector<uint8_t>* out) const = 0;
  virtual absl::Status ImportKvBlock(int32_t block, absl::Span<const uint8_t> data) = 0;

  // Models with recurrent layers: a copy of state slot `slot` (every such
  // layer's state of one lane) and back, to rewind a lane past rejected
  // drafts. InvalidArgument for a bad slot or size; Unimplemented where the
  // backend keeps no state.
  virtual absl::Status SaveStateSlot(int32_t slot, std::vector<float>* out) const {
    return absl::UnimplementedError("this backend keeps no recurrent state");
  }
  virtual absl::Status RestoreStateSlot(int32_t slot, absl::Span<const float> data) {
    return absl::UnimplementedError("this backend keeps no recurrent state");
  }

  // Models with recurrent layers: state checkpoint `checkpoint` as bytes, for
  // a kvstore entry with the block that ends at `position`, and back (the
  // checkpoint then holds the state of `position` tokens). Export fails with
  // FailedPrecondition when the checkpoint does not hold the state of
  // exactly `position` tokens (handed on, or never saved), so a wrong state
  // is never stored; InvalidArgument for a bad checkpoint, position or size.
  virtual absl::Status ExportStateCheckpoint(int32_t checkpoint, int64_t position,
                                             std::vector<uint8_t>* out) const {
    return absl::UnimplementedError("this backend keeps no recurrent state");
  }
  virtual absl::Status ImportStateCheckpoint(int32_t checkpoint, int64_t position,
                                             absl::Span<const uint8_t> data) {
    return absl::UnimplementedError("this backend keeps no recurrent state");
  }
};

class Communicator;

struct CpuBackendOptions {
  // The tensor-parallel group this rank belongs to (not owned; must outlive
  // the backend); null for a model that is not sharded. The model passed to
  // CreateCpuBackend must be this rank's shard (ShardModel).
  Communicator* comm = nullptr;
  int threads = 1;
  // Use the portable scalar kernels even where vector ones are available (tests).
  bool force_scalar = false;
  // Use AVX-512 kernels where the CPU has them; false stops at AVX2 (same
  // results, for side-by-side measurements).
  bool allow_avx512 = true;
  // How long idle pool threads spin before blocking.
  int spin_us = 50;
  // Decode context parallel (latent-cache models sharded over `comm`): each
  // rank keeps every world-th position of the latent cache, so the group
  // holds world times the context; attention is combined across the ranks.
  bool context_parallel = false;
};

// Unimplemented when no graph runs the model's family (graph/factory.h).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::shared_ptr<const ModelWeights> model,
                                                          const CpuBackendOptions& options);

// The bytes of one KV block of the CPU backend for this shard and pool spec
// (spec.num_blocks is not looked at), without allocating a pool.
// InvalidArgument as AllocateKvPool; Unimplemented as CreateCpuBackend.
absl::StatusOr<int64_t> CpuKvBlockBytes(const ModelConfig& config, const TpShard& shard,
                                        const KvPoolSpec& spec);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_BACKEND_BACKEND_H_
