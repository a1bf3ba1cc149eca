#include "worker/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
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

absl::Status ValidateSplit(int kv_heads, int head_dim, int planes, const LatentSplit& split) {
  if (split.latent == 0 && split.rope == 0 && split.index == 0) return absl::OkStatus();
  if (planes != 1 || kv_heads != 1 || split.latent <= 0 || split.rope < 0 || split.index < 0 ||
      split.latent + split.rope + split.index != head_dim) {
    return absl::InvalidArgumentError(
        "KV cache: a latent split needs one plane of one head whose "
        "width is latent + rope + index");
  }
  return absl::OkStatus();
}

}  // namespace

int64_t KvCache::LatentRowBytes(const LatentSplit& split, DType dtype) {
  if (dtype != DType::kFP8E4M3) {
    return int64_t{split.latent + split.rope + split.index} *
           static_cast<int64_t>(DTypeSize(dtype));
  }
  const int64_t groups = (split.latent + kLatentGroup - 1) / kLatentGroup;
  return split.latent + groups * 4 + int64_t{split.rope} * 2 +
         (split.index > 0 ? split.index + 4 : 0);
}

absl::StatusOr<int64_t> KvCache::BlockBytes(int layers, int kv_heads, int head_dim,
                                            const KvPoolSpec& spec, int planes, LatentSplit split) {
  if (absl::Status st = ValidateShape(layers, kv_heads, head_dim, spec, planes); !st.ok()) {
    return st;
  }
  if (absl::Status st = ValidateSplit(kv_heads, head_dim, planes, split); !st.ok()) return st;
  // The same arithmetic as the constructor, which owns the layout.
  return KvCache(layers, kv_heads, head_dim, spec, planes, split).block_bytes_;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int layers, int kv_heads, int head_dim,
                                                         const KvPoolSpec& spec, int planes,
                                                         LatentSplit split) {
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
  if (absl::Status st = ValidateSplit(kv_heads, head_dim, planes, split); !st.ok()) return st;
  std::unique_ptr<KvCache> kv(new KvCache(layers, kv_heads, head_dim, spec, planes, split));
  // Anonymous memory from a 2 MiB boundary: rows start on cache lines (a
  // heap vector started 16 bytes into a page, and every 64-byte row of a
  // head straddled two lines: 1.5x decode at 32768 positions, README), and
  // where the kernel grants huge pages they back the pool from its first
  // byte (decode reads every block of a long context every step, in the
  // order the pool handed them out).
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(kv->block_bytes_) * spec.num_blocks;
  void* p = bytes / static_cast<size_t>(spec.num_blocks) == static_cast<size_t>(kv->block_bytes_)
                ? ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate ", spec.num_blocks,
                                                     " blocks of ", kv->block_bytes_, " bytes"));
  }
  kv->mapping_ = p;
  kv->mapped_bytes_ = bytes + kHugePage;
  kv->data_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) &
                                         ~static_cast<uintptr_t>(kHugePage - 1));
#ifdef MADV_HUGEPAGE
  ::madvise(kv->data_, (bytes + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint
#endif
  // Every page taken now, as the zeroed vector this replaced did: a pool
  // the machine cannot hold fails at start-up, not at some later step.
  std::memset(kv->data_, 0, bytes);
  return kv;
}

KvCache::~KvCache() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

KvCache::KvCache(int layers, int kv_heads, int head_dim, const KvPoolSpec& spec, int planes,
                 LatentSplit split)
    : layers_(layers),
      planes_(planes),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      spec_(spec),
      split_(split),
      esize_(static_cast<int64_t>(DTypeSize(spec.dtype))) {
  for (int i = 0; i < 256; ++i) fp8_lut_[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(i));
  if (packed()) {
    // One packed record per (layer, slot); its scales are inside it.
    row_bytes_ = LatentRowBytes(split, spec.dtype);
    elems_bytes_ = block_bytes_ = int64_t{layers} * spec.block_size * row_bytes_;
    return;
  }
  elems_bytes_ = int64_t{layers} * planes * spec.block_size * kv_heads * head_dim * esize_;
  block_bytes_ = elems_bytes_;
  if (spec.dtype == DType::kFP8E4M3) {
    block_bytes_ += int64_t{layers} * planes * spec.block_size * kv_heads * int64_t{sizeof(float)};
  }
}

namespace {

// E4M3 values of `n` floats with one scale from their own largest magnitude,
// so a token's bytes never depend on another token's.
float QuantizeFp8(const float* src, int n, uint8_t* dst) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(src[i]));
  const float scale = amax > 0.0f && std::isfinite(amax) ? amax / kFp8E4M3Max : 1.0f;
  for (int i = 0; i < n; ++i) dst[i] = FloatToFp8E4M3(src[i] / scale);
  return scale;
}

}  // namespace

