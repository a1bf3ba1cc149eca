#include "worker/model/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace ringlane::worker {
namespace {

// Rows generated per work item; equal to the FP8 block so that one item owns
// whole scale blocks.
constexpr int64_t kRowBlock = kFp8BlockSize;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t TensorKey(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return Mix(Mix(seed) ^ h);
}

// Irwin-Hall with four 16-bit uniforms, scaled to unit variance: normal
// enough for weights, and a few times cheaper than Box-Muller, which matters
// for a billion elements.
inline float NormalIsh(uint64_t key, int64_t index) {
  uint64_t z = Mix(key + static_cast<uint64_t>(index));
  uint32_t s = static_cast<uint32_t>(z & 0xffff) + static_cast<uint32_t>((z >> 16) & 0xffff) +
               static_cast<uint32_t>((z >> 32) & 0xffff) + static_cast<uint32_t>(z >> 48);
  // (sum of 4 U(0,1)) - 2 has variance 1/3.
  float u = (static_cast<float>(s) + 2.0f) * (1.0f / 65536.0f) - 2.0f;
  return u * 1.7320508f;
}

enum class Kind { kEmbedding, kLinear, kNorm, kBias, kZero };

struct TensorPlan {
  std::string name;
  Kind kind;
  int64_t rows;  // 1 for vectors
  int64_t cols;
  std::vector<int64_t> shape;
  DType dtype;
  bool has_scale = false;  // FP8 with a `<name>_scale_inv` companion
  int shard = 0;
  int index = -1;        // in its shard's writer
  int scale_index = -1;  // likewise, for the scale tensor
  // Set: the element at (row, col) instead of the kind's random value.
  std::function<float(int64_t row, int64_t col)> fn;
};

float Value(Kind kind, uint64_t key, int64_t index, float linear_std) {
  float n = NormalIsh(key, index);
  switch (kind) {
    case Kind::kEmbedding:
      return n;
    case Kind::kLinear:
      return n * linear_std;
    case Kind::kNorm:
      return 1.0f + 0.1f * n;
    case Kind::kBias:
      // Positive, so a router's masked choices (which peers fill with 0 or
      // -inf) never outrank a biased score.
      return 0.05f * std::fabs(n);
    case Kind::kZero:
      return 0.0f;
  }
  return n;
}

// Generates rows [r0, r0 + n) of `t` and writes them (and their block scales
// into `scales`) through `w`.
absl::Status WriteRowBlock(const TensorPlan& t, uint64_t seed, int64_t r0, SafetensorsWriter* w,
                           std::vector<float>* scales, std::vector<float>* fbuf,
                           std::vector<uint8_t>* bbuf) {
  const int64_t n = std::min(kRowBlock, t.rows - r0);
  const int64_t cols = t.cols;
  const uint64_t key = TensorKey(seed, t.name);
  const float linear_std = 1.0f / std::sqrt(static_cast<float>(cols));
  fbuf->resize(n * cols);
  float* f = fbuf->data();
  if (t.fn) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < cols; ++c) f[r * cols + c] = t.fn(r0 + r, c);
    }
  } else {
    for (int64_t i = 0; i < n * cols; ++i) f[i] = Value(t.kind, key, r0 * cols + i, linear_std);
  }

  const size_t es = DTypeSize(t.dtype);
  bbuf->resize(n * cols * es);
  uint8_t* out = bbuf->data();
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out, f, n * cols * sizeof(float));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n * cols; ++i) {
        uint16_t v = FloatToBf16(f[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n * cols; ++i) {
        uint16_t v = FloatToF16(f[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      break;
    case DType::kFP8E4M3: {
      const int64_t scale_cols = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
      const int64_t block_row = r0 / kFp8BlockSize;
      for (int64_t cb = 0; cb < scale_cols; ++cb) {
        const int64_t c0 = cb * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
        float amax = 0.0f;
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(f[r * cols + c]));
        }
        const float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
        (*scales)[block_row * scale_cols + cb] = scale;
        const float inv = 1.0f / scale;
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            out[r * cols + c] = FloatToFp8E4M3(f[r * cols + c] * inv);
          }
        }
      }
      break;
    }
  }
  return w->WriteAt(t.index, static_cast<size_t>(r0 * cols * es),
                    absl::MakeConstSpan(out, n * cols * es));
}

// SyntheticModelOptions::copier: an induction circuit in two Llama layers.
// The residual stream holds, by dimension: [0, V) the token's one-hot,
// [V, V+K) the code of the token before, [V+K, V+2K) the code of the one
// before that, [V+2K, V+3K) the code of the copied token, and hidden-1 a
// constant that gives the position-only queries and keys something to read.
// A code is K = kv_heads * 64 random signs, each KV head carrying 64 of them.
//
// Layer 0: in each KV group, query head 0 attends to position p-1 and head 1
// to p-2 by rotary phase alone (the fast pairs 0..5 of a constant query and
// key, the query turned back by one or two positions), and their values are
// the token's code, written to the two "before" slots. Layer 1: query head 0
// of each group holds the current token's code on the first halves of the
// slow pairs 8..31 and the previous token's code on their second halves; the
// keys hold the "before" and "before that" codes of their position, so a key
// scores 48 where both match, 24 where one does, and about 0 +- 7 otherwise.
// With rope_theta >= 1e15 those pairs turn by at most 1e-4 rad per position,
// so the match barely depends on distance. The value is the token's code; the
// output layer reads the copied code against every token's. The margins were
// chosen with a float64 model of these weights quantized to FP8: the copied
// token wins by about 18 logits over 300 positions.
class CopierCircuit {
 public:
  static constexpr int kHeadDim = 64;

