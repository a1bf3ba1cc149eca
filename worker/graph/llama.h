// The forward pass of the Llama family (Llama 1-3, TinyLlama, Mistral without
// a sliding window, llama2.c checkpoints), written once over the ops of
// backend/ops.h so that every backend runs the same graph:
//
//   x = embed(tokens)                         (vocabulary-parallel, summed)
//   per layer: x += o(attend(rope(q, k), v))  (attn_norm before, all-reduce after)
//              x += down(silu(gate) * up)     (ffn_norm before, all-reduce after)
//   logits = lm_head(final_norm(x)) for the rows asked for (all-gathered)
//
// Tensor-parallel in the Megatron layout of TpShard: the rank's query/KV
// heads and MLP columns, summed over the group after wo and w_down.
//
// Made by graph/factory.h for model_type llama, mistral and qwen2.
#ifndef RINGLANE_WORKER_GRAPH_LLAMA_H_
#define RINGLANE_WORKER_GRAPH_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/ops.h"
#include "worker/graph/graph.h"
#include "worker/graph/round_index.h"
#include "worker/model/model.h"
#include "worker/round.h"

namespace ringlane::worker {

class LlamaGraph final : public ModelGraph {
 public:
  // `model` is this rank's shard (the whole model when not sharded).
  explicit LlamaGraph(std::shared_ptr<const ModelWeights> model);

  // The cache each layer keeps on a rank of `shard`: paged K/V of the rank's
  // KV heads, the same in every layer.
  static std::vector<LayerCacheSpec> LayerCaches(const ModelConfig& config, const TpShard& shard);

  std::string family() const override { return "llama"; }
  std::vector<LayerCacheSpec> LayerCaches() const override { return LayerCaches(cfg_, shard_); }
  absl::StatusOr<RoundOutput> Forward(const RoundInput& round, ComputeOps* ops) override;

 private:
  const std::shared_ptr<const ModelWeights> model_;
  const ModelConfig& cfg_;
  const TpShard& shard_;
  const std::vector<float> inv_freq_;

  RoundIndex index_;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_GRAPH_LLAMA_H_
