// MappedFile, ValidateConfig and LoadModel (model.h): Hugging Face directories
// of safetensors and llama2.c checkpoints. Every matrix points into a mapping;
// only norm vectors (and, rarely, misaligned or non-F32 scale tensors) are
// copied.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/model/hf_config.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace ringlane::worker {

// ---------------------------------------------------------------------------
// MappedFile

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string msg = absl::StrCat("cannot stat ", path, ": ", std::strerror(errno));
    ::close(fd);
    return absl::InvalidArgumentError(msg);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", path, " (", size, " bytes): ", std::strerror(err)));
  }
  // Weights are streamed front to back every step: ask for read-ahead now and
  // for huge pages where the kernel can back file pages with them (fewer TLB
  // misses when a decode step walks a gigabyte). Both are hints; failures are
  // harmless.
  ::madvise(p, size, MADV_WILLNEED);
#ifdef MADV_HUGEPAGE
  ::madvise(p, size, MADV_HUGEPAGE);
#endif
  return std::shared_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(p), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---------------------------------------------------------------------------
// ValidateConfig

namespace {

// The DeepSeek family's fields, named as its config.json names them (no other
// source writes them).
absl::Status ValidateMoeFamily(const ModelConfig& c) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const MlaConfig& m = c.mla;
  if (IsMla(c)) {
    if (m.q_lora_rank < 0) return bad("q_lora_rank must not be negative, got ", m.q_lora_rank);
    if (m.qk_nope_head_dim <= 0 || m.v_head_dim <= 0) {
      return bad("qk_nope_head_dim (", m.qk_nope_head_dim, ") and v_head_dim (", m.v_head_dim,
                 ") must be positive");
    }
    const int min_rope = c.model_type == "glm5_next" ? 0 : 1;  // NoPE attention
    if (m.qk_rope_head_dim < min_rope || m.qk_rope_head_dim % 2 != 0 ||
        m.qk_rope_head_dim != c.head_dim) {
      return bad("qk_rope_head_dim must be positive and even, got ", m.qk_rope_head_dim);
    }
    if (c.kv_heads != c.heads) return bad("latent attention has as many KV heads as heads");
  }
  const MoeConfig& e = c.moe;
  if (e.n_routed == 0) return absl::OkStatus();
  if (e.n_routed < 0 || e.n_shared < 0 || e.expert_intermediate <= 0) {
    return bad("n_routed_experts (", e.n_routed, "), n_shared_experts (", e.n_shared,
               ") and moe_intermediate_size (", e.expert_intermediate, ") must be positive");
  }
  if (e.experts_per_token < 1 || e.experts_per_token > e.n_routed) {
    return bad("num_experts_per_tok (", e.experts_per_token, ") must be in [1, ", e.n_routed, "]");
  }
  if (e.n_group < 1 || e.n_routed % e.n_group != 0 || e.topk_group < 1 ||
      e.topk_group > e.n_group) {
    return bad("n_group (", e.n_group, ") must divide n_routed_experts (", e.n_routed,
               ") and topk_group (", e.topk_group, ") must be in [1, n_group]");
  }
  if (e.n_group > 1 && e.n_routed / e.n_group < 2) {
    return bad("each of the n_group (", e.n_group, ") expert groups needs at least 2 experts");
  }
  if (e.experts_per_token > e.topk_group * (e.n_routed / e.n_group)) {
    return bad("num_experts_per_tok (", e.experts_per_token, ") exceeds the experts of ",
               e.topk_group, " group(s)");
  }
  if (!(e.routed_scaling > 0.0f) || !std::isfinite(e.routed_scaling)) {
    return bad("routed_scaling_factor must be positive, got ", e.routed_scaling);
  }
  if (static_cast<int>(e.sparse_layer.size()) != c.layers) {
    return bad("the MoE layer pattern names ", e.sparse_layer.size(), " layers, the model has ",
               c.layers);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfigFields(const ModelConfig& c, const ConfigFieldNames& n) {
  auto positive = [](absl::string_view name, int v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
  };
  for (auto [name, v] :
       std::initializer_list<std::pair<absl::string_view, int>>{{n.hidden, c.hidden},
                                                                {n.intermediate, c.intermediate},
                                                                {n.layers, c.layers},
                                                                {n.heads, c.heads},
                                                                {n.kv_heads, c.kv_heads},
                                                                {n.head_dim, c.head_dim},
                                                                {n.vocab, c.vocab},
                                                                {n.max_position, c.max_position}}) {
    // A NoPE latent attention (glm5_next) has no per-head RoPE size.
    if (name == n.head_dim && v == 0 && IsMla(c) && c.model_type == "glm5_next") continue;
    if (absl::Status s = positive(name, v); !s.ok()) return s;
  }
  const LinearAttentionConfig& x = c.linear;
  if (!x.linear_layer.empty()) {
    if (static_cast<int>(x.linear_layer.size()) != c.layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer_types names ", x.linear_layer.size(),
                                                     " layers, the model has ", c.layers));
    }
    const bool any =
        std::find(x.linear_layer.begin(), x.linear_layer.end(), true) != x.linear_layer.end();
    if (any && (x.heads <= 0 || x.head_dim <= 0 || x.conv_kernel < 1)) {
      return absl::InvalidArgumentError(
          "linear attention needs linear_num_heads, linear_head_dim and "
          "linear_conv_kernel_dim to be positive");
    }
  }
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.kv_heads, " (", c.kv_heads, ") must divide ", n.heads, " (", c.heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.head_dim, " (", c.head_dim, ") must be even for RoPE"));
  }
  if (!c.head_dim_explicit && static_cast<int64_t>(c.heads) * c.head_dim != c.hidden) {
    return absl::InvalidArgumentError(absl::StrCat(n.hidden, " (", c.hidden, ") must equal ",
                                                   n.heads, " * ", n.head_dim, " (", c.heads, " * ",
                                                   c.head_dim, ")"));
  }
  if (!(c.rms_eps > 0.0f) || !std::isfinite(c.rms_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.rms_eps, " must be a positive number, got ", c.rms_eps));
  }
  if (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.rope_theta, " must be a positive number, got ", c.rope_theta));
  }
  const RopeScaling& r = c.rope_scaling;
  if (!r.type.empty()) {
    if (r.type != "linear" && r.type != "llama3" && r.type != "yarn") {
      return absl::InvalidArgumentError(
          absl::StrCat(n.rope_scaling, " type '", r.type, "' is not one of linear, llama3, yarn"));
    }
    if (!(r.factor > 0.0f) || !std::isfinite(r.factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat(n.rope_scaling, ".factor must be positive, got ", r.factor));
    }
    if (r.type == "yarn" &&
        (r.original_max_position <= 0 || !(r.beta_fast > r.beta_slow) || !(r.beta_slow > 0.0f))) {
      return absl::InvalidArgumentError(
          absl::StrCat(n.rope_scaling, ": yarn needs original_max_position_embeddings > 0 and ",
                       "beta_fast > beta_slow > 0"));
    }
    if (r.type == "llama3") {
      if (!(r.low_freq_factor > 0.0f) || !(r.high_freq_factor > r.low_freq_factor)) {
        return absl::InvalidArgumentError(
            absl::StrCat(n.rope_scaling, ".high_freq_factor (", r.high_freq_factor,
                         ") must exceed low_freq_factor (", r.low_freq_factor, ") > 0"));
      }
      if (r.original_max_position <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(n.rope_scaling, ".original_max_position_embeddings must be positive"));
      }
    }
  }
  if (c.bos_id < -1 || c.bos_id >= c.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.bos_id, " (", c.bos_id, ") is outside the vocabulary (", c.vocab, ")"));
  }
  if (c.eos_id < 0 || c.eos_id >= c.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.eos_id, " (", c.eos_id, ") is outside the vocabulary (", c.vocab, ")"));
  }
  return ValidateMoeFamily(c);
}

