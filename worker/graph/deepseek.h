// The forward pass of the DeepSeek-V3 family (deepseek_v3, deepseek_v32 and
// GLM-5's glm_moe_dsa), written over the ops of backend/ops.h:
//
//   x = embed(tokens)
//   per layer: x += o(MLA(attn_norm(x)))            (all-reduce after o)
//              x += MoE or dense MLP(ffn_norm(x))   (all-reduce after down)
//   logits = lm_head(final_norm(x)) for the rows asked for
//
// Attention is multi-head latent attention in its absorbed form for every
// row, prefill and decode alike: the cache holds each token's normed latent
// (kv_lora_rank values) and its RoPE key, never per-head K/V; a query head's
// no-RoPE part is mapped into the latent space through its slice of kv_b
// (W_UK), attends over the latents, and the result is mapped back to the
// head's values through the other slice (W_UV). Each row is computed the same
// way whatever shares its round, so the graph is batch-invariant.
//
// MoE: the router's scores pick experts per token (MoeRoute); each expert runs
// on the rows that chose it and the outputs are combined per token in the
// token's own order of choice, then the shared experts are added; so a
// token's result does not depend on which other tokens share the round.
//
// Tensor-parallel: the rank's heads (rows of q_b and kv_b, columns of o), the
// rank's columns of every expert, of the shared experts and of the dense MLP;
// the latent is computed whole on every rank (replicated cache).
//
// DSA (deepseek_v32, glm_moe_dsa): the lightning indexer's key is cached in
// the latent row; a position past the dense window attends to the index_topk
// positions its indexer scores highest (IndexerSelect), a GLM-5.2 shared layer
// to those of the last full layer. The selection is a function of the row's
// own query and the cached keys, so it is batch-invariant too.
//
// glm5_next (GLM-5.3-Flash): the layers LinearAttentionConfig marks are Kimi
// Delta Attention (KdaMix) over a per-sequence recurrent state instead of
// MLA; the others are MLA as above, and the KV pool holds only those.
//
// MTP: the same graph runs an MTP drafter (ModelConfig::mtp_drafter, made by
// MtpDrafter in model/shard.h): its input rows are
// eh_proj([enorm(embed(token)), hnorm(hidden_in)]), the embedding zeroed at
// position 0 (as vLLM runs DeepSeek's MTP), then its one layer and head; with
// want_hidden a model returns its final-normed hidden states (what the MTP
// layer reads) and a drafter the layer's output (what its next step reads).
// Made by graph/factory.h.
#ifndef RINGLANE_WORKER_GRAPH_DEEPSEEK_H_
#define RINGLANE_WORKER_GRAPH_DEEPSEEK_H_

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

class DeepseekGraph final : public ModelGraph {
 public:
  // `model` is this rank's shard (the whole model when not sharded).
  explicit DeepseekGraph(std::shared_ptr<const ModelWeights> model);

  // The linear-attention shape on `shard`'s heads.
  static LinearAttentionConfig LocalLinear(const ModelConfig& config, const TpShard& shard);
  // One latent cache per layer: kv_lora_rank + qk_rope_head_dim values per token.
  static std::vector<LayerCacheSpec> LayerCaches(const ModelConfig& config, const TpShard& shard);

  std::string family() const override { return cfg_.model_type; }
  std::vector<LayerCacheSpec> LayerCaches() const override { return LayerCaches(cfg_, shard_); }
  absl::StatusOr<RoundOutput> Forward(const RoundInput& round, ComputeOps* ops) override;

 private:
  // Views into a layer's weights the graph uses every round, made once.
  struct LayerViews {
    Matrix kv_a_latent, kv_a_rope;  // rows of kv_a_proj_with_mqa
    std::vector<Matrix> uk, uv;     // per local head: W_UK and W_UV rows of kv_b
  };

  // Each writes its block's output ([rows][hidden], before the all-reduce)
  // into `out` from the normed input xb.
  // Errors: the group's collectives' (decode context parallel).
  absl::Status Attention(int model_layer, const float* xb, int rows, ComputeOps* ops, float* out);
  // glm5_next's Kimi Delta Attention (LinearAttentionConfig) of one layer.
  void LinearAttention(int layer, const float* xb, int rows, ComputeOps* ops, float* out);
  void Moe(const LayerWeights& w, const float* xb, int rows, ComputeOps* ops, float* out);
  // `limit` > 0: the clamped SwiGLU (MoeConfig::swiglu_limit).
  void GatedMlp(const GatedMlpWeights& m, int inter, const float* in, int rows, ComputeOps* ops,
                float* out, float limit = 0.0f);
  // An MTP drafter's input rows into x, which holds the embeddings.
  void MtpInput(const RoundInput& round, int rows, ComputeOps* ops, float* x);
  // Hyper-connections: x = the weighted sum of the streams that `w` (the
  // next sub-block's, or the head's) gives, and (not the head) the next
  // HyperPost's coefficients.
  void HyperPre(const HyperWeights& w, bool head, const float* streams, int rows, ComputeOps* ops,
                float* x, float* coeffs);
  // The round's hidden states (want_hidden) from x into out->hidden.
  void Hidden(const RoundInput& round, const float* x, int rows, ComputeOps* ops, RoundOutput* out);

  const std::shared_ptr<const ModelWeights> model_;
  const ModelConfig& cfg_;
  const TpShard& shard_;
  const std::vector<float> inv_freq_;   // of the rope part
  const float scale_;                   // the attention softmax scale
  const LinearAttentionConfig linear_;  // the KDA layers on this rank's heads
  std::vector<LayerViews> views_;       // per layer (empty for linear-attention layers)
  // Per layer: its index in the KV pool, which holds the attention layers
  // only (-1 for a linear-attention layer, whose state is in a slot).
  std::vector<int> kv_layer_;
  RoundIndex index_;
  // Per round, MoE routing: [rows][k] experts and weights, and each expert's
  // rows (token rows and slot rows t * k + s), rebuilt per layer.
  std::vector<int32_t> experts_;
  std::vector<float> weights_;
  std::vector<std::vector<int64_t>> expert_tokens_, expert_slots_;
  // Per round, the DSA selection of the last full layer: [rows][topk]
  // positions and each row's count (0: dense).
  std::vector<int32_t> selected_, selected_count_;
  std::vector<float> zeros_;    // [hidden], the masked embedding
  std::vector<float> hc_ones_;  // [hc_mult * hidden]: the streams' RMS norm has no weight
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_GRAPH_DEEPSEEK_H_