void KvCache::StorePacked(uint8_t* dst, const float* src) const {
  const int C = split_.latent, R = split_.rope, I = split_.index;
  const int groups = (C + kLatentGroup - 1) / kLatentGroup;
  uint8_t* scales = dst + C;
  for (int g = 0; g < groups; ++g) {
    const int c0 = g * kLatentGroup, n = std::min(kLatentGroup, C - c0);
    const float scale = QuantizeFp8(src + c0, n, dst + c0);
    std::memcpy(scales + 4 * g, &scale, 4);
  }
  uint8_t* rope = scales + 4 * groups;
  for (int i = 0; i < R; ++i) {
    const uint16_t v = FloatToBf16(src[C + i]);
    std::memcpy(rope + 2 * i, &v, 2);
  }
  if (I > 0) {
    uint8_t* index = rope + 2 * R;
    const float scale = QuantizeFp8(src + C + R, I, index);
    std::memcpy(index + I, &scale, 4);
  }
}

void KvCache::GatherPacked(const uint8_t* src, int col0, int cols, float* dst) const {
  const int C = split_.latent, R = split_.rope, I = split_.index;
  const int groups = (C + kLatentGroup - 1) / kLatentGroup;
  const uint8_t* scales = src + C;
  // Whole parts only (see GatherColumns): the latent and rope key, then the
  // index key; dst starts at col0.
  const bool latent_part = col0 == 0, index_part = I > 0 && col0 + cols == C + R + I;
  dst -= col0;
  for (int g = 0; g < groups && latent_part; ++g) {
    float scale;
    std::memcpy(&scale, scales + 4 * g, 4);
    const int c0 = g * kLatentGroup, n = std::min(kLatentGroup, C - c0);
    for (int i = 0; i < n; ++i) dst[c0 + i] = fp8_lut_[src[c0 + i]] * scale;
  }
  const uint8_t* rope = scales + 4 * groups;
  for (int i = 0; i < R && latent_part; ++i) {
    uint16_t v;
    std::memcpy(&v, rope + 2 * i, 2);
    dst[C + i] = Bf16ToFloat(v);
  }
  if (index_part) {
    const uint8_t* index = rope + 2 * R;
    float scale;
    std::memcpy(&scale, index + I, 4);
    for (int i = 0; i < I; ++i) dst[C + R + i] = fp8_lut_[index[i]] * scale;
  }
}

int64_t KvCache::ElemOffset(int layer, int kv, int slot, int head) const {
  int64_t idx = ((int64_t{layer} * planes_ + kv) * spec_.block_size + slot) * kv_heads_ + head;
  return idx * head_dim_ * esize_;
}

int64_t KvCache::ScaleOffset(int layer, int kv, int slot, int head) const {
  int64_t idx = ((int64_t{layer} * planes_ + kv) * spec_.block_size + slot) * kv_heads_ + head;
  return elems_bytes_ + idx * int64_t{sizeof(float)};
}

KvCache::HeadRows KvCache::RowsOf(int32_t block, int layer, int kv, int head) const {
  const uint8_t* base = BlockData(block);
  const bool fp8 = spec_.dtype == DType::kFP8E4M3;
  return {base + ElemOffset(layer, kv, 0, head), int64_t{kv_heads_} * head_dim_ * esize_,
          fp8 ? base + ScaleOffset(layer, kv, 0, head) : nullptr,
          int64_t{kv_heads_} * static_cast<int64_t>(sizeof(float))};
}

void KvCache::PrefetchRows(int32_t block, int layer, int kv, int head) const {
  const int64_t row_bytes = int64_t{head_dim_} * esize_;
  if (row_bytes < 64) return;
  const HeadRows rows = RowsOf(block, layer, kv, head);
  for (int s = 0; s < spec_.block_size; ++s) {
    for (int64_t b = 0; b < row_bytes; b += 64) {
      __builtin_prefetch(rows.elems + s * rows.slot_stride + b, 0, 0);
    }
  }
  if (rows.scales == nullptr) return;
  for (int64_t b = 0; b < spec_.block_size * rows.scale_stride; b += 64) {
    __builtin_prefetch(rows.scales + b, 0, 0);
  }
}

void KvCache::Store(int32_t block, int slot, int layer, int kv, const float* src) {
  uint8_t* base = BlockData(block);
  if (packed()) {
    StorePacked(base + (int64_t{layer} * spec_.block_size + slot) * row_bytes_, src);
    return;
  }
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
  GatherStrided(block_ids, n, layer, kv, head, dst, ld, 1);
}

