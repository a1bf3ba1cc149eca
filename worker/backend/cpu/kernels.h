// CPU kernels of the forward pass.
//
// The one rule every kernel here keeps is a fixed reduction order per output
// element, whatever the number of rows in the round or the path taken:
//
//   y[m][n] = hsum16(a), where a is 16 float lanes; lane l accumulates, with
//   fused multiply-adds in increasing k, w'[n][k] * x[m][k] for every k with
//   k % 16 == l and k < K16 = K & ~15; then the tail k in [K16, K) adds into
//   lane k - K16; hsum16(a) = hsum8(s) with s[l] = a[l] + a[l + 8], and
//   hsum8(s) = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
//
// w' is the stored weight converted to float, exactly. FP8 weights carry a
// scale per 128x128 block; it goes on x instead of w: for output n, x' is x
// with each element multiplied (one rounding) by the scale of n's 128-row
// block and the element's 128-column block, and the sum above runs over
// w'[n][k] * x'[m][k] with w' the unscaled value. (In the kernels w' is the
// value / 256, which is exact, and the scale is taken times 256, so the
// products are the same.) Scaling x costs M * K multiplies per 128 weight
// rows; scaling w cost one per weight, which single-stream decode, bound by
// converting weights, paid on every one.
// The vector paths (AVX-512: one register of 16 lanes; AVX2: two of 8; each in
// registers for a few rows and through a float panel for many) and the scalar
// fallback all follow this definition, so they agree bit for bit; that is what
// keeps a lane's output independent of its round-mates.
//
// Thread-safe: kernels only read the weights and write their own outputs.
#ifndef RINGLANE_WORKER_BACKEND_CPU_KERNELS_H_
#define RINGLANE_WORKER_BACKEND_CPU_KERNELS_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/types/span.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/thread_pool.h"

namespace ringlane::worker::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// The best instruction set this CPU and build support; `allow_avx512` false
// stops at AVX2 (for side-by-side measurements).
Isa DetectIsa(bool allow_avx512 = true);
// Every instruction set this CPU and build can run, scalar first.
std::vector<Isa> SupportedIsas();
const char* IsaName(Isa isa);

// Rows at or below this count use the in-register kernels; above it the weights
// are dequantized once per block of rows into a panel that stays in cache.
inline constexpr int kPanelMinRows = 8;

// y[m * ldy + n] = dot(w'[n], x[m * ldx .. + K]) for m < M, n < w.rows, K = w.cols.
// Work is split over blocks of output rows, so the split never changes a sum.
void MatMul(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
            ThreadPool* pool, Isa isa);

// Several matrices applied to the same x (Q/K/V, gate/up) in one parallel
// loop, so the pool synchronizes once for all of them.
struct MatMulOutput {
  const Matrix* w;
  float* y;
  int64_t ldy;
};
void MatMulShared(std::initializer_list<MatMulOutput> outputs, const float* x, int64_t ldx, int M,
                  ThreadPool* pool, Isa isa);

// As MatMul for output rows [n0, n1) only, on the calling thread. `force_path`:
// 0 chooses by M, 1 forces the in-register kernels, 2 the panel kernels (tests).
void MatMulRange(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1, Isa isa, int force_path = 0);

// Converts columns [0, w.cols) of row r to float, FP8 times its block scale
// (value * scale rounded once), for the operations that need weights as
// floats (embedding lookup, a transposed product).
void DequantRow(const Matrix& w, int64_t r, float* out, Isa isa);

// A context that attention reads a tile at a time (AttendArgs::source), so
// that no float copy of the whole of it is written and read back: fill
// converts positions [j0, j1) of K transposed, dst[d * ld + j - j0] (values
// false), or of V as rows, dst[(j - j0) * ld + d] (values true), at most
// kAttendKTile positions of K and kAttendVTile of V at a time on the vector
// paths (the scalar path and narrow values take the whole context at once).
struct KvTileSource {
  void (*fill)(const void* ctx, bool values, int64_t j0, int64_t j1, float* dst, int64_t ld);
  const void* ctx;
};
inline constexpr int kAttendKTile = 32;
inline constexpr int kAttendVTile = 64;
// Values of at most this many dimensions are summed in partial sums over
// the whole context (attention_impl.h), so a source is filled whole for
// them: no gain over a copy.
inline constexpr int kNarrowValueDims = 16;