  CopierCircuit(const SyntheticModelOptions& o, int64_t hidden, int heads, int kv_heads, int vocab,
                double rope_theta)
      : H_(hidden), V_(vocab), G_(heads / kv_heads), K_(int64_t{kv_heads} * kHeadDim) {
    for (int i = 0; i < kHeadDim / 2; ++i) {
      inv_freq_[i] = std::pow(rope_theta, -2.0 * i / kHeadDim);
    }
    const uint64_t key = TensorKey(o.seed, "copier.codes");
    code_.resize(static_cast<size_t>(V_ * K_));
    for (int64_t i = 0; i < V_ * K_; ++i) code_[i] = (Mix(key + i) & 1) != 0 ? 1.0f : -1.0f;
    // RMSNorm's factor at each layer's input (norm weights are 1), for a
    // stream of one-hot + constant, then plus two codes, then three.
    n0_ = std::sqrt(static_cast<double>(H_) / 2.0);
    n1_ = std::sqrt(static_cast<double>(H_) / (2.0 + 2.0 * K_));
    nf_ = std::sqrt(static_cast<double>(H_) / (2.0 + 3.0 * K_));
  }

  float Embedding(int64_t t, int64_t c) const { return c == t || c == H_ - 1 ? 1.0f : 0.0f; }
  float Norm(int64_t, int64_t) const { return 1.0f; }

  // Layer 0: position heads.
  float Q0(int64_t r, int64_t c) const {
    const int64_t h = r / kHeadDim, i = r % kHeadDim, d = h % G_;
    if (c != H_ - 1 || d > 1) return 0.0f;
    const double back = static_cast<double>(d + 1);
    if (i < kPosPairs) return static_cast<float>(kPos * std::cos(back * inv_freq_[i]) / n0_);
    if (i >= kHalf && i < kHalf + kPosPairs) {
      return static_cast<float>(-kPos * std::sin(back * inv_freq_[i - kHalf]) / n0_);
    }
    return 0.0f;
  }
  float K0(int64_t r, int64_t c) const {
    return c == H_ - 1 && r % kHeadDim < kPosPairs ? static_cast<float>(kPos / n0_) : 0.0f;
  }
  float V0(int64_t r, int64_t c) const { return Value(r, c, n0_); }
  float O0(int64_t r, int64_t c) const {
    const int64_t h = c / kHeadDim, dd = c % kHeadDim, g = h / G_, d = h % G_;
    if (d == 0) return r == V_ + g * kHeadDim + dd ? 1.0f : 0.0f;
    if (d == 1) return r == V_ + K_ + g * kHeadDim + dd ? 1.0f : 0.0f;
    return 0.0f;
  }

  // Layer 1: the induction head.
  float Q1(int64_t r, int64_t c) const {
    const int64_t h = r / kHeadDim, i = r % kHeadDim, g = h / G_;
    if (h % G_ != 0) return 0.0f;
    if (i >= kContentFrom && i < kHalf) {  // the current token
      const int64_t e = i - kContentFrom;
      return c < V_ ? static_cast<float>(kContent * Code(c, g * kHeadDim + e) / n1_) : 0.0f;
    }
    if (i >= kHalf + kContentFrom) {  // the token before it
      const int64_t e = i - kHalf - kContentFrom;
      return c == V_ + g * kHeadDim + kHalf + e ? static_cast<float>(kContent / n1_) : 0.0f;
    }
    return 0.0f;
  }
  float K1(int64_t r, int64_t c) const {
    const int64_t g = r / kHeadDim, i = r % kHeadDim;
    if (i >= kContentFrom && i < kHalf) {
      return c == V_ + g * kHeadDim + (i - kContentFrom) ? static_cast<float>(kContent / n1_)
                                                         : 0.0f;
    }
    if (i >= kHalf + kContentFrom) {
      const int64_t e = i - kHalf - kContentFrom;
      return c == V_ + K_ + g * kHeadDim + kHalf + e ? static_cast<float>(kContent / n1_) : 0.0f;
    }
    return 0.0f;
  }
  float V1(int64_t r, int64_t c) const { return Value(r, c, n1_); }
  float O1(int64_t r, int64_t c) const {
    const int64_t h = c / kHeadDim, dd = c % kHeadDim, g = h / G_;
    return h % G_ == 0 && r == V_ + 2 * K_ + g * kHeadDim + dd ? 1.0f : 0.0f;
  }

  float Head(int64_t t, int64_t c) const {
    const int64_t o = c - (V_ + 2 * K_);
    return o >= 0 && o < K_ ? static_cast<float>(kHeadGain * Code(t, o) / nf_) : 0.0f;
  }

 private:
  static constexpr int kHalf = kHeadDim / 2;
  static constexpr int kPosPairs = 6;
  static constexpr int kContentFrom = 8;
  // Logits per unit: the position heads score 30 * (sum of 6 cosines) / 6
  // (the attention scale is 1/8), the induction head 30 at a full match.
  static constexpr double kPos = 6.324555320336759;     // sqrt(8 * 30 / 6)
  static constexpr double kContent = 2.23606797749979;  // sqrt(8 * 30 / 48)
  static constexpr double kHeadGain = 0.08;

  float Code(int64_t t, int64_t d) const { return code_[static_cast<size_t>(t * K_ + d)]; }
  float Value(int64_t r, int64_t c, double norm) const {
    return c < V_ ? static_cast<float>(Code(c, r) / norm) : 0.0f;
  }