absl::Status ValidateConfig(const ModelConfig& c) {
  return ValidateConfigFields(c, ConfigFieldNames{});
}

namespace {

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("error reading ", path));
  return ss.str();
}

// ---------------------------------------------------------------------------
// Hugging Face directories

// Finds tensors by name across one or more safetensors shards.
class TensorSource {
 public:
  static absl::StatusOr<TensorSource> Open(const std::string& dir) {
    namespace fs = std::filesystem;
    TensorSource src;
    const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
    const std::string single_path = (fs::path(dir) / "model.safetensors").string();
    std::error_code ec;
    if (fs::exists(index_path, ec)) {
      absl::StatusOr<std::string> text = ReadTextFile(index_path);
      if (!text.ok()) return text.status();
      std::map<std::string, std::string> weight_map;
      try {
        nlohmann::json j = nlohmann::json::parse(*text);
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat(index_path, ": weight_map is missing or not an object"));
        }
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
          if (!it.value().is_string()) {
            return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for '",
                                                           it.key(), "' is not a file name"));
          }
          weight_map[it.key()] = it.value().get<std::string>();
        }
      } catch (const nlohmann::json::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
      }
      std::map<std::string, int> shard_ids;
      for (const auto& [tensor, file] : weight_map) {
        // The index may only name files next to it.
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
          return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for '",
                                                         tensor, "' names bad file '", file, "'"));
        }
        auto [it, inserted] = shard_ids.emplace(file, static_cast<int>(src.shards_.size()));
        if (inserted) {
          absl::StatusOr<SafetensorsFile> f =
              SafetensorsFile::Open((fs::path(dir) / file).string());
          if (!f.ok()) return f.status();
          src.shards_.push_back(*std::move(f));
        }
        src.where_[tensor] = it->second;
      }
      src.description_ = index_path;
    } else if (fs::exists(single_path, ec)) {
      absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(single_path);
      if (!f.ok()) return f.status();
      src.shards_.push_back(*std::move(f));
      for (const SafetensorsTensor& t : src.shards_[0].tensors()) src.where_[t.name] = 0;
      src.description_ = single_path;
    } else {
      return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors nor ",
                                              "model.safetensors.index.json is present"));
    }
    return src;
  }

  // The tensor and the file holding it; NotFound naming the tensor if absent.
  absl::StatusOr<std::pair<const SafetensorsTensor*, const SafetensorsFile*>> Get(
      const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end()) {
      return absl::NotFoundError(
          absl::StrCat("tensor '", name, "' is missing from ", description_));
    }
    const SafetensorsFile& f = shards_[it->second];
    const SafetensorsTensor* t = f.Find(name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("tensor '", name, "' is listed in ", description_,
                                              " but missing from ", f.path()));
    }
    return std::pair{t, &f};
  }

  bool Has(const std::string& name) const { return where_.count(name) > 0; }

  std::vector<std::shared_ptr<MappedFile>> Files() const {
    std::vector<std::shared_ptr<MappedFile>> out;
    for (const SafetensorsFile& f : shards_) out.push_back(f.file());
    return out;
  }

 private:
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, int> where_;
  std::string description_;
};