// Causal attention of query rows of one head against its K and V, already
// converted to float for context positions 0, 1, ... K comes transposed so the
// scores of consecutive positions are computed side by side: score(r, j) is
// the sum over d, in increasing d, of q[r][d] * kt[d][j] (fused multiply-adds),
// divided by sqrt(head_dim), or multiplied by `scale` when that is set — the
// same for every row whatever the round. The output has v_dim values (the
// first v_dim of each V row; head_dim when 0), as latent attention needs.
struct AttendArgs {
  const float* q;  // [rows][ldq]
  int64_t ldq;
  int rows;
  const int64_t* positions;  // per row: the row's own position; it sees [0, position]
  const float* kt;           // [head_dim][ldkt]: kt[d * ldkt + j] is K[j][d]
  int64_t ldkt;
  const float* v;  // [positions[rows-1] + 1][ldv]
  int64_t ldv;
  int head_dim;
  float* scores;  // scratch, at least max position + 1 floats
  float* out;     // [rows][ldo]
  int64_t ldo;
  int v_dim = 0;
  float scale = 0.0f;
  // Optional: each row's log-sum-exp of its scaled scores (max + log of the
  // sum of exponentials), at lse[r * ld_lse], for combining attention over
  // parts of a context (decode context parallel).
  float* lse = nullptr;
  int64_t ld_lse = 0;
  // Optional: K and V from here instead of kt and v (which are then not
  // read), with the same results bit for bit: each position's and each
  // output's operations are the same, only where the floats lie differs.
  const KvTileSource* source = nullptr;
};
void AttendHead(const AttendArgs& args, Isa isa);
// Several heads against the same keys and values: the entries share kt,
// ldkt, v, ldv, source, head_dim, v_dim, scale, rows and positions, each with its
// own q, out, lse and scores. Every head's results are AttendHead's bits;
// the vector kernels take each block of K, and of V, once for a pass of
// heads instead of once per head (a long context's copies come from DRAM,
// and a GQA group or MLA's heads would read them that many times).
void AttendHeads(const AttendArgs* heads, int count, Isa isa);

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: keys
// turned into the rows attention's scores are taken over. A copy, so every
// instruction set gives the same floats; the vector ones move 8 x 8 tiles.
void Transpose(const float* src, int64_t rows, int cols, int64_t ld_src, float* dst, int64_t ld_dst,
               Isa isa);

// Positions [0, n) of KV head `head` of (layer, kv) of a context held in
// `block_ids`, converted to floats with exactly KvCache::Gather's bits (NaN
// codes included): rows of ld floats, dst[pos * ld + d], or with
// `transposed` GatherTransposed's dst[d * ld + pos]. Decode reads the whole
// context through here every step; the vector path converts 8 dimensions of
// a slot at once (FP8 by moving the E4M3 bits into an F32 and two exact
// multiplies, no table) and writes the transposed form in 8 x 8 tiles.
// Not for the packed latent layout (KvCache::packed_latent).
void GatherKvHead(const KvCache& cache, absl::Span<const int32_t> block_ids, int64_t n, int layer,
                  int kv, int head, float* dst, int64_t ld, bool transposed, Isa isa);

// A KvTileSource's context (fill: FillPagedKv) over one sequence's context
// in the paged pool, the floats the gathers give: KV head `head` of a K/V
// pool (GatherKvHead's), or with cols > 0 the first `cols` columns of a
// latent pool's rows (whole parts: the latent and rope key;
// GatherLatentRows'), which MLA reads as its keys and, the latents, as its
// values. n: the context's length (prefetches stop there).
struct PagedKv {
  const KvCache* cache;
  absl::Span<const int32_t> block_ids;
  int64_t n;
  int layer;
  int head = 0;
  int cols = 0;
  Isa isa = Isa::kScalar;
};
void FillPagedKv(const void* ctx, bool values, int64_t j0, int64_t j1, float* dst, int64_t ld);

// Columns [col0, col0 + cols) of a latent cache's rows (whole parts, see
// KvCache::GatherColumns) to dst rows of ld floats: of positions [first,
// first + n), or with `positions` non-null of positions[0..n), in order.
// Exactly GatherColumns' / GatherPositions' bits; the vector path converts
// the packed FP8 layout 8 values at a time, as GatherKvHead does.
void GatherLatentRows(const KvCache& cache, absl::Span<const int32_t> block_ids, int64_t first,
                      const int32_t* positions, int64_t n, int layer, int col0, int cols,
                      float* dst, int64_t ld, Isa isa);

// A row stride (in floats) for rows of n floats that a kernel reads side by
// side (a transposed K, AttendArgs::kt; the panel's converted weight rows and
// the scaled activations x' of a prefill tile): at least n, and an odd
// multiple of 16 floats, so that the same column of successive rows falls
// in different L1 sets. With n a multiple of 1024 every row fell in the same
// set: one 64-dim head over 4096 positions took 1.8x as long as over 4000
// (ringlane-kernels-bench Attend).
inline int64_t SpreadStride(int64_t n) { return (((n + 15) / 16) | 1) * 16; }

// The DSA indexer's scores of one query row against n keys given transposed:
// scores[j] = sum over h, in increasing h, of w[h] * max(dot_h(j), 0), where
// dot_h(j) sums q[h * head_dim + d] * kt[d * ldkt + j] over d in increasing
// order with fused multiply-adds. Vectorized across keys, so every path
// rounds alike and a key's score never depends on the others.
struct IndexerScoreArgs {
  const float* q;  // [heads][head_dim]
  const float* w;  // [heads]
  int heads;
  int head_dim;
  const float* kt;  // [head_dim][ldkt]
  int64_t ldkt;
  int64_t n;
  float* dot;     // scratch, n floats
  float* scores;  // n floats
};
void IndexerScores(const IndexerScoreArgs& args, Isa isa);

