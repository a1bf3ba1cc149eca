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

// How a latent cache row splits (MLA): the compressed latent, the RoPE key,
// and the DSA indexer's key (0 without one). With an FP8 pool such a row is
// stored as DeepSeek's fp8_ds_mla layout does: the latent in E4M3 with one
// float scale per 128 values, the RoPE key in BF16 (it is small and rotates
// precision-sensitive angles), then the indexer's key in E4M3 with one scale:
// 512 + 4 * 4 + 64 * 2 = 656 bytes for DeepSeek-V3's shape, plus 128 + 4 for
// a V3.2 indexer key.
struct LatentSplit {
  int latent = 0;
  int rope = 0;
  int index = 0;
};

struct KvPoolSpec {
  int num_blocks = 0;
  int block_size = 16;  // tokens per block
  DType dtype = DType::kF32;
  // Models with recurrent layers: sequences that can hold a state at once
  // (SeqStep::state_slot), each a float32 slot of every such layer's state.
  int state_slots = 0;
  // ... and checkpoints of such a state (SeqStep::restore_checkpoint,
  // state_saves), each the size of a slot; the router asks for them at
  // multiples of state_checkpoint_interval positions (advertised only).
  int state_checkpoints = 0;
  int64_t state_checkpoint_interval = 0;
};

class KvCache {
 public:
  // Errors: InvalidArgument for a non-positive size or an unsupported dtype
  // (F16 is not offered), ResourceExhausted when the pool cannot be allocated.
  // `planes`: 2 for K and V, 1 for a latent cache; `split` (latent caches
  // only, its parts summing to head_dim) selects the packed FP8 layout above.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int layers, int kv_heads, int head_dim,
                                                         const KvPoolSpec& spec, int planes = 2,
                                                         LatentSplit split = {});

  // Bytes of one block of a pool of this shape (spec.num_blocks is not looked
  // at), without allocating anything: what Create would give block_bytes().
  // InvalidArgument as Create.
  static absl::StatusOr<int64_t> BlockBytes(int layers, int kv_heads, int head_dim,
                                            const KvPoolSpec& spec, int planes = 2,
                                            LatentSplit split = {});

  // Bytes one token's row of one layer takes in a latent pool of this split
  // and dtype (the packed layout for FP8).
  static int64_t LatentRowBytes(const LatentSplit& split, DType dtype);

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
  // The same values transposed, a row of `ld` floats per dimension:
  // dst[d * ld + pos] (attention's K, scored position-wise without a
  // transposing pass of its own).
  void GatherTransposed(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv, int head,
                        float* dst, int64_t ld) const;

  // Latent caches: columns [col0, col0 + cols) of the rows of positions
  // [first, first + n) (GatherColumns) or of the listed positions, in order
  // (GatherPositions), to dst rows of `ld` floats. With the packed FP8 layout
  // the range must be whole parts: the latent and rope key together, the
  // index key, or the row. Lets attention skip the indexer's keys and the
  // indexer everything else, and a sparse row read only its chosen positions.
  void GatherColumns(absl::Span<const int32_t> block_ids, int64_t first, int64_t n, int layer,
                     int col0, int cols, float* dst, int64_t ld) const;
  void GatherPositions(absl::Span<const int32_t> block_ids, absl::Span<const int32_t> positions,
                       int layer, int col0, int cols, float* dst, int64_t ld) const;

  // Where KV head `head`'s rows of (layer, kv) lie in `block`, for a pool
  // without the packed latent layout: slot s's head_dim() elements, in the
  // pool's dtype, at elems + s * slot_stride bytes, and with FP8 its float
  // scale at scales + s * scale_stride bytes (nullptr otherwise). Lets a
  // backend convert a context with vector code of its own; Gather and
  // GatherTransposed are the reference such code must equal bit for bit.
  struct HeadRows {
    const uint8_t* elems;
    int64_t slot_stride;
    const uint8_t* scales;
    int64_t scale_stride;
  };
  HeadRows RowsOf(int32_t block, int layer, int kv, int head) const;
  // Asks for the rows (and FP8 scales) RowsOf names, where a head's row is a
  // cache line or more: the blocks of a context lie anywhere in the pool, so
  // no hardware prefetcher follows a reader from one to the next, and a long
  // context comes from DRAM every step. Shorter rows (the bundled model's 32
  // bytes) are read before a miss would matter, and the prefetches cost more
  // than they save there.
  void PrefetchRows(int32_t block, int layer, int kv, int head) const;
  bool packed_latent() const { return packed(); }
  // The packed latent layout (packed_latent()): position pos's record of
  // `layer` (the latent's E4M3 bytes, one float scale per kLatentGroup of
  // them, the BF16 rope key, then the index key's E4M3 bytes and its scale),
  // for the same purpose; GatherColumns and GatherPositions are the
  // reference.
  const uint8_t* PackedRow(absl::Span<const int32_t> block_ids, int64_t pos, int layer) const {
    const int bs = spec_.block_size;
    return BlockData(block_ids[pos / bs]) + (int64_t{layer} * bs + pos % bs) * row_bytes_;
  }
  const LatentSplit& split() const { return split_; }
  // The packed FP8 latent layout's group of latent values per scale.
  static constexpr int kLatentGroup = 128;

  uint8_t* BlockData(int32_t block) { return data_ + block * block_bytes_; }
  const uint8_t* BlockData(int32_t block) const { return data_ + block * block_bytes_; }

  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

 private:
  KvCache(int layers, int kv_heads, int head_dim, const KvPoolSpec& spec, int planes,
          LatentSplit split);
  bool packed() const { return split_.latent > 0 && spec_.dtype == DType::kFP8E4M3; }
  void StorePacked(uint8_t* dst, const float* src) const;
  void GatherPacked(const uint8_t* src, int col0, int cols, float* dst) const;
  // What Gather and GatherTransposed do: dst[pos * pos_stride + d * dim_stride],
  // converting block by block (one position at a time only for the packed
  // latent rows).
  void GatherStrided(absl::Span<const int32_t> block_ids, int64_t n, int layer, int kv, int head,
                     float* dst, int64_t pos_stride, int64_t dim_stride) const;
  // Columns [col0, col0 + cols) of one position's (layer, kv, head) row,
  // converted to float: what the latent gathers and packed rows read through
  // (and the conversion GatherStrided must equal, kv_cache_test).
  void ReadRow(absl::Span<const int32_t> block_ids, int64_t pos, int layer, int kv, int head,
               int col0, int cols, float* dst) const;

  int64_t ElemOffset(int layer, int kv, int slot, int head) const;
  int64_t ScaleOffset(int layer, int kv, int slot, int head) const;

  const int layers_;
  const int planes_;  // 2 (K, V) or 1 (latent)
  const int kv_heads_;
  const int head_dim_;
  const KvPoolSpec spec_;
  const LatentSplit split_;
  const int64_t esize_;
  int64_t row_bytes_ = 0;    // packed: one token's row of one layer
  int64_t elems_bytes_ = 0;  // element region of one block
  int64_t block_bytes_ = 0;
  // The pool's blocks, in an anonymous mapping of their own (Create).
  uint8_t* data_ = nullptr;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  float fp8_lut_[256];
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_KV_CACHE_H_
