// The model a worker serves: its architecture (ModelConfig) and views of its
// weights in their stored dtype (ModelWeights). Weights are read from
// memory-mapped files and never expanded whole; only the small norm vectors are
// copied to float. Immutable after loading, so any thread may read it.
#ifndef RINGLANE_WORKER_MODEL_MODEL_H_
#define RINGLANE_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dtype.h"

namespace ringlane::worker {

// How RoPE pairs the dimensions of a head: Hugging Face's rotate-half pairs
// (i, i + d/2); llama2.c and Meta's original checkpoints pair (2i, 2i + 1).
enum class RopeLayout { kHalf, kInterleaved };

struct RopeScaling {
  // "" (none), "linear", "llama3" or "yarn".
  std::string type;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
  // YaRN (DeepSeek-V3's long-context RoPE): the ramp between the rotations
  // beta_fast and beta_slow, and the mscale terms of its attention scale.
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
};

// Multi-head latent attention (DeepSeek-V2/V3, GLM-5): queries through an
// optional low-rank projection, keys and values from one compressed latent of
// kv_lora_rank values per token plus a shared RoPE key of qk_rope_head_dim.
// The cache keeps only that latent and the rope key (absorbed attention).
struct MlaConfig {
  int q_lora_rank = 0;  // 0: the checkpoint has q_proj instead of q_a/q_b
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

// Routed mixture of experts as DeepSeek-V3 and GLM-5 run it: a router over
// n_routed experts (sigmoid scores, a correction bias used only for the choice,
// group-limited top-k) plus always-on shared experts; some layers stay dense.
struct MoeConfig {
  int n_routed = 0;  // 0: no MoE layers
  int n_shared = 0;
  int experts_per_token = 0;
  int expert_intermediate = 0;  // moe_intermediate_size
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling = 1.0f;
  bool norm_topk_prob = true;
  bool sigmoid_scoring = true;  // false: softmax
  bool correction_bias = true;  // topk_method noaux_tc
  // glm5_next's clamped SwiGLU in the MoE layers' experts (routed and
  // shared): silu(min(gate, limit)) * clamp(up, -limit, limit). 0: none.
  float swiglu_limit = 0.0f;
  std::vector<bool> sparse_layer;  // per layer: MoE (true) or the dense MLP
};

// The DeepSeek-V3.2 lightning indexer (DSA) that picks index_topk positions
// per query beyond the dense window.
struct IndexerConfig {
  int topk = 0;  // 0: no indexer (dense attention everywhere)
  int heads = 0;
  int head_dim = 0;
  bool rope_interleave = false;
  // Per layer (GLM-5.2's indexer sharing): true where the layer computes its
  // own selection, false where it reuses the last full layer's and has no
  // indexer weights. Empty: every layer is full.
  std::vector<bool> full_layer;
  // A position with at most this many keys (itself included) attends to all
  // of them; beyond, to the topk the indexer picks. Not a checkpoint key: the
  // serving side's choice (the worker's --dsa_dense_window).
  int dense_window = 2051;
  // GLM-5.3-Flash's pooled indexer (index_kpool P > 1): beyond the dense
  // window a query scores pools of P consecutive positions instead of single
  // ones. A pool's key is, per dimension, the softmax-weighted sum of its
  // positions' keys, the weights from a gate projection of each position's
  // input plus a learned per-slot offset (index_kpool_compress_gate, _ape).
  // The query takes the topk / P best complete pools, all their positions,
  // and always the positions past its last complete pool (the tail).
  int kpool = 1;

  bool FullLayer(int layer) const { return full_layer.empty() || full_layer[layer]; }
  bool Pooled() const { return kpool > 1; }
  // Positions a query beyond the dense window attends to at most.
  int SelectionWidth() const { return topk + (Pooled() ? kpool - 1 : 0); }
  // Floats of the indexer's part of a cached latent row: the key, and with
  // pools each position's gate scores too.
  int CachedDim() const { return topk > 0 ? head_dim * (Pooled() ? 2 : 1) : 0; }
};

// Linear attention (GLM-5.3-Flash's Kimi Delta Attention, glm5_next): the
// layers it marks keep a fixed-size recurrent state per sequence instead of
// KV. Per layer, q, k and v are `heads` heads of `head_dim`, each through a
// causal depthwise convolution of `conv_kernel` taps and SiLU; the state of a
// head is a head_dim x head_dim matrix updated by the gated delta rule with a
// per-channel decay exp(g), where g = -exp(A_log) * softplus(raw + dt_bias),
// or lower_bound * sigmoid(exp(A_log) * (raw + dt_bias)) when the config sets
// linear_lower_bound.
struct LinearAttentionConfig {
  int heads = 0;  // 0: no linear-attention layers
  int head_dim = 0;
  int conv_kernel = 4;
  bool has_lower_bound = false;
  float lower_bound = 0.0f;
  std::vector<bool> linear_layer;  // per layer: KDA (true) or attention
  // The serving side's choice, not the checkpoint's (the worker's
  // --kda_chunk): prefill rows in whole chunks of this many positions at
  // absolute multiples of it run in the chunked form (SeqStep::
  // linear_chunked_until); 0: every row through the recurrence.
  int chunk = 0;