namespace internal {
// FP8 weights as the kernels read them: value / kFp8Rebias, exact (E4M3
// moves bit for bit into F16 with this factor, see kernels_avx2.cc).
inline constexpr float kFp8Rebias = 256.0f;
// Interleaved groups (Matrix::interleaved) convert more cheaply to value *
// 2^-120, the E4M3 bits moved into an F32 whose exponent bias is 127 instead
// of 7 (subnormals included): no conversion instruction, which was a quarter
// of the decode kernel's time. That is value / kFp8Rebias times 2^-112, so
// the decode kernel multiplies x' by kFp8RawShift instead (exact while
// |x'| < kFp8RawLimit) and every product, hence every sum, keeps its bits.
inline constexpr float kFp8RawShift = 0x1p112f;
inline constexpr float kFp8RawLimit = 65536.0f;  // 2^128 / kFp8RawShift
// The scalar pieces every instruction-set file shares. Out of line, like
// Hsum16, so each is the same portable code whoever calls it (an inline
// function compiled into an AVX-512 file could be the copy the linker keeps).
// End of the FP8 scale block (kFp8BlockSize rows or columns) holding index i
// of a view that starts `offset` into the full matrix, at most `limit`.
int64_t Fp8BlockEnd(int64_t offset, int64_t i, int64_t limit);
// Each FP8 scale block of columns [0, w.cols) of row r, in order: f(k0, k1,
// s), s the block's scale times kFp8Rebias (the factor x' takes). Inline,
// unlike the pieces above: s is one exact multiply by a power of two, the
// same bits whichever instruction-set file computes it.
template <class F>
void ForEachFp8ColumnBlock(const Matrix& w, int64_t r, F&& f) {
  for (int64_t k0 = 0; k0 < w.cols;) {
    const int64_t k1 = Fp8BlockEnd(w.col_offset, k0, w.cols);
    f(k0, k1, w.ScaleAt(r, k0) * kFp8Rebias);
    k0 = k1;
  }
}
// One weight as every matmul path multiplies it: FP8 unscaled (value /
// kFp8Rebias, exact; the scale is on x), other types as stored.
float KernelWeight(const Matrix& w, const uint8_t* row, int64_t c);
// One weight as DequantRow gives it: FP8 times its block scale, rounded once.
float ScaledWeight(const Matrix& w, const uint8_t* row, int64_t r, int64_t c);
// The reference path (tests): MatMulRange on the scalar kernels.
void MatMulRangeScalar(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                       int64_t n0, int64_t n1);
// The per-instruction-set kernels for rows [n0, n1), from x itself (for
// FP8 they make x' per 128-row scale block inside): in registers, or with
// `panel` (prefill) each block's weights converted once for all M rows of x
// and met by 64-row tiles of it. The same sums either way. Need
// w.col_offset % 16 == 0.
void MatMulRangeAvx2(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                     int64_t n0, int64_t n1, bool panel);
void DequantRowAvx2(const Matrix& w, int64_t r, float* out);
float Hsum8(const float* a);
// The final sum of the 16 lanes of the matmul order above. Out of line, like
// Hsum8, so every instruction-set file calls the same portable code.
float Hsum16(const float* a);
void AttendHeadsAvx2(const AttendArgs* heads, int count);
void TransposeAvx2(const float* src, int64_t rows, int cols, int64_t ld_src, float* dst,
                   int64_t ld_dst);
void IndexerScoresAvx2(const IndexerScoreArgs& args);
// One block's slots [0, slots) of a head's rows (KvCache::HeadRows) in
// `dtype`, to dst[s * pos_stride + d * dim_stride]: GatherKvHead's vector
// part. Either pos_stride or dim_stride is 1.
struct KvBlockArgs {
  DType dtype;
  KvCache::HeadRows rows;
  int slots;
  int head_dim;
  float* dst;
  int64_t pos_stride;
  int64_t dim_stride;
};
void ConvertKvBlockAvx2(const KvBlockArgs& args);
// One packed latent record (KvCache::PackedRow), columns [col0, col0 + cols)
// (whole parts) to dst: GatherLatentRows' vector part.
void ConvertPackedLatentRowAvx2(const uint8_t* src, const LatentSplit& split, int col0, int cols,
                                float* dst);
void MatMulRangeAvx512(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                       int64_t n0, int64_t n1, bool panel);
void DequantRowAvx512(const Matrix& w, int64_t r, float* out);
}  // namespace internal

}  // namespace ringlane::worker::cpu

#endif  // RINGLANE_WORKER_BACKEND_CPU_KERNELS_H_
