#include "worker/model/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
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

enum class Kind { kEmbedding, kLinear, kNorm };

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
  for (int64_t i = 0; i < n * cols; ++i) f[i] = Value(t.kind, key, r0 * cols + i, linear_std);

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

}  // namespace

absl::StatusOr<SyntheticModelOptions> SyntheticPreset(std::string_view name) {
  SyntheticModelOptions o;
  if (name == "tiny") return o;
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
  return absl::InvalidArgumentError(absl::StrCat("unknown synthetic model preset '",
                                                 std::string(name), "' (expected tiny or 1b1)"));
}

absl::Status WriteSyntheticModel(const SyntheticModelOptions& o,
                                 std::function<void(double fraction)> progress) {
  namespace fs = std::filesystem;
  if (o.out_dir.empty()) return absl::InvalidArgumentError("synthetic model: out_dir is empty");
  ModelConfig c;
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
  add_matrix("model.embed_tokens.weight", Kind::kEmbedding, c.vocab, H,
             fp8 ? DType::kBF16 : o.dtype);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add_norm(p + "input_layernorm.weight");
    add_matrix(p + "self_attn.q_proj.weight", Kind::kLinear, q_dim, H, o.dtype);
    add_matrix(p + "self_attn.k_proj.weight", Kind::kLinear, kv_dim, H, o.dtype);
    add_matrix(p + "self_attn.v_proj.weight", Kind::kLinear, kv_dim, H, o.dtype);
    add_matrix(p + "self_attn.o_proj.weight", Kind::kLinear, H, q_dim, o.dtype);
    add_norm(p + "post_attention_layernorm.weight");
    add_matrix(p + "mlp.gate_proj.weight", Kind::kLinear, I, H, o.dtype);
    add_matrix(p + "mlp.up_proj.weight", Kind::kLinear, I, H, o.dtype);
    add_matrix(p + "mlp.down_proj.weight", Kind::kLinear, H, I, o.dtype);
  }
  add_norm("model.norm.weight");
  if (!c.tie_embeddings) add_matrix("lm_head.weight", Kind::kLinear, c.vocab, H, o.dtype);
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
  cfg["architectures"] = {"LlamaForCausalLM"};
  cfg["model_type"] = "llama";
  cfg["hidden_size"] = c.hidden;
  cfg["intermediate_size"] = c.intermediate;
  cfg["num_hidden_layers"] = c.layers;
  cfg["num_attention_heads"] = c.heads;
  cfg["num_key_value_heads"] = c.kv_heads;
  if (o.head_dim != 0) cfg["head_dim"] = o.head_dim;
  cfg["vocab_size"] = c.vocab;
  cfg["max_position_embeddings"] = c.max_position;
  cfg["rms_norm_eps"] = c.rms_eps;
  cfg["rope_theta"] = c.rope_theta;
  cfg["rope_scaling"] = nullptr;
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