  bool Linear(int layer) const {
    return layer < static_cast<int>(linear_layer.size()) && linear_layer[layer];
  }
  // Floats of one sequence's state in one layer: the convolutions' last
  // conv_kernel - 1 inputs of q, k and v, then each head's matrix.
  int64_t StateFloats() const {
    const int64_t c = int64_t{heads} * head_dim;
    return 3 * c * (conv_kernel - 1) + c * head_dim;
  }
};

// Manifold-constrained hyper-connections (mHC; GLM-5.3-Flash, DeepSeek-V4):
// the residual stream is `mult` streams of the hidden size. Before each
// sub-block (mixer, feed-forward part) the streams' RMS-normed concatenation
// is projected to `(2 + mult) * mult` mixes: weights that sum the streams
// into the sub-block's input, weights for its output per stream, and a
// stream-mixing matrix made doubly stochastic by `sinkhorn_iters` Sinkhorn
// normalisations; the head sums the streams by a last projection.
struct HyperConfig {
  int mult = 1;  // hc_mult; 1: a plain residual (no hc tensors)
  int sinkhorn_iters = 20;
  float eps = 1e-6f;
  bool enabled() const { return mult > 1; }
  int mix_dim() const { return (2 + mult) * mult; }
};

struct ModelConfig {
  std::string model_type = "llama";
  int hidden = 0;        // model dimension
  int intermediate = 0;  // MLP hidden dimension
  int layers = 0;
  int heads = 0;     // query heads
  int kv_heads = 0;  // key/value heads (GQA: heads % kv_heads == 0)
  int head_dim = 0;
  // True when the checkpoint states head_dim itself; then hidden need not equal
  // heads * head_dim (otherwise it must, as the head size is derived from it).
  bool head_dim_explicit = false;
  int vocab = 0;
  int max_position = 0;  // context length the model was trained for
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::kHalf;
  bool tie_embeddings = false;
  int bos_id = 1;
  int eos_id = 2;
  // Weight dtype of the linear layers as stored (informational).
  DType weight_dtype = DType::kF32;
  // The DeepSeek family (model_type deepseek_v3, deepseek_v32, glm_moe_dsa):
  // latent attention instead of GQA (heads == kv_heads, head_dim is the RoPE
  // part), MoE layers, and the DSA indexer. Zero everywhere for other families.
  MlaConfig mla;
  MoeConfig moe;
  IndexerConfig indexer;
  // glm5_next: which layers are linear attention, and its shape.
  LinearAttentionConfig linear;
  HyperConfig hyper;  // glm5_next's hc_mult, hc_sinkhorn_iters, hc_eps
  // num_nextn_predict_layers: MTP layers the checkpoint carries after its
  // layers (the first is loaded, ModelWeights::mtp), and whether that layer's
  // feed-forward part is MoE.
  int mtp_layers = 0;
  bool mtp_sparse = false;
  // This model is an MTP drafter (MtpDrafter in shard.h): its one layer is
  // the MTP block, whose input is eh_proj([enorm(embed(token)),
  // hnorm(hidden)]) with SeqStep::hidden_in as the hidden state.
  bool mtp_drafter = false;
};

// True for the families whose attention is MLA.
inline bool IsMla(const ModelConfig& c) { return c.mla.kv_lora_rank > 0; }

// The model_types of the DeepSeek-V3 family (MLA, MoE, the DSA indexer).
inline bool IsDeepseekFamily(std::string_view model_type) {
  return model_type == "deepseek_v3" || model_type == "deepseek_v32" ||
         model_type == "glm_moe_dsa" || model_type == "glm5_next";
}

// Checks the invariants the forward pass relies on; the error names the field.
absl::Status ValidateConfig(const ModelConfig& c);

// A row-major matrix [rows, cols] in its stored dtype. Linear layers follow the
// PyTorch layout: rows are output features, cols are input features.
struct Matrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  // FP8 only: multipliers (DeepSeek's `weight_scale_inv`) for 128x128 blocks,
  // row-major [ceil(rows_total/128), scale_cols]. Element (r, c) dequantizes to
  // fp8(r, c) * scale[((row_offset + r) / 128) * scale_cols + (col_offset + c) / 128].
  const float* scale = nullptr;
  int64_t scale_cols = 0;
  // Position of this view inside the stored tensor (non-zero for TP shards).
  int64_t row_offset = 0;
  int64_t col_offset = 0;
  // Bytes between consecutive rows (== cols * DTypeSize(dtype) unless a column slice).
  int64_t row_stride_bytes = 0;
  // FP8 only, set by MakeResident (resident.h): each row's whole groups of 64
  // columns are stored interleaved, column g + 16p + i of a group at its byte
  // 4i + p (i < 16, p < 4): 32-bit lane i holds columns i, 16 + i, 32 + i
  // and 48 + i, so a vector kernel turns the group's 64 bytes into 4 x 16
  // floats in natural order with a few shifts and masks per 16 and no
  // conversion instruction. Columns past the last whole group are in order.
  // A column view of such a matrix starts and ends on whole groups.
  bool interleaved = false;
  // Interleaved FP8 only, set by MakeResident: rows in tiles of `row_tile`
  // (1 = none; 4, the decode kernel's tile) whose groups alternate: group g
  // of the tile's rows 0..row_tile-1, then group g + 1, and so on. The
  // kernel's four rows are then one sequential stream instead of four (one
  // stream per core is what the hardware prefetcher follows best). Tiled
  // rows hold whole groups only (cols % 64 == 0). `data` is the start of a
  // tile and `row_phase` the view's first row within it.
  int64_t row_tile = 1;
  int64_t row_phase = 0;