class HfLoader {
 public:
  HfLoader(const TensorSource& src, ModelWeights* w) : src_(src), w_(w) {}

  absl::Status GetMatrix(const std::string& name, int64_t rows, int64_t cols, Matrix* m) {
    auto got = src_.Get(name);
    if (!got.ok()) return got.status();
    auto [t, f] = *got;
    if (t->shape != std::vector<int64_t>{rows, cols}) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->path(), ": tensor '", name, "' has shape ", ShapeString(t->shape),
                       ", expected ", ShapeString({rows, cols}), " from the config"));
    }
    m->dtype = t->dtype;
    m->rows = rows;
    m->cols = cols;
    m->row_stride_bytes = cols * static_cast<int64_t>(DTypeSize(t->dtype));
    m->data = Aligned(t->data, t->size_bytes, DTypeSize(t->dtype));
    m->scale = nullptr;
    m->scale_cols = 0;
    m->row_offset = 0;
    m->col_offset = 0;
    if (t->dtype != DType::kFP8E4M3) return absl::OkStatus();

    const std::string scale_name = name + "_scale_inv";
    auto sgot = src_.Get(scale_name);
    if (!sgot.ok()) {
      return absl::NotFoundError(absl::StrCat(f->path(), ": FP8 tensor '", name,
                                              "' has no block-scale tensor '", scale_name, "'"));
    }
    auto [st, sf] = *sgot;
    const std::vector<int64_t> want{CeilDiv(rows, kFp8BlockSize), CeilDiv(cols, kFp8BlockSize)};
    if (st->shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(sf->path(), ": tensor '", scale_name,
                                                     "' has shape ", ShapeString(st->shape),
                                                     ", expected ", ShapeString(want)));
    }
    if (st->dtype == DType::kFP8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat(sf->path(), ": tensor '", scale_name, "' must be F32, BF16 or F16"));
    }
    m->scale = AsFloats(*st);
    m->scale_cols = want[1];
    return absl::OkStatus();
  }

  // `flat`: any shape of n elements (a convolution's [C, 1, K], A_log's
  // [1, 1, H, 1]), read in row-major order.
  absl::Status GetVector(const std::string& name, int64_t n, std::vector<float>* out,
                         bool flat = false) {
    auto got = src_.Get(name);
    if (!got.ok()) return got.status();
    auto [t, f] = *got;
    int64_t count = 1;
    for (int64_t d : t->shape) count *= d;
    if (flat ? count != n : t->shape != std::vector<int64_t>{n}) {
      return absl::InvalidArgumentError(absl::StrCat(f->path(), ": tensor '", name, "' has shape ",
                                                     ShapeString(t->shape), ", expected ",
                                                     ShapeString({n}), " from the config"));
    }
    if (t->dtype == DType::kFP8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->path(), ": tensor '", name, "' is FP8; norms must be F32, BF16 or F16"));
    }
    out->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t buf[4];
      size_t es = DTypeSize(t->dtype);
      std::memcpy(buf, t->data + i * es, es);  // the mapping may be unaligned
      (*out)[i] = LoadAsFloat(t->dtype, buf, 0);
    }
    return absl::OkStatus();
  }

 private:
  // Kernels read elements through typed pointers; a tensor not aligned to its
  // element size (possible with other writers) is copied into owned memory.
  const void* Aligned(const uint8_t* p, size_t bytes, size_t align) {
    if (reinterpret_cast<uintptr_t>(p) % align == 0) return p;
    auto copy = std::make_unique<std::vector<uint8_t>>(p, p + bytes);
    const void* q = copy->data();
    w_->owned.push_back(std::move(copy));
    return q;
  }

  const float* AsFloats(const SafetensorsTensor& t) {
    if (t.dtype == DType::kF32) return static_cast<const float*>(Aligned(t.data, t.size_bytes, 4));
    const int64_t n = t.NumElements();
    auto copy = std::make_unique<std::vector<uint8_t>>(n * sizeof(float));
    float* dst = reinterpret_cast<float*>(copy->data());
    const size_t es = DTypeSize(t.dtype);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t buf[4];
      std::memcpy(buf, t.data + i * es, es);
      dst[i] = LoadAsFloat(t.dtype, buf, 0);
    }
    w_->owned.push_back(std::move(copy));
    return dst;
  }

  const TensorSource& src_;
  ModelWeights* w_;
};

