// Tensor-parallel sharding at load time (Megatron): column-parallel Q/K/V and
// gate/up (a rank keeps its rows), row-parallel output and down projections (a
// rank keeps its columns), vocabulary-parallel embedding and LM head. A shard
// is a set of views into the full model's mapping: a rank touches only its
// own pages.
#ifndef RINGLANE_WORKER_MODEL_SHARD_H_
#define RINGLANE_WORKER_MODEL_SHARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace ringlane::worker {

struct ShardOptions {
  // MoE models: each rank holds n_routed / world whole experts (expert
  // parallel) instead of every expert's slice of columns (tensor parallel).
  // Attention, shared experts and dense layers stay tensor-parallel.
  bool expert_parallel = false;
};

// The part of `full` that rank `rank` of `world` holds. InvalidArgument when
// the model cannot be split that way (heads, KV heads, vocabulary or, expert
// parallel, routed experts not divisible, or more ranks than heads).
absl::StatusOr<std::shared_ptr<const ModelWeights>> ShardModel(
    std::shared_ptr<const ModelWeights> full, int rank, int world,
    const ShardOptions& options = {});

// The first `layers` layers of the unsharded `full`, with its embedding,
// final norm and head: a self-drafter for speculative decoding that views
// the model's weights (no copy). InvalidArgument unless 1 <= layers <
// full->config.layers, or for a shard.
absl::StatusOr<std::shared_ptr<const ModelWeights>> FirstLayers(
    std::shared_ptr<const ModelWeights> full, int layers);

// The MTP drafter of the unsharded `full` (DeepSeek-V3 / GLM-5 checkpoints
// with num_nextn_predict_layers): a one-layer model viewing its MTP layer,
// with shared_head's norm and head as final norm and lm_head and
// config.mtp_drafter set. InvalidArgument when it has no MTP layer, or for a
// shard.
absl::StatusOr<std::shared_ptr<const ModelWeights>> MtpDrafter(
    std::shared_ptr<const ModelWeights> full);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_SHARD_H_
