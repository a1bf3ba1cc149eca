// Writes synthetic Llama- and DeepSeek-shaped checkpoints in the Hugging Face layout
// (config.json + safetensors), for tests and benchmarks of any model size.
// Weights are a pure function of (seed, tensor name, element index), so models
// written with the same seed in different dtypes hold the same underlying
// values and can be compared against each other. Writing streams tensor data
// in row blocks (memory stays bounded by a few blocks per thread) and uses all
// cores; WriteSyntheticModel blocks its caller until the directory is complete.
#ifndef RINGLANE_WORKER_MODEL_SYNTHETIC_H_
#define RINGLANE_WORKER_MODEL_SYNTHETIC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/dtype.h"

namespace ringlane::worker {

struct SyntheticModelOptions {
  std::string out_dir;
  int hidden = 64;
  int intermediate = 172;
  int layers = 2;
  int heads = 8;
  int kv_heads = 4;
  int head_dim = 0;  // 0: hidden / heads (and config.json omits it)
  int vocab = 512;
  int max_position = 512;
  bool tie_embeddings = false;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  // Dtype of the linear layers. With FP8 (128x128 block scales) the embedding
  // is stored in BF16, as DeepSeek's checkpoints do; otherwise everything
  // except the norms uses this dtype. Norms are F32.
  DType dtype = DType::kF32;
  uint64_t seed = 1;
  // > 1: model-00001-of-0000N.safetensors ... plus model.safetensors.index.json.
  int shards = 1;

  // "llama", or one of the DeepSeek family's model_types (deepseek_v3,
  // deepseek_v32, glm_moe_dsa) in transformers' tensor names: then the fields
  // below shape it, kv_heads and head_dim are ignored, and `intermediate` is
  // the dense layers' MLP. The router and norms are F32, the correction bias
  // small and positive.
  std::string family = "llama";
  int q_lora_rank = 32;  // 0: q_proj instead of q_a_proj / q_b_proj
  int kv_lora_rank = 32;
  int qk_nope_head_dim = 16;
  int qk_rope_head_dim = 8;
  int v_head_dim = 16;
  int n_routed_experts = 8;  // 0: every layer dense
  int n_shared_experts = 1;
  int experts_per_token = 2;
  int moe_intermediate = 32;
  int n_group = 2;
  int topk_group = 1;
  float routed_scaling_factor = 2.5f;
  int first_k_dense = 1;
  // The DSA indexer (deepseek_v32, glm_moe_dsa).
  int index_topk = 16;
  int index_n_heads = 4;
  int index_head_dim = 16;
  // GLM-5.2's indexer sharing: one F (full) or S (shared) per layer, written
  // as config.json's indexer_types; shared layers get no indexer tensors.
  // Empty: every layer full, and no key written.
  std::string indexer_types;
  // > 1: YaRN RoPE scaling with original_max_position_embeddings =
  // max_position / yarn_factor and mscale = mscale_all_dim = 1.
  float yarn_factor = 0.0f;
  // DeepSeek family only: 1 adds one multi-token-prediction layer as the
  // published checkpoints store it, under model.layers.{layers}. (enorm, hnorm,
  // eh_proj, a full decoder layer with its own indexer, shared_head; no
  // embed_tokens, which is the main model's), and writes
  // num_nextn_predict_layers: 1. num_hidden_layers stays `layers`.
  int mtp_layers = 0;
  // Llama family, > 0: layers from this index on have zero o_proj and
  // down_proj, so the model computes exactly what its first silent_from
  // layers compute, at the cost of all of them: a target whose
  // --draft_layers=silent_from self-drafter always agrees, for measuring
  // speculative decoding's machinery with a perfect, cheap drafter.
  int silent_from = 0;
  // Llama family: a model that copies. Layers 0 and 1 are a hand-built
  // induction circuit (layer 0's heads write the previous two tokens' codes
  // into the residual stream; layer 1's head finds the earlier position whose
  // two predecessors are the current and previous tokens and copies the token
  // there), every later layer is silent, and the output layer reads the copied
  // token's code. So the greedy continuation of a text that repeats the start
  // of an earlier passage repeats that passage, at the memory cost of every
  // layer: the copy/rewrite workload of speculative decoding on a
  // memory-bound model (no trained checkpoint of that size is available
  // here). Needs head_dim 64, at least 2 query heads per KV head,
  // vocab + 3 * kv_heads * 64 < hidden and rope_theta of at least 1e15 (the
  // circuit matches content on the slow rotary pairs); a text without such a
  // repeat gets an arbitrary but deterministic continuation.
  bool copier = false;
  // glm5_next only: one L (Kimi Delta Attention) or F (MLA) per layer, the
  // linear layers' heads, head size and convolution taps, and the gate's
  // lower bound (0: the softplus gate, no linear_lower_bound key).
  std::string layer_types;
  int linear_heads = 4;
  int linear_head_dim = 16;
  int linear_conv_kernel = 4;
  float linear_lower_bound = 0.0f;
  // glm5_next: > 0 writes swiglu_limit (the MoE experts' clamped SwiGLU).
  float swiglu_limit = 0.0f;
  // glm5_next: > 1 writes hc_mult, hc_sinkhorn_iters, hc_eps and the
  // hyper-connection tensors (HyperConfig).
  // glm5_next: > 1 writes index_kpool (the pooled indexer) and its tensors.
  int index_kpool = 1;
  int hc_mult = 1;
  int hc_sinkhorn_iters = 20;
  // Also DeepSeek-V4's model.hc_head_* (learned head weights); without,
  // GLM-5.3-Flash's layout (the head takes the streams' mean).
  bool hc_head = false;
};

// Named shapes: "tiny" (the defaults above), "1b1" (TinyLlama 1.1B's shape:
// hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads, vocab 32000,
// 2048 positions, FP8), and the DeepSeek family at the defaults' small sizes:
// "deepseek-tiny" (deepseek_v3) and "glm5-tiny" (glm_moe_dsa, BF16, 3 layers
// of which the first is dense), and "glm5-small" (GLM-5's attention widths in
// 4 layers of hidden 1024 with 16 experts, FP8, 131072 positions, for
// long-context benchmarks), "glm5-next-tiny" (glm5_next: 4 layers LLLF, KDA of
// 4 heads of 16 and NoPE MLA with the indexer, BF16) and "glm5-next-small"
// (glm5-small's widths, LLLF, KDA of 8 heads of 128). Other names are
// InvalidArgument.
absl::StatusOr<SyntheticModelOptions> SyntheticPreset(std::string_view name);

// Writes the model to o.out_dir (created if needed; files of the same name are
// replaced). `progress`, if set, is called on the calling thread with the
// fraction of tensor bytes written so far, ending with 1.0. Invalid options
// are InvalidArgument naming the option; I/O failures are Internal.
absl::Status WriteSyntheticModel(const SyntheticModelOptions& o,
                                 std::function<void(double fraction)> progress = {});

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_SYNTHETIC_H_