  int64_t H_, V_, G_, K_;
  double inv_freq_[kHeadDim / 2];
  std::vector<float> code_;
  double n0_, n1_, nf_;
};

std::string TorchDType(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
    case DType::kFP8E4M3:
      return "bfloat16";
  }
  return "float32";
}

const char* ArchitectureOf(const std::string& family) {
  if (family == "deepseek_v32") return "DeepseekV32ForCausalLM";
  if (family == "glm_moe_dsa") return "GlmMoeDsaForCausalLM";
  if (family == "glm5_next") return "Glm5NextForCausalLM";
  return "DeepseekV3ForCausalLM";
}

// The family's keys as transformers' configuration classes name them.
void AddDeepseekConfig(const ModelConfig& c, const SyntheticModelOptions& o,
                       nlohmann::ordered_json* cfg) {
  nlohmann::ordered_json& j = *cfg;
  j["q_lora_rank"] = c.mla.q_lora_rank > 0 ? nlohmann::ordered_json(c.mla.q_lora_rank) : nullptr;
  j["kv_lora_rank"] = c.mla.kv_lora_rank;
  j["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
  j["v_head_dim"] = c.mla.v_head_dim;
  j["rope_interleave"] = true;
  if (c.moe.n_routed > 0) {
    j["n_routed_experts"] = c.moe.n_routed;
    j["n_shared_experts"] = c.moe.n_shared;
    j["num_experts_per_tok"] = c.moe.experts_per_token;
    j["moe_intermediate_size"] = c.moe.expert_intermediate;
    j["n_group"] = c.moe.n_group;
    j["topk_group"] = c.moe.topk_group;
    j["routed_scaling_factor"] = c.moe.routed_scaling;
    j["norm_topk_prob"] = true;
    j["scoring_func"] = "sigmoid";
    j["topk_method"] = "noaux_tc";
    if (o.family == "glm_moe_dsa" || o.family == "glm5_next") {
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (bool sparse : c.moe.sparse_layer) types.push_back(sparse ? "sparse" : "dense");
      j["mlp_layer_types"] = types;
    } else {
      j["first_k_dense_replace"] = o.first_k_dense;
      j["moe_layer_freq"] = 1;
    }
  }
  if (o.mtp_layers > 0) j["num_nextn_predict_layers"] = o.mtp_layers;
  if (o.family == "glm5_next") {
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (int l = 0; l < c.layers; ++l) {
      types.push_back(c.linear.Linear(l) ? "linear_attention" : "full_attention");
    }
    j["layer_types"] = types;
    j["linear_num_heads"] = c.linear.heads;
    j["linear_head_dim"] = c.linear.head_dim;
    j["linear_conv_kernel_dim"] = c.linear.conv_kernel;
    if (c.linear.has_lower_bound) j["linear_lower_bound"] = c.linear.lower_bound;
    if (c.moe.swiglu_limit > 0.0f) j["swiglu_limit"] = c.moe.swiglu_limit;
    if (c.indexer.Pooled()) {
      j["index_kpool"] = c.indexer.kpool;
      j["index_kpool_always_select_tail"] = true;
      j["index_kpool_compress"] = true;
    }
    if (c.hyper.enabled()) {
      j["hc_mult"] = c.hyper.mult;
      j["hc_sinkhorn_iters"] = c.hyper.sinkhorn_iters;
      j["hc_eps"] = c.hyper.eps;
    }
  }
  if (c.indexer.topk > 0) {
    j["index_topk"] = c.indexer.topk;
    j["index_n_heads"] = c.indexer.heads;
    j["index_head_dim"] = c.indexer.head_dim;
    j["indexer_rope_interleave"] = c.indexer.rope_interleave;
    if (!c.indexer.full_layer.empty()) {
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (bool f : c.indexer.full_layer) types.push_back(f ? "full" : "shared");
      j["indexer_types"] = types;
    }
  }
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("rename ", tmp, " to ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// Whether layer `l` has MoE; l == c.layers is the MTP layer. That one follows
// first_k_dense_replace as a main layer at its index would, but an
// mlp_layer_types list (glm_moe_dsa) names only the main layers, and GLM-5's
// MTP layer past them is sparse.
bool SparseLayer(const ModelConfig& c, const SyntheticModelOptions& o, int l) {
  if (c.moe.n_routed == 0) return false;
  if (l < c.layers) return c.moe.sparse_layer[l];
  return o.family == "glm_moe_dsa" || o.family == "glm5_next" || l >= o.first_k_dense;
}

// A glm5_next linear-attention layer's mixer in Kimi Linear's names.
template <typename AddMatrix, typename AddVector, typename AddShaped>
void AddKdaMixer(const ModelConfig& c, const std::string& a, DType dtype, AddMatrix& add_matrix,
                 AddVector& add_vector, AddShaped& add_shaped) {
  const LinearAttentionConfig& x = c.linear;
  const int64_t D = c.hidden, H = x.heads, HD = x.head_dim, C = H * HD, K = x.conv_kernel;
  add_matrix(a + "q_proj.weight", Kind::kLinear, C, D, dtype);
  add_matrix(a + "k_proj.weight", Kind::kLinear, C, D, dtype);
  add_matrix(a + "v_proj.weight", Kind::kLinear, C, D, dtype);
  for (const char* conv : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) {
    add_shaped(a + conv, Kind::kLinear, C, K, std::vector<int64_t>{C, 1, K});
  }
  // A_log near 1 (decay rates near e), as Kimi Linear initialises log U(1, 16).
  add_shaped(a + "A_log", Kind::kNorm, 1, H, std::vector<int64_t>{H});
  add_vector(a + "dt_bias", Kind::kBias, C);
  add_matrix(a + "f_a_proj.weight", Kind::kLinear, HD, D, dtype);
  add_matrix(a + "f_b_proj.weight", Kind::kLinear, C, HD, dtype);
  add_matrix(a + "b_proj.weight", Kind::kLinear, H, D, dtype);
  add_matrix(a + "g_a_proj.weight", Kind::kLinear, HD, D, dtype);
  add_matrix(a + "g_b_proj.weight", Kind::kLinear, C, HD, dtype);
  add_vector(a + "o_norm.weight", Kind::kNorm, HD);
  add_matrix(a + "o_proj.weight", Kind::kLinear, D, C, dtype);
}

// One layer of the DeepSeek family in transformers' names and order. The MTP
// layer (l == c.layers) always has its own indexer: there is no earlier layer
// of its stack to share one with.
template <typename AddMatrix, typename AddVector, typename AddShaped>
void AddDeepseekLayer(const ModelConfig& c, const SyntheticModelOptions& o, int l, DType dtype,
                      AddMatrix& add_matrix, AddVector& add_vector, AddShaped& add_shaped) {
  const std::string p = absl::StrCat("model.layers.", l, ".");
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden, heads = c.heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  add_vector(p + "input_layernorm.weight", Kind::kNorm, H);
  if (c.hyper.enabled() && l < c.layers) {
    // F32, as DeepSeek-V4 keeps them; mixes of unit scale (the streams are
    // RMS-normed), scales near 1 and small positive bases.
    for (const char* hc : {"hc_attn_", "hc_ffn_"}) {
      add_shaped(p + hc + "fn", Kind::kLinear, c.hyper.mix_dim(), c.hyper.mult * H,
                 std::vector<int64_t>{c.hyper.mix_dim(), c.hyper.mult * H});
      add_vector(p + hc + "base", Kind::kBias, c.hyper.mix_dim());
      add_vector(p + hc + "scale", Kind::kNorm, 3);
    }
  }
  const std::string a = p + "self_attn.";
  if (c.linear.Linear(l)) {
    AddKdaMixer(c, a, dtype, add_matrix, add_vector, add_shaped);
  } else if (m.q_lora_rank > 0) {
    add_matrix(a + "q_a_proj.weight", Kind::kLinear, m.q_lora_rank, H, dtype);
    add_vector(a + "q_a_layernorm.weight", Kind::kNorm, m.q_lora_rank);
    add_matrix(a + "q_b_proj.weight", Kind::kLinear, heads * qk, m.q_lora_rank, dtype);
  } else {
    add_matrix(a + "q_proj.weight", Kind::kLinear, heads * qk, H, dtype);
  }
  if (!c.linear.Linear(l)) {
    add_matrix(a + "kv_a_proj_with_mqa.weight", Kind::kLinear, m.kv_lora_rank + m.qk_rope_head_dim,
               H, dtype);
    add_vector(a + "kv_a_layernorm.weight", Kind::kNorm, m.kv_lora_rank);
    add_matrix(a + "kv_b_proj.weight", Kind::kLinear, heads * (m.qk_nope_head_dim + m.v_head_dim),
               m.kv_lora_rank, dtype);
    add_matrix(a + "o_proj.weight", Kind::kLinear, H, heads * m.v_head_dim, dtype);
  }
  if (c.indexer.topk > 0 && !c.linear.Linear(l) && (l >= c.layers || c.indexer.FullLayer(l))) {
    const IndexerConfig& x = c.indexer;
    add_matrix(a + "indexer.wq_b.weight", Kind::kLinear, int64_t{x.heads} * x.head_dim,
               m.q_lora_rank, dtype);
    add_matrix(a + "indexer.wk.weight", Kind::kLinear, x.head_dim, H, dtype);
    add_vector(a + "indexer.k_norm.weight", Kind::kNorm, x.head_dim);
    add_vector(a + "indexer.k_norm.bias", Kind::kBias, x.head_dim);
    // BF16 in the published FP8 checkpoints, as the router is.
    add_matrix(a + "indexer.weights_proj.weight", Kind::kLinear, x.heads, H,
               dtype == DType::kFP8E4M3 ? DType::kBF16 : dtype);
    if (x.Pooled()) {
      add_matrix(a + "indexer.index_kpool_compress_gate", Kind::kLinear, x.head_dim, H,
                 dtype == DType::kFP8E4M3 ? DType::kBF16 : dtype);
      add_shaped(a + "indexer.index_kpool_compress_ape", Kind::kLinear, x.kpool, x.head_dim,
                 std::vector<int64_t>{x.kpool, x.head_dim});
    }
  }
  add_vector(p + "post_attention_layernorm.weight", Kind::kNorm, H);
  auto mlp = [&](const std::string& q, int64_t inter) {
    add_matrix(q + "gate_proj.weight", Kind::kLinear, inter, H, dtype);
    add_matrix(q + "up_proj.weight", Kind::kLinear, inter, H, dtype);
    add_matrix(q + "down_proj.weight", Kind::kLinear, H, inter, dtype);
  };
  const MoeConfig& e = c.moe;
  if (!SparseLayer(c, o, l)) {
    mlp(p + "mlp.", c.intermediate);
    return;
  }
  add_matrix(p + "mlp.gate.weight", Kind::kLinear, e.n_routed, H, DType::kF32);
  add_vector(p + "mlp.gate.e_score_correction_bias", Kind::kBias, e.n_routed);
  for (int x = 0; x < e.n_routed; ++x) {
    mlp(absl::StrCat(p, "mlp.experts.", x, "."), e.expert_intermediate);
  }
  if (e.n_shared > 0) mlp(p + "mlp.shared_experts.", int64_t{e.n_shared} * e.expert_intermediate);
}

}  // namespace

absl::StatusOr<SyntheticModelOptions> SyntheticPreset(std::string_view name) {
  SyntheticModelOptions o;
  if (name == "tiny") return o;
  if (name == "deepseek-tiny" || name == "glm5-tiny") {
    o.family = name == "glm5-tiny" ? "glm_moe_dsa" : "deepseek_v3";
    o.hidden = 64;
    o.intermediate = 96;
    o.layers = name == "glm5-tiny" ? 3 : 2;
    o.heads = 4;
    o.kv_heads = 4;
    o.vocab = 512;
    o.max_position = 4096;
    o.dtype = name == "glm5-tiny" ? DType::kBF16 : DType::kF32;
    return o;
  }
  if (name == "glm5-small") {
    // GLM-5's attention widths (latent 512, rope 64, an indexer of 32 heads
    // of 128 picking 2048) in four layers a 2-core machine decodes at long
    // context: for benchmarks of the latent cache and DSA.
    o.family = "glm_moe_dsa";
    o.hidden = 1024;
    o.intermediate = 2048;
    o.layers = 4;
    o.heads = 16;
    o.kv_heads = 16;
    o.vocab = 512;
    o.max_position = 131072;
    o.dtype = DType::kFP8E4M3;
    o.q_lora_rank = 512;
    o.kv_lora_rank = 512;
    o.qk_nope_head_dim = 128;
    o.qk_rope_head_dim = 64;
    o.v_head_dim = 128;
    o.n_routed_experts = 16;
    o.experts_per_token = 4;
    o.moe_intermediate = 512;
    o.n_group = 4;
    o.topk_group = 2;
    o.index_topk = 2048;
    o.index_n_heads = 32;
    o.index_head_dim = 128;
    return o;
  }
  if (name == "1b1") {
    o.hidden = 2048;
    o.intermediate = 5632;
    o.layers = 22;
    o.heads = 32;
    o.kv_heads = 4;
    o.vocab = 32000;
    o.max_position = 2048;
    o.dtype = DType::kFP8E4M3;
    return o;
  }
  if (name == "glm5-next-small") {
    // glm5-small's widths with GLM-5.3-Flash's pattern: three KDA layers
    // (8 heads of 128) and one NoPE MLA layer with the indexer, for the
    // long-context benchmark against glm5-small.
    absl::StatusOr<SyntheticModelOptions> small = SyntheticPreset("glm5-small");
    if (!small.ok()) return small.status();
    o = *small;
    o.family = "glm5_next";
    o.qk_rope_head_dim = 0;
    o.layer_types = "LLLF";
    o.linear_heads = 8;
    o.linear_head_dim = 128;
    return o;
  }
  if (name == "glm5-next-tiny") {
    o.family = "glm5_next";
    o.hidden = 64;
    o.intermediate = 96;
    o.layers = 4;
    o.heads = 4;
    o.kv_heads = 4;
    o.vocab = 512;
    o.max_position = 4096;
    o.dtype = DType::kBF16;
    o.qk_rope_head_dim = 0;  // GLM-5.3-Flash's attention layers are NoPE
    o.layer_types = "LLLF";
    return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown synthetic model preset '", std::string(name),
                   "' (expected tiny, 1b1, deepseek-tiny, glm5-tiny, glm5-small, glm5-next-tiny or "
                   "glm5-next-small)"));
}

absl::Status WriteSyntheticModel(const SyntheticModelOptions& o,
                                 std::function<void(double fraction)> progress) {
  namespace fs = std::filesystem;
  if (o.out_dir.empty()) return absl::InvalidArgumentError("synthetic model: out_dir is empty");
  const bool deepseek = IsDeepseekFamily(o.family);
  if (o.family != "llama" && !deepseek) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: family '", o.family,
                     "' is not one of llama, deepseek_v3, deepseek_v32, glm_moe_dsa, glm5_next"));
  }
  ModelConfig c;
  c.model_type = o.family;
  c.hidden = o.hidden;
  c.intermediate = o.intermediate;
  c.layers = o.layers;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.head_dim_explicit = o.head_dim != 0;
  c.head_dim = o.head_dim != 0 ? o.head_dim : (o.heads > 0 ? o.hidden / o.heads : 0);
  c.vocab = o.vocab;
  c.max_position = o.max_position;
  c.rms_eps = o.rms_eps;
  c.rope_theta = o.rope_theta;
  c.tie_embeddings = o.tie_embeddings;
  c.bos_id = std::min(1, o.vocab - 1);
  c.eos_id = std::min(2, o.vocab - 1);
  if (deepseek) {
    c.kv_heads = c.heads;
    c.head_dim = o.qk_rope_head_dim;
    c.head_dim_explicit = true;
    c.mla = {o.q_lora_rank, o.kv_lora_rank, o.qk_nope_head_dim, o.qk_rope_head_dim, o.v_head_dim};
    c.moe.n_routed = o.n_routed_experts;
    c.moe.n_shared = o.n_shared_experts;
    c.moe.experts_per_token = o.experts_per_token;
    c.moe.expert_intermediate = o.moe_intermediate;
    c.moe.n_group = o.n_group;
    c.moe.topk_group = o.topk_group;
    c.moe.routed_scaling = o.routed_scaling_factor;
    for (int l = 0; l < o.layers && o.n_routed_experts > 0; ++l) {
      c.moe.sparse_layer.push_back(l >= o.first_k_dense);
    }
    if (o.family == "glm5_next") {
      if (static_cast<int>(o.layer_types.size()) != o.layers ||
          o.layer_types.find_first_not_of("LF") != std::string::npos) {
        return absl::InvalidArgumentError(
            "synthetic model: glm5_next needs layer_types, one L or F per layer");
      }
      for (char t : o.layer_types) c.linear.linear_layer.push_back(t == 'L');
      c.linear.heads = o.linear_heads;
      c.linear.head_dim = o.linear_head_dim;
      c.linear.conv_kernel = o.linear_conv_kernel;
      c.linear.has_lower_bound = o.linear_lower_bound < 0.0f;
      c.linear.lower_bound = o.linear_lower_bound;
      c.moe.swiglu_limit = o.swiglu_limit;
      if (o.hc_mult < 1 || o.hc_mult > 16 || o.hc_sinkhorn_iters < 1) {
        return absl::InvalidArgumentError(
            "synthetic model: hc_mult must be in [1, 16] and hc_sinkhorn_iters at least 1");
      }
      c.hyper.mult = o.hc_mult;
      c.hyper.sinkhorn_iters = o.hc_sinkhorn_iters;
    }
    if (o.family != "deepseek_v3") {
      c.indexer = {o.index_topk, o.index_n_heads, o.index_head_dim,
                   o.family == "glm_moe_dsa" || o.family == "glm5_next"};
      for (char t : o.indexer_types) c.indexer.full_layer.push_back(t == 'F');
      if (o.index_kpool > 1) {
        if (o.family != "glm5_next" || o.index_kpool > 64 || o.index_topk % o.index_kpool != 0) {
          return absl::InvalidArgumentError(
              "synthetic model: index_kpool is glm5_next's, at most 64, and divides index_topk");
        }
        c.indexer.kpool = o.index_kpool;
      }
      if (!o.indexer_types.empty() &&
          (static_cast<int>(o.indexer_types.size()) != o.layers || o.indexer_types[0] != 'F' ||
           o.indexer_types.find_first_not_of("FS") != std::string::npos)) {
        return absl::InvalidArgumentError(
            "synthetic model: indexer_types needs one F or S per layer, starting with F");
      }
      if (o.q_lora_rank <= 0) {
        return absl::InvalidArgumentError("synthetic model: the DSA indexer needs q_lora_rank > 0");
      }
    }
    if (o.yarn_factor > 1.0f) {
      c.rope_scaling.type = "yarn";
      c.rope_scaling.factor = o.yarn_factor;
      c.rope_scaling.original_max_position =
          static_cast<int>(static_cast<float>(o.max_position) / o.yarn_factor);
      c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 1.0f;
    }
  }
  if (o.mtp_layers != 0 && o.mtp_layers != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: mtp_layers must be 0 or 1, got ", o.mtp_layers));
  }
  if (o.mtp_layers != 0 && !deepseek) {
    return absl::InvalidArgumentError(
        "synthetic model: mtp_layers needs a DeepSeek-family model; llama has no MTP layer");
  }
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic model: ", s.message()));
  }
  if (o.shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: shards must be at least 1, got ", o.shards));
  }

  // The plan, in checkpoint order.
  const bool fp8 = o.dtype == DType::kFP8E4M3;
  const int64_t H = c.hidden, I = c.intermediate;
  const int64_t q_dim = int64_t{c.heads} * c.head_dim, kv_dim = int64_t{c.kv_heads} * c.head_dim;
  std::vector<TensorPlan> plan;
  auto add_matrix = [&](std::string name, Kind kind, int64_t rows, int64_t cols, DType dtype) {
    plan.push_back(
        {std::move(name), kind, rows, cols, {rows, cols}, dtype, dtype == DType::kFP8E4M3});
  };
  auto add_norm = [&](std::string name) {
    plan.push_back({std::move(name), Kind::kNorm, 1, H, {H}, DType::kF32, false});
  };
  auto add_vector = [&](std::string name, Kind kind, int64_t n) {
    plan.push_back({std::move(name), kind, 1, n, {n}, DType::kF32, false});
  };
  // An F32 tensor generated as rows x cols and stored with another shape.
  auto add_shaped = [&](std::string name, Kind kind, int64_t rows, int64_t cols,
                        std::vector<int64_t> shape) {
    plan.push_back({std::move(name), kind, rows, cols, std::move(shape), DType::kF32, false});
  };
  add_matrix("model.embed_tokens.weight", Kind::kEmbedding, c.vocab, H,
             fp8 ? DType::kBF16 : o.dtype);
  for (int l = 0; l < c.layers && deepseek; ++l) {
    AddDeepseekLayer(c, o, l, o.dtype, add_matrix, add_vector, add_shaped);
  }
  std::shared_ptr<const CopierCircuit> copier;
  if (o.copier) {
    if (deepseek || c.head_dim != CopierCircuit::kHeadDim || c.heads % c.kv_heads != 0 ||
        c.heads / c.kv_heads < 2 || c.layers < 2 || c.tie_embeddings ||
        int64_t{c.vocab} + 3 * int64_t{c.kv_heads} * CopierCircuit::kHeadDim >= H ||
        !(c.rope_theta >= 1e15f) || !c.rope_scaling.type.empty()) {
      return absl::InvalidArgumentError(
          "synthetic model: copier needs the llama family, head_dim 64, at least 2 query heads "
          "per KV head, 2 or more layers, untied embeddings, vocab + 3 * kv_heads * 64 < hidden "
          "and rope_theta >= 1e15 without scaling");
    }
    copier = std::make_shared<CopierCircuit>(o, H, c.heads, c.kv_heads, c.vocab, c.rope_theta);
  }
  // With the copier, `fn` of the last tensor planned becomes its element.
  auto copier_fn = [&](float (CopierCircuit::*element)(int64_t, int64_t) const) {
    if (copier == nullptr) return;
    plan.back().fn = [copier, element](int64_t r, int64_t col) {
      return ((*copier).*element)(r, col);
    };
  };
  if (!deepseek) copier_fn(&CopierCircuit::Embedding);
  for (int l = 0; l < c.layers && !deepseek; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const bool circuit = l < 2;
    add_norm(p + "input_layernorm.weight");
    copier_fn(&CopierCircuit::Norm);
    add_matrix(p + "self_attn.q_proj.weight", Kind::kLinear, q_dim, H, o.dtype);
    if (circuit) copier_fn(l == 0 ? &CopierCircuit::Q0 : &CopierCircuit::Q1);
    add_matrix(p + "self_attn.k_proj.weight", Kind::kLinear, kv_dim, H, o.dtype);
    if (circuit) copier_fn(l == 0 ? &CopierCircuit::K0 : &CopierCircuit::K1);
    add_matrix(p + "self_attn.v_proj.weight", Kind::kLinear, kv_dim, H, o.dtype);
    if (circuit) copier_fn(l == 0 ? &CopierCircuit::V0 : &CopierCircuit::V1);
    // Layers from silent_from on add nothing to the residual stream; the
    // copier's MLPs add nothing anywhere and its layers from 2 on are silent.
    const int silent_from = copier != nullptr ? 2 : o.silent_from;
    const Kind out = silent_from > 0 && l >= silent_from ? Kind::kZero : Kind::kLinear;
    add_matrix(p + "self_attn.o_proj.weight", out, H, q_dim, o.dtype);
    if (circuit) copier_fn(l == 0 ? &CopierCircuit::O0 : &CopierCircuit::O1);
    add_norm(p + "post_attention_layernorm.weight");
    copier_fn(&CopierCircuit::Norm);
    add_matrix(p + "mlp.gate_proj.weight", Kind::kLinear, I, H, o.dtype);
    add_matrix(p + "mlp.up_proj.weight", Kind::kLinear, I, H, o.dtype);
    add_matrix(p + "mlp.down_proj.weight", copier != nullptr ? Kind::kZero : out, H, I, o.dtype);
  }
  add_norm("model.norm.weight");
  copier_fn(&CopierCircuit::Norm);
  if (c.hyper.enabled() && o.hc_head) {
    add_shaped("model.hc_head_fn", Kind::kLinear, c.hyper.mult, c.hyper.mult * H,
               std::vector<int64_t>{c.hyper.mult, c.hyper.mult * H});
    add_vector("model.hc_head_base", Kind::kBias, c.hyper.mult);
    add_vector("model.hc_head_scale", Kind::kNorm, 1);
  }
  if (!c.tie_embeddings) {
    add_matrix("lm_head.weight", Kind::kLinear, c.vocab, H, o.dtype);
    copier_fn(&CopierCircuit::Head);
  }
  // Last, as the published checkpoints keep the MTP layer in their last shards.
  // shared_head.head is written even with tied embeddings: DeepSeek-V3 stores
  // its own copy.
  if (o.mtp_layers == 1) {
    const std::string p = absl::StrCat("model.layers.", c.layers, ".");
    add_norm(p + "enorm.weight");
    add_norm(p + "hnorm.weight");
    add_matrix(p + "eh_proj.weight", Kind::kLinear, H, 2 * H, o.dtype);
    AddDeepseekLayer(c, o, c.layers, o.dtype, add_matrix, add_vector, add_shaped);
    add_norm(p + "shared_head.norm.weight");
    add_matrix(p + "shared_head.head.weight", Kind::kLinear, c.vocab, H, o.dtype);
  }
  if (static_cast<size_t>(o.shards) > plan.size()) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic model: shards (", o.shards,
                                                   ") exceeds the number of tensors (", plan.size(),
                                                   ")"));
  }

  // Shards by tensor count: simple, never empty, and close enough to even.
  std::vector<std::vector<SafetensorsTensorSpec>> specs(o.shards);
  for (size_t i = 0; i < plan.size(); ++i) {
    TensorPlan& t = plan[i];
    t.shard = static_cast<int>(i * o.shards / plan.size());
    t.index = static_cast<int>(specs[t.shard].size());
    specs[t.shard].push_back({t.name, t.dtype, t.shape});
    if (t.has_scale) {
      t.scale_index = static_cast<int>(specs[t.shard].size());
      specs[t.shard].push_back({t.name + "_scale_inv",
                                DType::kF32,
                                {(t.rows + kFp8BlockSize - 1) / kFp8BlockSize,
                                 (t.cols + kFp8BlockSize - 1) / kFp8BlockSize}});
    }
  }

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", o.out_dir, ": ", ec.message()));
  }
  // A stale file of the other layout would shadow or confuse this one.
  const fs::path dir(o.out_dir);
  fs::remove(dir / (o.shards > 1 ? "model.safetensors" : "model.safetensors.index.json"), ec);
  fs::remove(dir / "config.json", ec);

  std::vector<std::string> shard_names(o.shards);
  std::vector<std::unique_ptr<SafetensorsWriter>> writers(o.shards);
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  size_t total_bytes = 0;
  for (int s = 0; s < o.shards; ++s) {
    shard_names[s] = o.shards == 1
                         ? "model.safetensors"
                         : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, o.shards);
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
        SafetensorsWriter::Create((dir / shard_names[s]).string(), specs[s], metadata);
    if (!w.ok()) return w.status();
    writers[s] = *std::move(w);
    total_bytes += writers[s]->data_bytes();
  }

  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<size_t> done_bytes{0};
  auto report = [&] {
    if (progress && total_bytes > 0) {
      progress(static_cast<double>(done_bytes.load()) / static_cast<double>(total_bytes));
    }
  };
  for (const TensorPlan& t : plan) {
    SafetensorsWriter* w = writers[t.shard].get();
    const int64_t blocks = (t.rows + kRowBlock - 1) / kRowBlock;
    std::vector<float> scales;
    if (t.has_scale) scales.assign(blocks * ((t.cols + kFp8BlockSize - 1) / kFp8BlockSize), 1.0f);
    const size_t row_bytes = t.cols * DTypeSize(t.dtype);
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<absl::Status> status(threads);
    // Work items are row blocks handed out in order; the calling thread takes
    // part too and is the only one that reports progress.
    auto work = [&](int id) {
      std::vector<float> fbuf;
      std::vector<uint8_t> bbuf;
      for (int64_t b; !failed.load() && (b = next.fetch_add(1)) < blocks;) {
        absl::Status s = WriteRowBlock(t, o.seed, b * kRowBlock, w, &scales, &fbuf, &bbuf);
        if (!s.ok()) {
          status[id] = s;
          failed.store(true);
          return;
        }
        done_bytes.fetch_add(std::min(kRowBlock, t.rows - b * kRowBlock) * row_bytes);
        if (id == 0) report();
      }
    };
    const int n_threads = static_cast<int>(std::min<int64_t>(threads, blocks));
    std::vector<std::thread> pool;
    for (int i = 1; i < n_threads; ++i) pool.emplace_back(work, i);
    work(0);
    for (std::thread& th : pool) th.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    if (t.has_scale) {
      absl::Status s =
          w->WriteAt(t.scale_index, 0,
                     absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(scales.data()),
                                         scales.size() * sizeof(float)));
      if (!s.ok()) return s;
      done_bytes.fetch_add(scales.size() * sizeof(float));
    }
    report();
  }
  for (auto& w : writers) {
    if (absl::Status s = w->Finish(); !s.ok()) return s;
  }

  if (o.shards > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (int s = 0; s < o.shards; ++s) {
      for (const SafetensorsTensorSpec& spec : specs[s]) map[spec.name] = shard_names[s];
    }
    index["weight_map"] = map;
    if (absl::Status s =
            WriteTextFile((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }

  // config.json last: a directory without it is visibly incomplete.
  nlohmann::ordered_json cfg;
  cfg["architectures"] = {deepseek ? ArchitectureOf(o.family) : "LlamaForCausalLM"};
  cfg["model_type"] = o.family;
  cfg["hidden_size"] = c.hidden;
  cfg["intermediate_size"] = c.intermediate;
  cfg["num_hidden_layers"] = c.layers;
  cfg["num_attention_heads"] = c.heads;
  cfg["num_key_value_heads"] = c.kv_heads;
  if (o.head_dim != 0 && !deepseek) cfg["head_dim"] = o.head_dim;
  if (deepseek) AddDeepseekConfig(c, o, &cfg);
  cfg["vocab_size"] = c.vocab;
  cfg["max_position_embeddings"] = c.max_position;
  cfg["rms_norm_eps"] = c.rms_eps;
  cfg["rope_theta"] = c.rope_theta;
  cfg["rope_scaling"] = nullptr;
  if (c.rope_scaling.type == "yarn") {
    cfg["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope_scaling.factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position},
        {"beta_fast", c.rope_scaling.beta_fast},
        {"beta_slow", c.rope_scaling.beta_slow},
        {"mscale", c.rope_scaling.mscale},
        {"mscale_all_dim", c.rope_scaling.mscale_all_dim}};
  }
  cfg["hidden_act"] = "silu";
  cfg["attention_bias"] = false;
  cfg["tie_word_embeddings"] = c.tie_embeddings;
  cfg["bos_token_id"] = c.bos_id;
  cfg["eos_token_id"] = c.eos_id;
  cfg["torch_dtype"] = TorchDType(o.dtype);
  if (fp8) {
    cfg["quantization_config"] = {{"quant_method", "fp8"},
                                  {"fmt", "e4m3"},
                                  {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {kFp8BlockSize, kFp8BlockSize}}};
  }
  cfg["ringlane_synthetic"] = {{"seed", o.seed}, {"dtype", std::string(DTypeName(o.dtype))}};
  if (absl::Status s = WriteTextFile((dir / "config.json").string(), cfg.dump(2) + "\n"); !s.ok()) {
    return s;
  }
  done_bytes.store(total_bytes);
  report();
  return absl::OkStatus();
}

}  // namespace ringlane::worker