  const uint8_t* Row(int64_t r) const {
    const uint8_t* base = static_cast<const uint8_t*>(data);
    if (row_tile == 1) return base + r * row_stride_bytes;
    const int64_t q = row_phase + r;
    return base + (q / row_tile) * row_tile * row_stride_bytes + (q % row_tile) * 64;
  }
  // The byte of an interleaved group holding its column j (j < 64).
  static int64_t InterleavedByte(int64_t j) { return 4 * (j & 15) + (j >> 4); }
  // Where column c of a row is stored, in elements from Row(r).
  int64_t StoredColumn(int64_t c) const {
    if (!interleaved || c >= (cols & ~int64_t{63})) return c;
    return (c & ~int64_t{63}) * row_tile + InterleavedByte(c & 63);
  }
  // Rows [r0, r0 + n) or columns [c0, c0 + n) of this view, as a view of
  // the same memory (block scales still index the whole stored tensor).
  Matrix Rows(int64_t r0, int64_t n) const {
    // Rows in order are tiles of one row: then this is Row(r0) at phase 0.
    Matrix v = *this;
    const int64_t q = row_phase + r0;
    v.data = static_cast<const uint8_t*>(data) + (q / row_tile) * row_tile * row_stride_bytes;
    v.row_phase = q % row_tile;
    v.rows = n;
    v.row_offset = row_offset + r0;
    return v;
  }
  Matrix Cols(int64_t c0, int64_t n) const {
    Matrix v = *this;
    v.data =
        static_cast<const uint8_t*>(data) + c0 * row_tile * static_cast<int64_t>(DTypeSize(dtype));
    v.cols = n;
    v.col_offset = col_offset + c0;
    return v;
  }
  // Block scale for element (r, c) of this view; 1 when there is none.
  float ScaleAt(int64_t r, int64_t c) const {
    if (scale == nullptr) return 1.0f;
    return scale[((row_offset + r) / kFp8BlockSize) * scale_cols +
                 (col_offset + c) / kFp8BlockSize];
  }
};

// Grouped-query attention with separate Q, K and V projections (Llama,
// Mistral). A TP shard holds its query heads' rows of wq and columns of wo.
struct DenseAttentionWeights {
  Matrix wq;  // [heads * head_dim, hidden]
  Matrix wk;  // [kv_heads * head_dim, hidden]
  Matrix wv;  // [kv_heads * head_dim, hidden]
  Matrix wo;  // [hidden, heads * head_dim]
};

// The gated MLP: w_down(silu(w_gate x) * w_up x).
struct GatedMlpWeights {
  Matrix w_gate;  // [intermediate, hidden]
  Matrix w_up;    // [intermediate, hidden]
  Matrix w_down;  // [hidden, intermediate]
};

// Latent attention (MlaConfig). A TP shard holds its heads' rows of wq_b and
// wkv_b and columns of wo; the down projections and norms are whole.
struct MlaWeights {
  Matrix wq_a;                   // [q_lora_rank, hidden]; absent without q_lora
  std::vector<float> q_a_norm;   // [q_lora_rank]
  Matrix wq_b;                   // [heads * (nope + rope), q_lora_rank or hidden]
  Matrix wkv_a;                  // [kv_lora_rank + rope, hidden]
  std::vector<float> kv_a_norm;  // [kv_lora_rank]
  Matrix wkv_b;                  // [heads * (nope + v), kv_lora_rank]
  Matrix wo;                     // [hidden, heads * v]
};

// The DSA indexer's weights (a full layer's; IndexerConfig).
struct IndexerWeights {
  Matrix wq_b;                     // [heads * head_dim, q_lora_rank]
  Matrix wk;                       // [head_dim, hidden]
  std::vector<float> k_norm;       // [head_dim] LayerNorm weight
  std::vector<float> k_norm_bias;  // [head_dim]
  Matrix weights_proj;             // [heads, hidden]
  Matrix kpool_gate;               // [head_dim, hidden]; with index_kpool > 1
  std::vector<float> kpool_ape;    // [index_kpool][head_dim]; likewise
};

// A Kimi Delta Attention mixer (LinearAttentionConfig), in the names of
// Kimi Linear's checkpoints. A TP shard holds its heads' parts
// (TpShard::linear_heads).
struct KdaWeights {
  Matrix wq, wk, wv;                          // [heads * head_dim, hidden]
  std::vector<float> conv_q, conv_k, conv_v;  // [heads * head_dim][conv_kernel]
  std::vector<float> a_log;                   // [heads]
  std::vector<float> dt_bias;                 // [heads * head_dim]
  Matrix f_a;                                 // [head_dim, hidden]
  Matrix f_b;                                 // [heads * head_dim, head_dim]
  Matrix b;                                   // [heads, hidden]
  Matrix g_a;                                 // [head_dim, hidden]
  Matrix g_b;                                 // [heads * head_dim, head_dim]
  std::vector<float> o_norm;                  // [head_dim]
  Matrix wo;                                  // [hidden, heads * head_dim]
};

// A MoE feed-forward part. A TP shard holds every expert with its slice of
// the expert's intermediate columns (and of the shared experts').
struct MoeWeights {
  Matrix router;                         // [n_routed, hidden]
  std::vector<float> correction_bias;    // [n_routed]; empty without noaux_tc
  std::vector<GatedMlpWeights> experts;  // the shard's: TpShard::experts from expert0
  GatedMlpWeights shared;                // n_shared * expert_intermediate wide; absent when 0
};

// One decoder layer: a pre-norm before its token mixer and one before its
// feed-forward part, every family has those. The parts themselves are
// sub-structs named for their kind, so a family with other kinds (experts,
// latent attention, a recurrent mixer) adds its own beside these and its graph
// reads only the parts its layers have; the Llama graph reads `attn` and `mlp`.
// One hyper-connection (HyperConfig) in DeepSeek-V4's names: hc_*_fn,
// hc_*_base, hc_*_scale. Whole on every rank (a TP shard does not split it).
struct HyperWeights {
  Matrix fn;                 // [mix_dim, mult * hidden] (the head's: [mult, ...])
  std::vector<float> base;   // [mix_dim] (the head's: [mult])
  std::vector<float> scale;  // [3]: pre, post, comb (the head's: [1])
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> ffn_norm;   // [hidden]
  DenseAttentionWeights attn;
  GatedMlpWeights mlp;  // the dense MLP (also a MoE family's dense layers)
  MlaWeights mla;
  IndexerWeights indexer;
  MoeWeights moe;
  KdaWeights kda;                // a linear-attention layer's mixer (LinearAttentionConfig)
  HyperWeights hc_attn, hc_ffn;  // around the mixer and the feed-forward part (HyperConfig)
  bool sparse = false;           // the feed-forward part is `moe`, not `mlp`
};

// What a layer keeps for each sequence between rounds. The values are those of
// v1::CacheKind (proto/ringlane/v1/common.proto), which a worker advertises
// per layer. A kRecurrentState layer has no rows in the KV pool: its state
// lives in a slot per sequence (SeqStep::state_slot).
enum class CacheKind {
  kPagedKv = 1,         // K and V of every token, in the paged blocks
  kLatentKv = 2,        // one latent vector per token, in the paged blocks
  kRecurrentState = 3,  // a fixed-size state per sequence
};

// The cache one layer of this rank keeps.
struct LayerCacheSpec {
  CacheKind kind = CacheKind::kPagedKv;
  // kPagedKv: this rank's KV heads and their size, per token.
  // kLatentKv: one "head" of latent_dim + rope_dim values per token.
  int kv_heads = 0;
  int head_dim = 0;
  // kLatentKv: the compressed latent and the RoPE key kept beside it, and
  // the DSA indexer's key (0 without one), all in one row per token.
  int latent_dim = 0;
  int rope_dim = 0;
  int index_dim = 0;
  // kRecurrentState: floats of one sequence's state in this layer
  // (LinearAttentionConfig::StateFloats).
  int64_t state_floats = 0;
};

// Bytes of one lane's recurrent state over every layer (a state slot, and a
// checkpoint): 0 for a model without recurrent layers.
inline int64_t StateBytesPerSlot(const std::vector<LayerCacheSpec>& caches) {
  int64_t floats = 0;
  for (const LayerCacheSpec& c : caches) {
    if (c.kind == CacheKind::kRecurrentState) floats += c.state_floats;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

// Keeps a file mapped for as long as any ModelWeights points into it.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Which part of the model a tensor-parallel rank holds (Megatron layout):
// query heads [head0, head0 + heads), KV heads [kv_head0, kv_head0 + kv_heads)
// (replicated when the model has fewer KV heads than ranks), MLP columns
// [inter0, inter0 + intermediate), vocabulary rows [vocab0, vocab0 + vocab).
// A whole model is the shard {0, 1, ...everything}.
struct TpShard {
  int rank = 0;
  int world = 1;
  int head0 = 0, heads = 0;
  int kv_head0 = 0, kv_heads = 0;
  int inter0 = 0, intermediate = 0;
  int vocab0 = 0, vocab = 0;
  // MoE: each routed expert's intermediate columns [expert_inter0, +expert_intermediate)
  // and the shared experts' [shared_inter0, +shared_intermediate).
  int expert_inter0 = 0, expert_intermediate = 0;
  int shared_inter0 = 0, shared_intermediate = 0;
  // The routed experts this rank holds, [expert0, expert0 + experts):
  // all of them under tensor parallelism, n_routed / world under expert
  // parallelism (each then whole: expert_intermediate is the full width).
  int expert0 = 0, experts = 0;
  // Linear-attention (KDA) heads [linear_head0, linear_head0 + linear_heads):
  // their rows of q/k/v, f_b, g_b and b_proj, their convolution channels,
  // decay parameters and columns of o_proj (f_a and g_a are whole).
  int linear_head0 = 0, linear_heads = 0;
};

// DeepSeek-V3 / GLM-5's multi-token prediction layer
// (model.layers.{num_hidden_layers}.*): a decoder layer of the family fed
// eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)]), where h_i is the model's
// final-normed hidden state at position i, predicting t_{i+2} through
// head(head_norm(.)).
struct MtpWeights {
  LayerWeights layer;
  std::vector<float> enorm, hnorm;  // [hidden]
  Matrix eh_proj;                   // [hidden, 2 * hidden]
  std::vector<float> head_norm;     // shared_head.norm [hidden]
  Matrix head;                      // shared_head.head [vocab, hidden], or lm_head
};

struct ModelWeights {
  ModelConfig config;  // the whole model's shape, also in a shard
  TpShard shard;       // what the matrices below hold
  Matrix embed;        // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  Matrix lm_head;                 // [vocab, hidden]; the embedding when tied
  // The streams' weighted sum before final_norm (HyperConfig); absent (fn
  // without data) in GLM-5.3-Flash's checkpoints: their mean.
  HyperWeights hc_head;
  // Where the weights came from, for logs and errors.
  std::string source;
  // Owners of the memory the matrices point into.
  std::vector<std::shared_ptr<MappedFile>> files;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;
  // The region MakeResident (resident.h) copied the matrices into; null else.
  std::shared_ptr<const void> resident;
  // A shard keeps the whole model it views alive.
  std::shared_ptr<const ModelWeights> keep_alive;
  // The first MTP layer (config.mtp_layers > 0) of a whole model; null in a
  // shard and without one. An MTP drafter view points at it too.
  std::shared_ptr<const MtpWeights> mtp;
};

// Loads a Hugging Face-style directory (config.json plus model.safetensors or
// sharded *.safetensors with model.safetensors.index.json) or a llama2.c
// checkpoint file (*.bin). Errors name the file and the problem.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_MODEL_H_
