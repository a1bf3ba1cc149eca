#include "worker/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ringlane::worker {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view path, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", what));
}
absl::Status Unsupported(absl::string_view path, absl::string_view field, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(path, ": ", field, " ", what));
}

bool Present(const Json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// Reads an optional integer field; `*out` keeps its value when absent or null.
absl::Status GetInt(const Json& j, const char* key, absl::string_view path, int* out) {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
    return Invalid(path, key, absl::StrCat("must be a 32-bit integer, got ", v.dump()));
  }
  *out = static_cast<int>(v.get<int64_t>());
  return absl::OkStatus();
}

absl::Status GetRequiredInt(const Json& j, const char* key, absl::string_view path, int* out) {
  if (!Present(j, key)) return Invalid(path, key, "is missing");
  return GetInt(j, key, path, out);
}

absl::Status GetFloat(const Json& j, const char* key, absl::string_view path, float* out) {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_number()) return Invalid(path, key, absl::StrCat("must be a number, got ", v.dump()));
  *out = v.get<float>();
  return absl::OkStatus();
}

absl::Status GetBool(const Json& j, const char* key, absl::string_view path, bool* out) {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_boolean()) return Invalid(path, key, absl::StrCat("must be a boolean, got ", v.dump()));
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const Json& j, const char* key, absl::string_view path, std::string* out) {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_string()) return Invalid(path, key, absl::StrCat("must be a string, got ", v.dump()));
  *out = v.get<std::string>();
  return absl::OkStatus();
}

// bos/eos may be an integer or a list of them (several stop tokens); the
// engine takes the first.
absl::Status GetTokenId(const Json& j, const char* key, absl::string_view path, int* out) {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& v = j[key];
  const Json* id = &v;
  if (v.is_array()) {
    if (v.empty()) return Invalid(path, key, "is an empty list");
    id = &v[0];
  }
  if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
    return Invalid(path, key, absl::StrCat("must be a token id or a list of them, got ", v.dump()));
  }
  *out = static_cast<int>(id->get<int64_t>());
  return absl::OkStatus();
}

