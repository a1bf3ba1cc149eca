// Reads a Hugging Face `config.json` into a ModelConfig: the Llama-style dense
// families (llama, mistral, qwen2 without attention bias) and the DeepSeek-V3
// family (deepseek_v3, deepseek_v32, glm_moe_dsa: MLA, MoE, the DSA indexer,
// YaRN), and refuses anything it would otherwise run wrongly (other MoE
// layouts, other activations, unknown RoPE scaling, other quantization
// schemes). Pure functions; safe from any thread.
#ifndef RINGLANE_WORKER_MODEL_HF_CONFIG_H_
#define RINGLANE_WORKER_MODEL_HF_CONFIG_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/model/model.h"

namespace ringlane::worker {

struct HfConfig {
  ModelConfig config;
  // quantization_config declares FP8 weights with 128x128 block scales.
  bool fp8_block_scaled = false;
};

// Parses the text of a config.json; `path` is used in messages. Invalid values
// are InvalidArgument, valid but unsupported features are Unimplemented; both
// name the file and the field.
absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json_text, absl::string_view path);

// The names ValidateConfig uses for each ModelConfig field in its messages, so
// that an error about a config.json speaks that file's vocabulary.
struct ConfigFieldNames {
  absl::string_view hidden = "hidden";
  absl::string_view intermediate = "intermediate";
  absl::string_view layers = "layers";
  absl::string_view heads = "heads";
  absl::string_view kv_heads = "kv_heads";
  absl::string_view head_dim = "head_dim";
  absl::string_view vocab = "vocab";
  absl::string_view max_position = "max_position";
  absl::string_view rms_eps = "rms_eps";
  absl::string_view rope_theta = "rope_theta";
  absl::string_view rope_scaling = "rope_scaling";
  absl::string_view bos_id = "bos_id";
  absl::string_view eos_id = "eos_id";
};

inline constexpr ConfigFieldNames kHfConfigFieldNames{
    .hidden = "hidden_size",
    .intermediate = "intermediate_size",
    .layers = "num_hidden_layers",
    .heads = "num_attention_heads",
    .kv_heads = "num_key_value_heads",
    .head_dim = "head_dim",
    .vocab = "vocab_size",
    .max_position = "max_position_embeddings",
    .rms_eps = "rms_norm_eps",
    .rope_theta = "rope_theta",
    .rope_scaling = "rope_scaling",
    .bos_id = "bos_token_id",
    .eos_id = "eos_token_id",
};

// ValidateConfig with the field names given; the message starts with the
// offending field's name.
absl::Status ValidateConfigFields(const ModelConfig& c, const ConfigFieldNames& names);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_HF_CONFIG_H_
