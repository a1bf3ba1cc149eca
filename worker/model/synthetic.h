// Writes synthetic Llama-shaped checkpoints in the Hugging Face layout
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
};

// Named shapes: "tiny" (the defaults above) and "1b1" (TinyLlama 1.1B's shape:
// hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads, vocab 32000,
// 2048 positions, FP8). Other names are InvalidArgument.
absl::StatusOr<SyntheticModelOptions> SyntheticPreset(std::string_view name);

// Writes the model to o.out_dir (created if needed; files of the same name are
// replaced). `progress`, if set, is called on the calling thread with the
// fraction of tensor bytes written so far, ending with 1.0. Invalid options
// are InvalidArgument naming the option; I/O failures are Internal.
absl::Status WriteSyntheticModel(const SyntheticModelOptions& o,
                                 std::function<void(double fraction)> progress = {});

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_SYNTHETIC_H_
