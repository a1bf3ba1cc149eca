#include "worker/kv_cache.h"

#include <cmath>
#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::worker {

namespace {

absl::Status ValidateShape(int layers, int kv_heads, int head_dim, const KvPoolSpec& spec,
                           int planes) {
  if (planes != 1 && planes != 2) return absl::InvalidArgumentError("KV cache: 1 or 2 planes");
  if (layers <= 0 || kv_heads <= 0 || head_dim <= 0) {
    return absl::InvalidArgumentError("KV cache: layers, kv_heads and head_dim must be positive");
  }
  if (spec.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks (", spec.num_blocks,
                                                   ") and block_size (", spec.block_size,
                                                   ") must be positive"));
  }
  if (spec.dtype == DType::kF16) {
    return absl::InvalidArgumentError("KV cache dtype must be f32, bf16 or fp8");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> KvCache::BlockBytes(int layers, int kv_heads, int head_dim,
                                            const KvPoolSpec& spec, int planes) {
  if (absl::Status st = ValidateShape(layers, kv_heads, head_dim, spec, planes); !st.ok()) {
    return st;
  }
  // The same arithmetic as the constructor, which owns the layout.
  return KvCache(layers, kv_heads, head_dim, spec, planes).block_bytes_;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int layers, int kv_heads, int head_dim,
                                                         const KvPoolSpec& spec, int planes) {
  // The pool's size is checked between the shape and the dtype, so that each
  // bad spec keeps the message it always had.
  if (spec.num_blocks <= 0 && layers > 0 && kv_heads > 0 && head_dim > 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks (", spec.num_blocks,
                                                   ") and block_size (", spec.block_size,
                                                   ") must be positive"));
  }
  if (absl::Status st = ValidateShape(layers, kv_heads, head_dim, spec, planes); !st.ok()) {
    return st;
  }
  std::unique_ptr<KvCache> kv(new KvCache(layers, kv_heads, head_dim, spec, planes));
  try {
    kv->data_.assign(static_cast<size_t>(kv->block_bytes_) * spec.num_blocks, 0);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate ", spec.num_blocks,
                                                     " blocks of ", kv->block_bytes_, " bytes"));
  }
  return kv;
}

KvCache::KvCache(int layers, int kv_heads, int head_dim, const KvPoolSpec& spec, int planes)
    : layers_(layers),
      planes_(planes),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      spec_(spec),
      esize_(static_cast<int64_t>(DTypeSize(spec.dtype))) {
  elems_bytes_ = int64_t{layers} * planes * spec.block_size * kv_heads * head_dim * esize_;
  block_bytes_ = elems_bytes_;
  if (spec.dtype == DType::kFP8E4M3) {
    block_bytes_ += int64_t{layers} * planes * spec.block_size * kv_heads * int64_t{sizeof(float)};
  }
  for (int i = 0; i < 256; ++i) fp8_lut_[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(i));
}

int64_t KvCache::ElemOffset(int layer, int kv, int slot, int head) const {
  int64_t idx = ((int64_t{layer} * planes_ + kv) * spec_.block_size + slot) * kv_heads_ + head;
  return idx * head_dim_ * esize_;
}

int64_t KvCache::ScaleOffset(int layer, int kv, int slot, int head) const {
  int64_t idx = ((int64_t{layer} * planes_ + kv) * spec_.block_size + slot) * kv_heads_ + head;
  return elems_bytes_ + idx * int64_t{sizeof(float)};
}

void KvCache::Store(int32_t block, int slot, int layer, int kv, const float* src) {
  uint8_t* base = BlockData(block);
  for (int h = 0; h < kv_heads_; ++h) {
    const float* s = src + h * head_dim_;
    uint8_t* dst = base + ElemOffset(layer, kv, slot, h);
    switch (spec_.dtype) {
      case DType::kF32:
        std::memcpy(dst, s, head_dim_ * sizeof(float));
        break;
      case DType::kBF16: {
        auto* d = reinterpret_cast<uint16_t*>(dst);
        for (int i = 0; i < head_dim_; ++i) d[i] = FloatToBf16(s[i]);
        break;
      }
      case DType::kF16: {
        auto* d = reinterpret_cast<uint16_t*>(dst);
        for (int i = 0; i < head_dim_; ++i) d[i] = FloatToF16(s[i]);
        break;
      }
      case DType::kFP8E4M3: {
        // Per-(token, head) scale: depends on this token's values only.
        float amax = 0.0f;
        for (int i = 0; i < head_dim_; ++i) amax = std::fmax(amax, std::fabs(s[i]));
        float scale = amax > 0.0f && std::isfinite(amax) ? amax / kFp8E4M3Max : 1.0f;
        for (int i = 0; i < head_dim_; ++i) dst[i] = FloatToFp8E4M3(s[i] / scale);
        std::memcpy(base + ScaleOffset(layer, kv, slot, h), &scale, sizeof(float));
        break;
      }
    }
  }
}

void KvCache::Gather(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv, int head,
                     float* dst, int64_t ld) const {
  const int bs = spec_.block_size;
  for (int64_t pos = 0; pos < n; ++pos) {
    const uint8_t* base = BlockData(block_ids[pos / bs]);
    const int slot = static_cast<int>(pos % bs);
    const uint8_t* src = base + ElemOffset(layer, kv, slot, head);
    float* d = dst + pos * ld;
    switch (spec_.dtype) {
      case DType::kF32:
        std::memcpy(d, src, head_dim_ * sizeof(float));
        break;
      case DType::kBF16: {
        auto* s = reinterpret_cast<const uint16_t*>(src);
        for (int i = 0; i < head_dim_; ++i) d[i] = Bf16ToFloat(s[i]);
        break;
      }
      case DType::kF16: {
        auto* s = reinterpret_cast<const uint16_t*>(src);
        for (int i = 0; i < head_dim_; ++i) d[i] = F16ToFloat(s[i]);
        break;
      }
      case DType::kFP8E4M3: {
        float scale;
        std::memcpy(&scale, base + ScaleOffset(layer, kv, slot, head), sizeof(float));
        for (int i = 0; i < head_dim_; ++i) d[i] = fp8_lut_[src[i]] * scale;
        break;
      }
    }
  }
}

}  // namespace ringlane::worker
