// The KV pool of one rank: fixed-size blocks of `block_size` token slots, each
// holding K and V of every layer and KV head in the pool's dtype. FP8 entries
// carry one float scale per (token, KV head), computed from that token alone,
// so a value never depends on how its prompt was chunked and a stored block is
// never requantized.
//
// Block layout (so a block is one contiguous byte range for export/import):
//   for layer, for kv in {K, V}: [block_size][kv_heads][head_dim] elements
//   then, FP8 only, for layer, for kv: [block_size][kv_heads] float scales.
// A latent cache (MLA) has one plane per layer instead of K and V: one "head"
// holding the latent and the rope key of each token (kv is always 0).
//
// Owned by a backend, so by the worker's step loop thread (the only thread
// that runs rounds and KV block moves, worker/server/step_loop.h). Within one
// round, Store/Gather on different (block, slot) pairs may run on several of
// the backend's compute threads at once.
#ifndef RINGLANE_WORKER_KV_CACHE_H_
#define RINGLANE_WORKER_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/dtype.h"

namespace ringlane::worker {

struct KvPoolSpec {
  int num_blocks = 0;
  int block_size = 16;  // tokens per block
  DType dtype = DType::kF32;
};

class KvCache {
 public:
  // Errors: InvalidArgument for a non-positive size or an unsupported dtype
  // (F16 is not offered), ResourceExhausted when the pool cannot be allocated.
  // `planes`: 2 for K and V, 1 for a latent cache.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int layers, int kv_heads, int head_dim,
                                                         const KvPoolSpec& spec, int planes = 2);

  // Bytes of one block of a pool of this shape (spec.num_blocks is not looked
  // at), without allocating anything: what Create would give block_bytes().
  // InvalidArgument as Create.
  static absl::StatusOr<int64_t> BlockBytes(int layers, int kv_heads, int head_dim,
                                            const KvPoolSpec& spec, int planes = 2);

  const KvPoolSpec& spec() const { return spec_; }
  // Floats per head and token: a latent cache's whole row.
  int head_dim() const { return head_dim_; }
  int64_t block_bytes() const { return block_bytes_; }

  // Stores one token's K (kv = 0) or V (kv = 1) — or its latent (kv = 0) — for all KV heads
  // (src: [kv_heads][head_dim] floats) into (block, slot) of `layer`.
  void Store(int32_t block, int slot, int layer, int kv, const float* src);

  // Converts positions [0, n) of KV head `head` of a sequence whose context
  // lies in `block_ids` to float rows of `ld` floats: dst[pos * ld + d].
  void Gather(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv, int head,
              float* dst, int64_t ld) const;

  uint8_t* BlockData(int32_t block) { return data_.data() + block * block_bytes_; }
  const uint8_t* BlockData(int32_t block) const { return data_.data() + block * block_bytes_; }

 private:
  KvCache(int layers, int kv_heads, int head_dim, const KvPoolSpec& spec, int planes);

  int64_t ElemOffset(int layer, int kv, int slot, int head) const;
  int64_t ScaleOffset(int layer, int kv, int slot, int head) const;

  const int layers_;
  const int planes_;  // 2 (K, V) or 1 (latent)
  const int kv_heads_;
  const int head_dim_;
  const KvPoolSpec spec_;
  const int64_t esize_;
  int64_t elems_bytes_ = 0;  // element region of one block
  int64_t block_bytes_ = 0;
  std::vector<uint8_t> data_;
  float fp8_lut_[256];
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_KV_CACHE_H_
