#include "worker/graph/factory.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/graph/deepseek.h"
#include "worker/graph/llama.h"

namespace ringlane::worker {
namespace {

// Qwen2 and Mistral (without a sliding window) are the Llama graph: the
// loader folds their differences (attention bias, head size) into the weights
// and the config that graph reads.
bool IsLlamaFamily(const std::string& model_type) {
  return model_type == "llama" || model_type == "mistral" || model_type == "qwen2";
}

absl::Status NoGraph(const std::string& model_type) {
  return absl::UnimplementedError(
      absl::StrCat("no forward pass for model_type '", model_type,
                   "' (supported: llama, mistral, qwen2, deepseek_v3, deepseek_v32, "
                   "glm_moe_dsa, glm5_next)"));
}

// The loader fills a DeepSeek-family config's latent attention; a config
// that names the family without it cannot be run as one.
absl::Status CheckDeepseek(const ModelConfig& config) {
  if (IsMla(config)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model_type '", config.model_type, "' needs latent attention (kv_lora_rank) in its config"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelGraph>> CreateGraph(std::shared_ptr<const ModelWeights> shard) {
  if (shard == nullptr) return absl::InvalidArgumentError("no model to run");
  if (IsLlamaFamily(shard->config.model_type)) {
    return std::make_unique<LlamaGraph>(std::move(shard));
  }
  if (IsDeepseekFamily(shard->config.model_type)) {
    if (absl::Status s = CheckDeepseek(shard->config); !s.ok()) return s;
    return std::make_unique<DeepseekGraph>(std::move(shard));
  }
  return NoGraph(shard->config.model_type);
}

absl::StatusOr<std::vector<LayerCacheSpec>> GraphLayerCaches(const ModelConfig& config,
                                                             const TpShard& shard) {
  if (IsLlamaFamily(config.model_type)) return LlamaGraph::LayerCaches(config, shard);
  if (IsDeepseekFamily(config.model_type)) {
    if (absl::Status s = CheckDeepseek(config); !s.ok()) return s;
    return DeepseekGraph::LayerCaches(config, shard);
  }
  return NoGraph(config.model_type);
}

}  // namespace ringlane::worker
