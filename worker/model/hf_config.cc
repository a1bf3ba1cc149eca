#include "worker/model/hf_config.h"

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

absl::Status ParseRopeScaling(const Json& j, absl::string_view path, RopeScaling* out) {
  if (!Present(j, "rope_scaling")) return absl::OkStatus();
  const Json& r = j["rope_scaling"];
  if (!r.is_object()) return Invalid(path, "rope_scaling", "must be an object or null");
  std::string type;
  // Newer transformers write rope_type, older ones type.
  if (absl::Status s = GetString(r, "rope_type", path, &type); !s.ok()) return s;
  if (type.empty()) {
    if (absl::Status s = GetString(r, "type", path, &type); !s.ok()) return s;
  }
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type != "linear" && type != "llama3") {
    return Unsupported(path, "rope_scaling.rope_type",
                       absl::StrCat("'", type, "' is not supported (supported: linear, llama3)"));
  }
  out->type = type;
  if (!Present(r, "factor")) return Invalid(path, "rope_scaling.factor", "is missing");
  if (absl::Status s = GetFloat(r, "factor", path, &out->factor); !s.ok()) return s;
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

absl::StatusOr<HfConfig> ParseHfConfigJson(const Json& j, absl::string_view path) {
  if (!j.is_object()) return Invalid(path, "top level", "is not a JSON object");
  HfConfig out;
  ModelConfig& c = out.config;

  std::string model_type;
  if (absl::Status s = GetString(j, "model_type", path, &model_type); !s.ok()) return s;
  if (model_type.empty()) return Invalid(path, "model_type", "is missing");
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2") {
    return Unsupported(
        path, "model_type",
        absl::StrCat("'", model_type, "' is not supported (supported: llama, mistral, qwen2)"));
  }
  c.model_type = model_type;

  // Mixture-of-experts fields under any of the names the families use.
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
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
  if (Present(j, "head_dim")) {
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