// `key` names the object in messages: rope_scaling, or rope_parameters (newer
// transformers, which also carries rope_theta there).
absl::Status ParseRopeScaling(const Json& j, absl::string_view path, RopeScaling* out,
                              const char* key = "rope_scaling") {
  if (!Present(j, key)) return absl::OkStatus();
  const Json& r = j[key];
  if (!r.is_object()) return Invalid(path, key, "must be an object or null");
  std::string type;
  // Newer transformers write rope_type, older ones type.
  if (absl::Status s = GetString(r, "rope_type", path, &type); !s.ok()) return s;
  if (type.empty()) {
    if (absl::Status s = GetString(r, "type", path, &type); !s.ok()) return s;
  }
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type != "linear" && type != "llama3" && type != "yarn") {
    return Unsupported(
        path, absl::StrCat(key, ".rope_type"),
        absl::StrCat("'", type, "' is not supported (supported: linear, llama3, yarn)"));
  }
  out->type = type;
  if (!Present(r, "factor")) return Invalid(path, absl::StrCat(key, ".factor"), "is missing");
  if (absl::Status s = GetFloat(r, "factor", path, &out->factor); !s.ok()) return s;
  if (type == "yarn") {
    for (auto [name, field] :
         {std::pair{"beta_fast", &out->beta_fast}, std::pair{"beta_slow", &out->beta_slow},
          std::pair{"mscale", &out->mscale}, std::pair{"mscale_all_dim", &out->mscale_all_dim}}) {
      if (absl::Status s = GetFloat(r, name, path, field); !s.ok()) return s;
    }
    out->original_max_position = 0;  // the caller's max_position_embeddings when absent
    if (absl::Status s =
            GetInt(r, "original_max_position_embeddings", path, &out->original_max_position);
        !s.ok()) {
      return s;
    }
    // transformers scales cos and sin by mscale(factor, mscale) /
    // mscale(factor, mscale_all_dim) (or by mscale(factor) when the two are
    // not both given); DeepSeek-V3's checkpoints make that 1, and the latent
    // graph folds only the softmax-side mscale_all_dim term.
    const bool unit =
        Present(r, "mscale") && Present(r, "mscale_all_dim") && out->mscale == out->mscale_all_dim;
    if (!unit && out->factor > 1.0f) {
      return Unsupported(path, absl::StrCat(key, ".mscale"),
                         "must equal mscale_all_dim: a YaRN attention factor other than 1 is "
                         "not supported");
    }
  }
  if (type == "llama3") {
    if (absl::Status s = GetFloat(r, "low_freq_factor", path, &out->low_freq_factor); !s.ok()) {
      return s;
    }
    if (absl::Status s = GetFloat(r, "high_freq_factor", path, &out->high_freq_factor); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            GetInt(r, "original_max_position_embeddings", path, &out->original_max_position);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseQuantization(const Json& j, absl::string_view path, bool* fp8) {
  if (!Present(j, "quantization_config")) return absl::OkStatus();
  const Json& q = j["quantization_config"];
  if (!q.is_object()) return Invalid(path, "quantization_config", "must be an object");
  std::string method;
  if (absl::Status s = GetString(q, "quant_method", path, &method); !s.ok()) return s;
  if (method != "fp8") {
    return Unsupported(path, "quantization_config.quant_method",
                       absl::StrCat("'", method, "' is not supported (supported: fp8)"));
  }
  std::string fmt = "e4m3";
  if (absl::Status s = GetString(q, "fmt", path, &fmt); !s.ok()) return s;
  if (fmt != "e4m3") {
    return Unsupported(path, "quantization_config.fmt",
                       absl::StrCat("'", fmt, "' is not supported (supported: e4m3)"));
  }
  if (!Present(q, "weight_block_size")) {
    return Unsupported(path, "quantization_config.weight_block_size",
                       "is missing; only 128x128 block-scaled FP8 is supported");
  }
  const Json& b = q["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() != kFp8BlockSize || b[1].get<int64_t>() != kFp8BlockSize) {
    return Unsupported(path, "quantization_config.weight_block_size",
                       absl::StrCat(b.dump(), " is not supported (supported: [128, 128])"));
  }
  *fp8 = true;
  return absl::OkStatus();
}

// GLM-5.2's per-layer indexer sharing, as transformers' GlmMoeDsaConfig reads
// it: an indexer_types list ("full" / "shared"), else index_topk_pattern ("F"
// / "S" per layer, a string or a list), else a layer is full where
// max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (offset 2
// when only the frequency is given). Layer 0 must be full.
absl::Status ParseIndexerSharing(const Json& j, absl::string_view path, int layers,
                                 std::vector<bool>* full) {
  full->clear();
  auto from_list = [&](const char* key, const Json& v) -> absl::Status {
    const bool text = v.is_string();
    if (!text && !v.is_array()) return Invalid(path, key, "must be a list or a string");
    const size_t n = text ? v.get<std::string>().size() : v.size();
    if (static_cast<int>(n) != layers) {
      return Invalid(path, key, absl::StrCat("names ", n, " layers, the model has ", layers));
    }
    for (size_t i = 0; i < n; ++i) {
      std::string t = text ? std::string(1, v.get<std::string>()[i])
                           : (v[i].is_string() ? v[i].get<std::string>() : std::string());
      if (t == "full" || t == "F") {
        full->push_back(true);
      } else if (t == "shared" || t == "S") {
        full->push_back(false);
      } else {
        return Invalid(path, key, "entries must be full/shared (or F/S)");
      }
    }
    return absl::OkStatus();
  };
  if (Present(j, "indexer_types")) {
    if (absl::Status s = from_list("indexer_types", j["indexer_types"]); !s.ok()) return s;
  } else if (Present(j, "index_topk_pattern")) {
    if (absl::Status s = from_list("index_topk_pattern", j["index_topk_pattern"]); !s.ok()) {
      return s;
    }
  } else if (Present(j, "index_topk_freq")) {
    int freq = 1, offset = 2;
    if (absl::Status s = GetInt(j, "index_topk_freq", path, &freq); !s.ok()) return s;
    if (absl::Status s = GetInt(j, "index_skip_topk_offset", path, &offset); !s.ok()) return s;
    if (freq < 1) return Invalid(path, "index_topk_freq", "must be positive");
    for (int l = 0; l < layers; ++l) full->push_back(std::max(l - offset + 1, 0) % freq == 0);
  }
  if (!full->empty() && !(*full)[0]) {
    return Invalid(path, "indexer_types", "layer 0 must compute its own selection (full)");
  }
  return absl::OkStatus();
}

// MLA, MoE and indexer fields of deepseek_v3, deepseek_v32 and glm_moe_dsa,
// with transformers' defaults where a key may be absent.
// glm5_next's linear-attention layers (LinearAttentionConfig), and the
// refusal of the parts of GLM-5.3-Flash not run yet.
absl::Status ParseLinearAttention(const Json& j, absl::string_view path, ModelConfig* c) {
  HyperConfig& hc = c->hyper;
  if (Present(j, "hc_mult")) {
    if (absl::Status s = GetInt(j, "hc_mult", path, &hc.mult); !s.ok()) return s;
    if (hc.mult < 1 || hc.mult > 16) {
      return Invalid(path, "hc_mult", absl::StrCat("must be in [1, 16], got ", hc.mult));
    }
  }
  if (Present(j, "hc_sinkhorn_iters")) {
    if (absl::Status s = GetInt(j, "hc_sinkhorn_iters", path, &hc.sinkhorn_iters); !s.ok()) {
      return s;
    }
    if (hc.sinkhorn_iters < 1 || hc.sinkhorn_iters > 1000) {
      return Invalid(path, "hc_sinkhorn_iters",
                     absl::StrCat("must be in [1, 1000], got ", hc.sinkhorn_iters));
    }
  }
  if (Present(j, "hc_eps")) {
    if (absl::Status s = GetFloat(j, "hc_eps", path, &hc.eps); !s.ok()) return s;
    if (!(hc.eps > 0.0f) || !std::isfinite(hc.eps)) {
      return Invalid(path, "hc_eps", absl::StrCat("must be a positive number, got ", hc.eps));
    }
  }
  // Not run yet: refused rather than silently computed without.
  // The pooled indexer; false, 0 or 1: single positions.
  if (Present(j, "index_kpool") &&
      !(j["index_kpool"].is_boolean() && !j["index_kpool"].get<bool>())) {
    int pool = 1;
    if (absl::Status s = GetInt(j, "index_kpool", path, &pool); !s.ok()) return s;
    if (pool < 0 || pool > 64) {
      return Invalid(path, "index_kpool", absl::StrCat("must be in [0, 64], got ", pool));
    }
    if (pool > 1) {
      if (c->indexer.topk % pool != 0) {
        return Invalid(path, "index_kpool",
                       absl::StrCat("(", pool, ") must divide index_topk (", c->indexer.topk, ")"));
      }
      // The published model defines only the compressed pools with the tail.
      for (const char* key : {"index_kpool_always_select_tail", "index_kpool_compress"}) {
        if (Present(j, key) && j[key].is_boolean() && !j[key].get<bool>()) {
          return Unsupported(path, key, "false is not supported (only true is defined)");
        }
      }
      c->indexer.kpool = pool;
    }
  }
  for (const char* key : {"indexer_types", "index_topk_pattern", "index_topk_freq"}) {
    if (Present(j, key) && !(j[key].is_boolean() && !j[key].get<bool>())) {
      return Unsupported(path, key, "is not supported for glm5_next yet");
    }
  }
  // The clamped SwiGLU of the MoE layers' experts; 0 or false: none.
  if (Present(j, "swiglu_limit") &&
      !(j["swiglu_limit"].is_boolean() && !j["swiglu_limit"].get<bool>())) {
    float limit = 0.0f;
    if (absl::Status s = GetFloat(j, "swiglu_limit", path, &limit); !s.ok()) return s;
    if (!(limit >= 0.0f) || !std::isfinite(limit)) {
      return Invalid(path, "swiglu_limit",
                     absl::StrCat("must be a positive number (or 0 for none), got ", limit));
    }
    c->moe.swiglu_limit = limit;
  }
  LinearAttentionConfig& x = c->linear;
  if (!Present(j, "layer_types")) return Invalid(path, "layer_types", "is missing");
  const Json& types = j["layer_types"];
  if (!types.is_array() || static_cast<int>(types.size()) != c->layers) {
    return Invalid(path, "layer_types",
                   absl::StrCat("must list one type per layer (", c->layers, ")"));
  }
  bool any = false;
  for (const Json& t : types) {
    if (!t.is_string() || (t != "linear_attention" && t != "full_attention")) {
      return Invalid(
          path, "layer_types",
          absl::StrCat("entries must be \"linear_attention\" or \"full_attention\", got ",
                       t.dump()));
    }
    x.linear_layer.push_back(t == "linear_attention");
    any = any || x.linear_layer.back();
  }
  if (!any) return absl::OkStatus();
  for (auto [key, field] :
       {std::pair{"linear_num_heads", &x.heads}, std::pair{"linear_head_dim", &x.head_dim}}) {
    if (absl::Status s = GetRequiredInt(j, key, path, field); !s.ok()) return s;
    if (*field <= 0 || *field > 4096) {
      return Invalid(path, key, absl::StrCat("must be in [1, 4096], got ", *field));
    }
  }
  if (absl::Status s = GetInt(j, "linear_conv_kernel_dim", path, &x.conv_kernel); !s.ok()) {
    return s;
  }
  if (x.conv_kernel < 1 || x.conv_kernel > 64) {
    return Invalid(path, "linear_conv_kernel_dim",
                   absl::StrCat("must be in [1, 64], got ", x.conv_kernel));
  }
  if (Present(j, "linear_lower_bound")) {
    if (absl::Status s = GetFloat(j, "linear_lower_bound", path, &x.lower_bound); !s.ok()) {
      return s;
    }
    if (!(x.lower_bound < 0.0f) || !std::isfinite(x.lower_bound)) {
      return Invalid(path, "linear_lower_bound",
                     absl::StrCat("must be a negative number, got ", x.lower_bound));
    }
    x.has_lower_bound = true;
  }
  return absl::OkStatus();
}

absl::Status ParseDeepseekFamily(const Json& j, absl::string_view path, ModelConfig* c) {
  MlaConfig& m = c->mla;
  const bool next = c->model_type == "glm5_next";
  for (auto [key, field] : {std::pair{"kv_lora_rank", &m.kv_lora_rank},
                            std::pair{"qk_nope_head_dim", &m.qk_nope_head_dim},
                            std::pair{"qk_rope_head_dim", &m.qk_rope_head_dim},
                            std::pair{"v_head_dim", &m.v_head_dim}}) {
    if (absl::Status s = GetRequiredInt(j, key, path, field); !s.ok()) return s;
    // glm5_next's attention layers are NoPE: no rotary part at all.
    const bool zero_ok = next && std::string_view(key) == "qk_rope_head_dim";
    if (*field < 0 || (*field == 0 && !zero_ok)) {
      return Invalid(path, key, absl::StrCat("must be positive, got ", *field));
    }
  }
  if (m.qk_rope_head_dim % 2 != 0) {
    return Invalid(path, "qk_rope_head_dim",
                   absl::StrCat("(", m.qk_rope_head_dim, ") must be even for RoPE"));
  }
  // null: queries straight from the hidden state (DeepSeek-V2-Lite).
  if (absl::Status s = GetInt(j, "q_lora_rank", path, &m.q_lora_rank); !s.ok()) return s;
  if (m.q_lora_rank < 0) return Invalid(path, "q_lora_rank", "must not be negative");
  // The rope part is the only per-head size the RoPE tables need; every query
  // head has its own latent key, so there are as many KV heads as heads.
  c->head_dim = m.qk_rope_head_dim;
  c->head_dim_explicit = true;
  c->kv_heads = c->heads;

  MoeConfig& e = c->moe;
  if (absl::Status s = GetInt(j, "n_routed_experts", path, &e.n_routed); !s.ok()) return s;
  if (e.n_routed > 0) {
    if (absl::Status s = GetRequiredInt(j, "num_experts_per_tok", path, &e.experts_per_token);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = GetRequiredInt(j, "moe_intermediate_size", path, &e.expert_intermediate);
        !s.ok()) {
      return s;
    }
    e.n_shared = 1;
    e.routed_scaling = 2.5f;
    for (auto [key, field] :
         {std::pair{"n_shared_experts", &e.n_shared}, std::pair{"n_group", &e.n_group},
          std::pair{"topk_group", &e.topk_group}}) {
      if (absl::Status s = GetInt(j, key, path, field); !s.ok()) return s;
    }
    if (absl::Status s = GetFloat(j, "routed_scaling_factor", path, &e.routed_scaling); !s.ok()) {
      return s;
    }
    if (absl::Status s = GetBool(j, "norm_topk_prob", path, &e.norm_topk_prob); !s.ok()) return s;
    std::string scoring = "sigmoid", topk_method = "noaux_tc";
    if (absl::Status s = GetString(j, "scoring_func", path, &scoring); !s.ok()) return s;
    if (absl::Status s = GetString(j, "topk_method", path, &topk_method); !s.ok()) return s;
    if (scoring != "sigmoid" && scoring != "softmax") {
      return Unsupported(path, "scoring_func",
                         absl::StrCat("'", scoring, "' is not supported (sigmoid, softmax)"));
    }
    if (topk_method != "noaux_tc" && topk_method != "greedy") {
      return Unsupported(path, "topk_method",
                         absl::StrCat("'", topk_method, "' is not supported (noaux_tc, greedy)"));
    }
    e.sigmoid_scoring = scoring == "sigmoid";
    e.correction_bias = topk_method == "noaux_tc";
    int freq = 1;
    if (absl::Status s = GetInt(j, "moe_layer_freq", path, &freq); !s.ok()) return s;
    if (freq != 1) return Unsupported(path, "moe_layer_freq", "other than 1 is not supported");
    if (Present(j, "mlp_layer_types")) {
      const Json& types = j["mlp_layer_types"];
      if (!types.is_array() || static_cast<int>(types.size()) != c->layers) {
        return Invalid(path, "mlp_layer_types",
                       absl::StrCat("must list one type per layer (", c->layers, ")"));
      }
      for (const Json& t : types) {
        if (!t.is_string() || (t != "dense" && t != "sparse")) {
          return Invalid(path, "mlp_layer_types",
                         absl::StrCat("entries must be \"dense\" or \"sparse\", got ", t.dump()));
        }
        e.sparse_layer.push_back(t == "sparse");
      }
      // The list names the main layers only; GLM's MTP layer is a MoE layer.
      c->mtp_sparse = true;
    } else {
      int first_dense = 3;  // transformers' default for both families
      if (absl::Status s = GetInt(j, "first_k_dense_replace", path, &first_dense); !s.ok()) {
        return s;
      }
      if (first_dense < 0) return Invalid(path, "first_k_dense_replace", "must not be negative");
      for (int l = 0; l < c->layers; ++l) e.sparse_layer.push_back(l >= first_dense);
      c->mtp_sparse = c->layers >= first_dense;
    }
  }
  if (absl::Status s = GetInt(j, "num_nextn_predict_layers", path, &c->mtp_layers); !s.ok()) {
    return s;
  }
  if (c->mtp_layers < 0) return Invalid(path, "num_nextn_predict_layers", "must not be negative");

  if (c->model_type != "deepseek_v3") {
    IndexerConfig& x = c->indexer;
    x.topk = 2048;
    const bool glm = c->model_type == "glm_moe_dsa" || next;
    x.heads = glm ? 32 : 64;
    x.head_dim = 128;
    x.rope_interleave = glm;
    for (auto [key, field] :
         {std::pair{"index_topk", &x.topk}, std::pair{"index_n_heads", &x.heads},
          std::pair{"index_head_dim", &x.head_dim}}) {
      if (absl::Status s = GetInt(j, key, path, field); !s.ok()) return s;
      if (*field <= 0) return Invalid(path, key, absl::StrCat("must be positive, got ", *field));
    }
    if (absl::Status s = GetBool(j, "indexer_rope_interleave", path, &x.rope_interleave); !s.ok()) {
      return s;
    }
    // glm5_next: every attention layer runs its own indexer
    // (ParseLinearAttention refuses the sharing keys).
    if (absl::Status s =
            next ? absl::OkStatus() : ParseIndexerSharing(j, path, c->layers, &x.full_layer);
        !s.ok()) {
      return s;
    }
    if (x.head_dim < m.qk_rope_head_dim) {
      return Invalid(path, "index_head_dim",
                     absl::StrCat("(", x.head_dim, ") is smaller than qk_rope_head_dim (",
                                  m.qk_rope_head_dim, ")"));
    }
  }
  if (next) return ParseLinearAttention(j, path, c);
  return absl::OkStatus();
}

absl::StatusOr<HfConfig> ParseHfConfigJson(const Json& j, absl::string_view path) {
  if (!j.is_object()) return Invalid(path, "top level", "is not a JSON object");
  HfConfig out;
  ModelConfig& c = out.config;

  std::string model_type;
  if (absl::Status s = GetString(j, "model_type", path, &model_type); !s.ok()) return s;
  if (model_type.empty()) return Invalid(path, "model_type", "is missing");
  const bool deepseek = IsDeepseekFamily(model_type);
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2" && !deepseek) {
    return Unsupported(path, "model_type",
                       absl::StrCat("'", model_type,
                                    "' is not supported (supported: llama, mistral, qwen2, "
                                    "deepseek_v3, deepseek_v32, glm_moe_dsa, glm5_next)"));
  }
  c.model_type = model_type;

  // Mixture-of-experts fields under any of the names the families use; only
  // the DeepSeek family's MoE is run.
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (deepseek && std::string_view(key) == "n_routed_experts") continue;
    if (Present(j, key) && !(j[key].is_number_integer() && j[key].get<int64_t>() == 0)) {
      return Unsupported(path, key, "is set: mixture-of-experts models are not supported");
    }
  }
  bool attention_bias = model_type == "qwen2";  // Qwen2's q/k/v carry a bias by design
  if (absl::Status s = GetBool(j, "attention_bias", path, &attention_bias); !s.ok()) return s;
  if (attention_bias) {
    return Unsupported(path, "attention_bias",
                       "is true: attention projections with bias are not supported");
  }
  bool mlp_bias = false;
  if (absl::Status s = GetBool(j, "mlp_bias", path, &mlp_bias); !s.ok()) return s;
  if (mlp_bias) return Unsupported(path, "mlp_bias", "is true: MLP bias is not supported");
  std::string act = "silu";
  if (absl::Status s = GetString(j, "hidden_act", path, &act); !s.ok()) return s;
  if (act != "silu") {
    return Unsupported(path, "hidden_act",
                       absl::StrCat("'", act, "' is not supported (supported: silu)"));
  }

  if (absl::Status s = GetRequiredInt(j, "hidden_size", path, &c.hidden); !s.ok()) return s;
  if (absl::Status s = GetRequiredInt(j, "intermediate_size", path, &c.intermediate); !s.ok()) {
    return s;
  }
  if (absl::Status s = GetRequiredInt(j, "num_hidden_layers", path, &c.layers); !s.ok()) return s;
  if (absl::Status s = GetRequiredInt(j, "num_attention_heads", path, &c.heads); !s.ok()) return s;
  c.kv_heads = c.heads;
  if (absl::Status s = GetInt(j, "num_key_value_heads", path, &c.kv_heads); !s.ok()) return s;
  if (absl::Status s = GetRequiredInt(j, "vocab_size", path, &c.vocab); !s.ok()) return s;
  c.max_position = 2048;  // transformers' LlamaConfig default
  if (absl::Status s = GetInt(j, "max_position_embeddings", path, &c.max_position); !s.ok()) {
    return s;
  }
  if (deepseek) {
    if (absl::Status s = ParseDeepseekFamily(j, path, &c); !s.ok()) return s;
  } else if (Present(j, "head_dim")) {
    if (absl::Status s = GetInt(j, "head_dim", path, &c.head_dim); !s.ok()) return s;
    c.head_dim_explicit = true;
  } else {
    if (c.heads <= 0 || c.hidden % c.heads != 0) {
      return Invalid(path, "num_attention_heads",
                     absl::StrCat("(", c.heads, ") must divide hidden_size (", c.hidden,
                                  ") when head_dim is not given"));
    }
    c.head_dim = c.hidden / c.heads;
  }
  c.rms_eps = 1e-6f;  // transformers' LlamaConfig default
  if (absl::Status s = GetFloat(j, "rms_norm_eps", path, &c.rms_eps); !s.ok()) return s;
  c.rope_theta = 10000.0f;
  if (absl::Status s = GetFloat(j, "rope_theta", path, &c.rope_theta); !s.ok()) return s;
  if (absl::Status s = ParseRopeScaling(j, path, &c.rope_scaling); !s.ok()) return s;
  if (Present(j, "rope_parameters")) {
    if (!j["rope_parameters"].is_object()) {
      return Invalid(path, "rope_parameters", "must be an object or null");
    }
    if (absl::Status s = GetFloat(j["rope_parameters"], "rope_theta", path, &c.rope_theta);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ParseRopeScaling(j, path, &c.rope_scaling, "rope_parameters"); !s.ok()) {
      return s;
    }
  }
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.original_max_position == 0) {
    c.rope_scaling.original_max_position = c.max_position;
  }
  c.tie_embeddings = false;
  if (absl::Status s = GetBool(j, "tie_word_embeddings", path, &c.tie_embeddings); !s.ok()) {
    return s;
  }
  if (absl::Status s = GetTokenId(j, "bos_token_id", path, &c.bos_id); !s.ok()) return s;
  if (absl::Status s = GetTokenId(j, "eos_token_id", path, &c.eos_id); !s.ok()) return s;

  // A window shorter than the context changes attention; running it as full
  // attention would give different answers past the window.
  bool use_sliding = model_type == "mistral";
  if (absl::Status s = GetBool(j, "use_sliding_window", path, &use_sliding); !s.ok()) return s;
  if (use_sliding && Present(j, "sliding_window")) {
    int window = 0;
    if (absl::Status s = GetInt(j, "sliding_window", path, &window); !s.ok()) return s;
    if (window > 0 && window < c.max_position) {
      return Unsupported(
          path, "sliding_window",
          absl::StrCat("(", window, ") is shorter than max_position_embeddings (", c.max_position,
                       "): sliding-window attention is not supported"));
    }
  }

  if (absl::Status s = ParseQuantization(j, path, &out.fp8_block_scaled); !s.ok()) return s;
  c.weight_dtype = out.fp8_block_scaled ? DType::kFP8E4M3 : DType::kBF16;
  c.rope_layout = RopeLayout::kHalf;
  if (deepseek) {
    // rope_interleave pairs (2i, 2i+1) of the rope dims; transformers
    // de-interleaves q and k alike before a rotate-half, which leaves every
    // dot product the same as rotating the interleaved pairs in place.
    bool interleave = true;
    if (absl::Status s = GetBool(j, "rope_interleave", path, &interleave); !s.ok()) return s;
    c.rope_layout = interleave ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  }

  if (absl::Status s = ValidateConfigFields(c, kHfConfigFieldNames); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return out;
}

}  // namespace

absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json_text, absl::string_view path) {
  // nlohmann throws on malformed text and on type mismatches; none may escape.
  try {
    Json j = Json::parse(json_text.begin(), json_text.end());
    return ParseHfConfigJson(j, path);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

}  // namespace ringlane::worker