struct NamedMatrix {
  std::string name;
  int64_t rows, cols;
  Matrix* m;
};
struct NamedVector {
  std::string name;
  int64_t n;
  std::vector<float>* v;
  bool flat = false;  // GetVector's
};

absl::Status LoadAll(HfLoader& l, const std::vector<NamedMatrix>& mats,
                     const std::vector<NamedVector>& vecs) {
  for (const NamedMatrix& m : mats) {
    if (absl::Status s = l.GetMatrix(m.name, m.rows, m.cols, m.m); !s.ok()) return s;
  }
  for (const NamedVector& v : vecs) {
    if (absl::Status s = l.GetVector(v.name, v.n, v.v, v.flat); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// One layer of deepseek_v3 / deepseek_v32 / glm_moe_dsa in transformers'
// tensor names: latent attention, the DSA indexer where the config has one,
// and a MoE or dense feed-forward part.
// A glm5_next linear-attention layer's mixer, in Kimi Linear's names. A_log
// may be stored [H] or [1, 1, H, 1]; the convolutions [H * D, 1, K].
void LoadKdaMixer(const ModelConfig& c, const std::string& a, std::vector<NamedMatrix>* mats,
                  std::vector<NamedVector>* vecs, KdaWeights* k) {
  const LinearAttentionConfig& x = c.linear;
  const int64_t D = c.hidden, H = x.heads, HD = x.head_dim, C = H * HD;
  mats->push_back({a + "q_proj.weight", C, D, &k->wq});
  mats->push_back({a + "k_proj.weight", C, D, &k->wk});
  mats->push_back({a + "v_proj.weight", C, D, &k->wv});
  mats->push_back({a + "f_a_proj.weight", HD, D, &k->f_a});
  mats->push_back({a + "f_b_proj.weight", C, HD, &k->f_b});
  mats->push_back({a + "b_proj.weight", H, D, &k->b});
  mats->push_back({a + "g_a_proj.weight", HD, D, &k->g_a});
  mats->push_back({a + "g_b_proj.weight", C, HD, &k->g_b});
  mats->push_back({a + "o_proj.weight", D, C, &k->wo});
  vecs->push_back({a + "q_conv1d.weight", C * x.conv_kernel, &k->conv_q, true});
  vecs->push_back({a + "k_conv1d.weight", C * x.conv_kernel, &k->conv_k, true});
  vecs->push_back({a + "v_conv1d.weight", C * x.conv_kernel, &k->conv_v, true});
  vecs->push_back({a + "A_log", H, &k->a_log, true});
  vecs->push_back({a + "dt_bias", C, &k->dt_bias});
  vecs->push_back({a + "o_norm.weight", HD, &k->o_norm});
}

absl::Status LoadDeepseekLayer(HfLoader& l, const ModelConfig& c, int i, LayerWeights* L) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const MlaConfig& m = c.mla;
  const int64_t D = c.hidden, H = c.heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  std::vector<NamedMatrix> mats;
  std::vector<NamedVector> vecs{{p + "input_layernorm.weight", D, &L->attn_norm},
                                {p + "post_attention_layernorm.weight", D, &L->ffn_norm}};
  const std::string a = p + "self_attn.";
  if (c.linear.Linear(i)) {
    LoadKdaMixer(c, a, &mats, &vecs, &L->kda);
  } else {
    vecs.push_back({a + "kv_a_layernorm.weight", m.kv_lora_rank, &L->mla.kv_a_norm});
  }
  if (c.linear.Linear(i)) {
    // The feed-forward part below is the family's.
  } else if (m.q_lora_rank > 0) {
    mats.push_back({a + "q_a_proj.weight", m.q_lora_rank, D, &L->mla.wq_a});
    mats.push_back({a + "q_b_proj.weight", H * qk, m.q_lora_rank, &L->mla.wq_b});
    vecs.push_back({a + "q_a_layernorm.weight", m.q_lora_rank, &L->mla.q_a_norm});
  } else {
    mats.push_back({a + "q_proj.weight", H * qk, D, &L->mla.wq_b});
  }
  if (!c.linear.Linear(i)) {
    mats.push_back(
        {a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, D, &L->mla.wkv_a});
    mats.push_back({a + "kv_b_proj.weight", H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank,
                    &L->mla.wkv_b});
    mats.push_back({a + "o_proj.weight", D, H * m.v_head_dim, &L->mla.wo});
  }
  if (c.indexer.topk > 0 && c.indexer.FullLayer(i) && !c.linear.Linear(i)) {
    const IndexerConfig& x = c.indexer;
    if (m.q_lora_rank <= 0) {
      return absl::InvalidArgumentError("the DSA indexer reads the query latent: q_lora_rank is 0");
    }
    mats.push_back({a + "indexer.wq_b.weight", int64_t{x.heads} * x.head_dim, m.q_lora_rank,
                    &L->indexer.wq_b});
    mats.push_back({a + "indexer.wk.weight", x.head_dim, D, &L->indexer.wk});
    mats.push_back({a + "indexer.weights_proj.weight", x.heads, D, &L->indexer.weights_proj});
    vecs.push_back({a + "indexer.k_norm.weight", x.head_dim, &L->indexer.k_norm});
    vecs.push_back({a + "indexer.k_norm.bias", x.head_dim, &L->indexer.k_norm_bias});
    if (x.Pooled()) {
      mats.push_back(
          {a + "indexer.index_kpool_compress_gate", x.head_dim, D, &L->indexer.kpool_gate});
      vecs.push_back({a + "indexer.index_kpool_compress_ape", int64_t{x.kpool} * x.head_dim,
                      &L->indexer.kpool_ape, true});
    }
  }
  // Hyper-connections of the model's layers (an MTP layer's are not read:
  // such a model has no MTP drafter).
  if (c.hyper.enabled() && i < c.layers) {
    const int64_t mix = c.hyper.mix_dim(), width = int64_t{c.hyper.mult} * D;
    for (auto [name, h] : {std::pair{"hc_attn_", &L->hc_attn}, {"hc_ffn_", &L->hc_ffn}}) {
      mats.push_back({p + name + "fn", mix, width, &h->fn});
      vecs.push_back({p + name + "base", mix, &h->base});
      vecs.push_back({p + name + "scale", 3, &h->scale});
    }
  }
  const MoeConfig& e = c.moe;
  L->sparse = e.n_routed > 0 && e.sparse_layer[i];
  auto mlp = [&](const std::string& q, int64_t inter, GatedMlpWeights* g) {
    mats.push_back({q + "gate_proj.weight", inter, D, &g->w_gate});
    mats.push_back({q + "up_proj.weight", inter, D, &g->w_up});
    mats.push_back({q + "down_proj.weight", D, inter, &g->w_down});
  };
  if (!L->sparse) {
    mlp(p + "mlp.", c.intermediate, &L->mlp);
  } else {
    MoeWeights& moe = L->moe;
    mats.push_back({p + "mlp.gate.weight", e.n_routed, D, &moe.router});
    if (e.correction_bias) {
      vecs.push_back({p + "mlp.gate.e_score_correction_bias", e.n_routed, &moe.correction_bias});
    }
    moe.experts.resize(e.n_routed);
    for (int x = 0; x < e.n_routed; ++x) {
      mlp(absl::StrCat(p, "mlp.experts.", x, "."), e.expert_intermediate, &moe.experts[x]);
    }
    if (e.n_shared > 0) {
      mlp(p + "mlp.shared_experts.", int64_t{e.n_shared} * e.expert_intermediate, &moe.shared);
    }
  }
  return LoadAll(l, mats, vecs);
}

// The first MTP layer, model.layers.{layers}.*: a layer of the family (its
// own indexer, the MoE or dense part as the config says) and the fusion and
// head tensors. shared_head.head is optional (the model's lm_head then).
absl::StatusOr<std::shared_ptr<const MtpWeights>> LoadMtpLayer(HfLoader& l, const TensorSource& src,
                                                               const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const int i = c.layers;
  // LoadDeepseekLayer reads the per-layer choices at index i.
  ModelConfig mc = c;
  mc.moe.sparse_layer.push_back(c.mtp_sparse);
  if (!mc.indexer.full_layer.empty()) mc.indexer.full_layer.push_back(true);
  auto m = std::make_shared<MtpWeights>();
  if (absl::Status s = LoadDeepseekLayer(l, mc, i, &m->layer); !s.ok()) return s;
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t D = c.hidden;
  std::vector<NamedMatrix> mats{{p + "eh_proj.weight", D, 2 * D, &m->eh_proj}};
  std::vector<NamedVector> vecs{{p + "enorm.weight", D, &m->enorm},
                                {p + "hnorm.weight", D, &m->hnorm},
                                {p + "shared_head.norm.weight", D, &m->head_norm}};
  if (src.Has(p + "shared_head.head.weight")) {
    mats.push_back({p + "shared_head.head.weight", c.vocab, D, &m->head});
  } else {
    m->head = w.lm_head;
  }
  if (absl::Status s = LoadAll(l, mats, vecs); !s.ok()) return s;
  return std::shared_ptr<const MtpWeights>(std::move(m));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHfDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadTextFile(config_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<HfConfig> hf = ParseHfConfig(*text, config_path);
  if (!hf.ok()) return hf.status();
  absl::StatusOr<TensorSource> src = TensorSource::Open(dir);
  if (!src.ok()) return src.status();

  auto w = std::make_unique<ModelWeights>();
  w->config = hf->config;
  w->source = dir;
  w->files = src->Files();
  const ModelConfig& c = w->config;
  const int64_t q_dim = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.kv_heads) * c.head_dim;

  // Biases would be silently dropped; refuse instead (Qwen2 checkpoints carry them).
  for (const char* b : {"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj",
                        "kv_a_proj_with_mqa", "kv_b_proj"}) {
    std::string name = absl::StrCat("model.layers.0.self_attn.", b, ".bias");
    if (src->Has(name)) {
      return absl::UnimplementedError(
          absl::StrCat(dir, ": tensor '", name,
                       "' is present: attention projections with bias are not supported"));
    }
  }

  HfLoader l(*src, w.get());
  // Tied checkpoints store one of the two tensors (transformers' save keeps
  // lm_head.weight and aliases the embedding to it in the metadata).
  const char* embed_name = "model.embed_tokens.weight";
  if (c.tie_embeddings && !src->Has(embed_name) && src->Has("lm_head.weight")) {
    embed_name = "lm_head.weight";
  }
  if (absl::Status s = l.GetMatrix(embed_name, c.vocab, c.hidden, &w->embed); !s.ok()) return s;
  w->layers.resize(c.layers);
  for (int i = 0; i < c.layers && IsMla(c); ++i) {
    if (absl::Status s = LoadDeepseekLayer(l, c, i, &w->layers[i]); !s.ok()) return s;
  }
  for (int i = 0; i < c.layers && !IsMla(c); ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& L = w->layers[i];
    struct M {
      const char* name;
      int64_t rows, cols;
      Matrix* m;
    };
    for (const M& m : {M{"self_attn.q_proj.weight", q_dim, c.hidden, &L.attn.wq},
                       M{"self_attn.k_proj.weight", kv_dim, c.hidden, &L.attn.wk},
                       M{"self_attn.v_proj.weight", kv_dim, c.hidden, &L.attn.wv},
                       M{"self_attn.o_proj.weight", c.hidden, q_dim, &L.attn.wo},
                       M{"mlp.gate_proj.weight", c.intermediate, c.hidden, &L.mlp.w_gate},
                       M{"mlp.up_proj.weight", c.intermediate, c.hidden, &L.mlp.w_up},
                       M{"mlp.down_proj.weight", c.hidden, c.intermediate, &L.mlp.w_down}}) {
      if (absl::Status s = l.GetMatrix(p + m.name, m.rows, m.cols, m.m); !s.ok()) return s;
    }
    if (absl::Status s = l.GetVector(p + "input_layernorm.weight", c.hidden, &L.attn_norm);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = l.GetVector(p + "post_attention_layernorm.weight", c.hidden, &L.ffn_norm);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = l.GetVector("model.norm.weight", c.hidden, &w->final_norm); !s.ok()) {
    return s;
  }
  // DeepSeek-V4 weighs the streams for the head; GLM-5.3-Flash's checkpoints
  // have no hc_head tensors and take their mean.
  if (c.hyper.enabled() && src->Has("model.hc_head_fn")) {
    const int64_t n = c.hyper.mult;
    std::vector<NamedMatrix> mats{{"model.hc_head_fn", n, n * c.hidden, &w->hc_head.fn}};
    std::vector<NamedVector> vecs{{"model.hc_head_base", n, &w->hc_head.base},
                                  {"model.hc_head_scale", 1, &w->hc_head.scale}};
    if (absl::Status s = LoadAll(l, mats, vecs); !s.ok()) return s;
  }
  if (c.tie_embeddings) {
    w->lm_head = w->embed;
  } else if (absl::Status s = l.GetMatrix("lm_head.weight", c.vocab, c.hidden, &w->lm_head);
             !s.ok()) {
    return s;
  }
  if (IsMla(c) && c.mtp_layers > 0) {
    absl::StatusOr<std::shared_ptr<const MtpWeights>> mtp = LoadMtpLayer(l, *src, *w);
    if (!mtp.ok()) return mtp.status();
    w->mtp = *std::move(mtp);
  }
  // A linear-attention layer 0 (glm5_next) has q_proj, not the latent.
  const bool kda0 = c.linear.Linear(0);
  const Matrix& probe = kda0       ? w->layers[0].kda.wq
                        : IsMla(c) ? w->layers[0].mla.wkv_a
                                   : w->layers[0].attn.wq;
  w->config.weight_dtype = probe.dtype;
  if (hf->fp8_block_scaled && w->config.weight_dtype != DType::kFP8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": config.json declares FP8 quantization_config but model.layers.0.self_attn.",
        IsMla(c) && !kda0 ? "kv_a_proj_with_mqa" : "q_proj", ".weight is ",
        std::string(DTypeName(w->config.weight_dtype))));
  }
  return w;
}

// ---------------------------------------------------------------------------
// llama2.c checkpoints (run.c, legacy version 0)

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2c(const std::string& path) {
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const MappedFile& f = **file;
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  if (f.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": llama2.c checkpoint is ", f.size(),
                                                   " bytes, shorter than its ", kHeaderBytes,
                                                   "-byte header"));
  }
  int32_t h[7];
  std::memcpy(h, f.data(), kHeaderBytes);
  // export.py's version 1/2 formats start with the magic "ak42".
  if (static_cast<uint32_t>(h[0]) == 0x616b3432u) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": llama2.c export format v1/v2 is not supported; export with --version 0"));
  }
  const int32_t dim = h[0], hidden_dim = h[1], n_layers = h[2], n_heads = h[3], n_kv_heads = h[4],
                seq_len = h[6];
  const int32_t vocab_signed = h[5];
  const char* names[] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                         "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    if (i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": llama2.c header field ", names[i], " is invalid (", h[i], ")"));
    }
  }
  if (dim % n_heads != 0 || n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": llama2.c header: n_heads (", n_heads,
                                                   ") must divide dim (", dim, ") and n_kv_heads (",
                                                   n_kv_heads, ") must divide n_heads"));
  }
  const bool tied = vocab_signed > 0;
  const int64_t vocab = tied ? vocab_signed : -static_cast<int64_t>(vocab_signed);
  const int64_t head_size = dim / n_heads;
  const int64_t kv_dim = static_cast<int64_t>(dim) * n_kv_heads / n_heads;
  const int64_t L = n_layers, D = dim, H = hidden_dim;

  // Each count is at most ~2^31 * 2^31 * 2^31 before checks; use 128-bit.
  using u128 = unsigned __int128;
  struct Part {
    const char* name;
    u128 floats;
  };
  const Part parts[] = {
      {"token_embedding", u128(vocab) * D},
      {"rms_att", u128(L) * D},
      {"wq", u128(L) * D * D},
      {"wk", u128(L) * kv_dim * D},
      {"wv", u128(L) * kv_dim * D},
      {"wo", u128(L) * D * D},
      {"rms_ffn", u128(L) * D},
      {"w1", u128(L) * H * D},
      {"w2", u128(L) * D * H},
      {"w3", u128(L) * H * D},
      {"rms_final", u128(D)},
      {"freq_cis_real", u128(seq_len) * (head_size / 2)},
      {"freq_cis_imag", u128(seq_len) * (head_size / 2)},
      {"wcls", tied ? u128(0) : u128(vocab) * D},
  };
  u128 total = kHeaderBytes;
  for (const Part& p : parts) total += p.floats * sizeof(float);
  if (total != f.size()) {
    std::string expected = total > u128(UINT64_MAX) ? std::string("more than 2^64")
                                                    : absl::StrCat(static_cast<uint64_t>(total));
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": llama2.c checkpoint size mismatch: header (dim=", dim,
                     ", hidden_dim=", hidden_dim, ", n_layers=", n_layers, ", n_heads=", n_heads,
                     ", n_kv_heads=", n_kv_heads, ", vocab_size=", vocab_signed,
                     ", seq_len=", seq_len, ") implies ", expected, " bytes, file has ", f.size(),
                     " bytes", total > f.size() ? " (truncated)" : " (trailing data)"));
  }

  auto w = std::make_unique<ModelWeights>();
  ModelConfig& c = w->config;
  c.model_type = "llama";
  c.hidden = dim;
  c.intermediate = hidden_dim;
  c.layers = n_layers;
  c.heads = n_heads;
  c.kv_heads = n_kv_heads;
  c.head_dim = static_cast<int>(head_size);
  c.head_dim_explicit = false;
  c.vocab = static_cast<int>(vocab);
  c.max_position = seq_len;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_layout = RopeLayout::kInterleaved;
  c.tie_embeddings = tied;
  c.bos_id = 1;
  c.eos_id = 2;
  c.weight_dtype = DType::kF32;
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": llama2.c header: ", s.message()));
  }
  w->source = path;

  // 28-byte header on a page-aligned mapping: every array is 4-byte aligned.
  const float* p = reinterpret_cast<const float*>(f.data() + kHeaderBytes);
  const float* base[14];
  for (int i = 0; i < 14; ++i) {
    base[i] = p;
    p += static_cast<size_t>(parts[i].floats);
  }
  auto matrix = [](const float* data, int64_t rows, int64_t cols) {
    Matrix m;
    m.dtype = DType::kF32;
    m.rows = rows;
    m.cols = cols;
    m.data = data;
    m.row_stride_bytes = cols * static_cast<int64_t>(sizeof(float));
    return m;
  };
  auto vec = [](const float* data, int64_t n) { return std::vector<float>(data, data + n); };
  w->embed = matrix(base[0], vocab, D);
  w->layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w->layers[l];
    lw.attn_norm = vec(base[1] + l * D, D);
    lw.attn.wq = matrix(base[2] + l * D * D, D, D);
    lw.attn.wk = matrix(base[3] + l * kv_dim * D, kv_dim, D);
    lw.attn.wv = matrix(base[4] + l * kv_dim * D, kv_dim, D);
    lw.attn.wo = matrix(base[5] + l * D * D, D, D);
    lw.ffn_norm = vec(base[6] + l * D, D);
    lw.mlp.w_gate = matrix(base[7] + l * H * D, H, D);
    lw.mlp.w_down = matrix(base[8] + l * D * H, D, H);
    lw.mlp.w_up = matrix(base[9] + l * H * D, H, D);
  }
  w->final_norm = vec(base[10], D);
  w->lm_head = tied ? w->embed : matrix(base[13], vocab, D);
  w->files.push_back(*std::move(file));
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    return absl::NotFoundError(absl::StrCat("model path ", path, " does not exist"));
  absl::StatusOr<std::unique_ptr<ModelWeights>> w;
  if (fs::is_directory(st)) {
    w = LoadHfDirectory(path);
  } else if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0) {
    w = LoadLlama2c(path);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a model; expected a Hugging Face directory or a llama2.c .bin checkpoint"));
  }
  if (w.ok()) {
    const ModelConfig& c = (*w)->config;
    (*w)->shard = TpShard{0, 1, 0, c.heads, 0, c.kv_heads, 0, c.intermediate, 0, c.vocab};
    (*w)->shard.expert_intermediate = c.moe.expert_intermediate;
    (*w)->shard.shared_intermediate = c.moe.n_shared * c.moe.expert_intermediate;
    (*w)->shard.experts = c.moe.n_routed;
    (*w)->shard.linear_heads = c.linear.heads;
  }
  return w;
}

}  // namespace ringlane::worker