void KvCache::GatherTransposed(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv,
                               int head, float* dst, int64_t ld) const {
  GatherStrided(block_ids, n, layer, kv, head, dst, 1, ld);
}

void KvCache::GatherStrided(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv,
                            int head, float* dst, int64_t pos_stride, int64_t dim_stride) const {
  const int hd = head_dim_;
  if (packed()) {
    std::vector<float> row(dim_stride == 1 ? 0 : hd);
    for (int64_t pos = 0; pos < n; ++pos) {
      float* out = dst + pos * pos_stride;
      ReadRow(block_ids, pos, layer, kv, head, 0, hd, dim_stride == 1 ? out : row.data());
      if (dim_stride != 1) {
        for (int d = 0; d < hd; ++d) out[d * dim_stride] = row[d];
      }
    }
    return;
  }
  // Decode reads the whole context every step: per block, the offsets once
  // and the dtype's conversion in a loop over its slots, not a call and a
  // copy per position (a head of 8 floats is 32 bytes).
  const int bs = spec_.block_size;
  for (int64_t first = 0; first < n; first += bs) {
    const HeadRows rows = RowsOf(block_ids[first / bs], layer, kv, head);
    const int slots = static_cast<int>(std::min<int64_t>(bs, n - first));
    float* out = dst + first * pos_stride;
    // A value at a time, out-of-order execution does not reach the next
    // block's loads on its own.
    if (first + bs < n) PrefetchRows(block_ids[first / bs + 1], layer, kv, head);
    for (int s = 0; s < slots; ++s) {
      const uint8_t* src = rows.elems + s * rows.slot_stride;
      float* o = out + s * pos_stride;
      switch (spec_.dtype) {
        case DType::kF32:
          if (dim_stride == 1) {
            std::memcpy(o, src, hd * sizeof(float));
          } else {
            for (int d = 0; d < hd; ++d) std::memcpy(o + d * dim_stride, src + 4 * d, 4);
          }
          break;
        case DType::kBF16:
        case DType::kF16: {
          const bool bf16 = spec_.dtype == DType::kBF16;
          for (int d = 0; d < hd; ++d) {
            uint16_t v;
            std::memcpy(&v, src + 2 * d, 2);
            o[d * dim_stride] = bf16 ? Bf16ToFloat(v) : F16ToFloat(v);
          }
          break;
        }
        case DType::kFP8E4M3: {
          float scale;
          std::memcpy(&scale, rows.scales + s * rows.scale_stride, sizeof(float));
          for (int d = 0; d < hd; ++d) o[d * dim_stride] = fp8_lut_[src[d]] * scale;
          break;
        }
      }
    }
  }
}

void KvCache::ReadRow(absl::Span<const int32_t> block_ids, int64_t pos, int layer, int kv, int head,
                      int col0, int cols, float* dst) const {
  const int bs = spec_.block_size;
  const uint8_t* base = BlockData(block_ids[pos / bs]);
  const int slot = static_cast<int>(pos % bs);
  if (packed()) {
    GatherPacked(base + (int64_t{layer} * bs + slot) * row_bytes_, col0, cols, dst);
    return;
  }
  const uint8_t* src = base + ElemOffset(layer, kv, slot, head) + int64_t{col0} * esize_;
  switch (spec_.dtype) {
    case DType::kF32:
      std::memcpy(dst, src, cols * sizeof(float));
      break;
    case DType::kBF16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (int i = 0; i < cols; ++i) dst[i] = Bf16ToFloat(s[i]);
      break;
    }
    case DType::kF16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (int i = 0; i < cols; ++i) dst[i] = F16ToFloat(s[i]);
      break;
    }
    case DType::kFP8E4M3: {
      float scale;
      std::memcpy(&scale, base + ScaleOffset(layer, kv, slot, head), sizeof(float));
      for (int i = 0; i < cols; ++i) dst[i] = fp8_lut_[src[i]] * scale;
      break;
    }
  }
}

void KvCache::GatherColumns(absl::Span<const int32_t> block_ids, int64_t first, int64_t n,
                            int layer, int col0, int cols, float* dst, int64_t ld) const {
  for (int64_t i = 0; i < n; ++i) {
    ReadRow(block_ids, first + i, layer, 0, 0, col0, cols, dst + i * ld);
  }
}

void KvCache::GatherPositions(absl::Span<const int32_t> block_ids,
                              absl::Span<const int32_t> positions, int layer, int col0, int cols,
                              float* dst, int64_t ld) const {
  for (size_t i = 0; i < positions.size(); ++i) {
    ReadRow(block_ids, positions[i], layer, 0, 0, col0, cols, dst + static_cast<int64_t>(i) * ld);
  }
}

}  // namespace ringlane::worker
