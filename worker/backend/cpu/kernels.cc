#include "worker/backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(RINGLANE_HAVE_AVX2_KERNELS)
#include <cpuid.h>
#endif

#include "worker/aligned.h"
#include "worker/backend/cpu/attention_impl.h"

namespace ringlane::worker::cpu {

#if defined(RINGLANE_HAVE_AVX2_KERNELS)
namespace {
// CPUID leaf 1, ECX bit 29. Read directly because clang 14's
// __builtin_cpu_supports does not know "f16c" (GCC's does).
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
}  // namespace
#endif

Isa DetectIsa(bool allow_avx512) {
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c()) {
#if defined(RINGLANE_HAVE_AVX512_KERNELS)
    // BW for the 16-bit shifts of the interleaved FP8 groups (Matrix::interleaved).
    if (allow_avx512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
      return Isa::kAvx512;
    }
#endif
    return Isa::kAvx2;
  }
#endif
  return Isa::kScalar;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  if (DetectIsa(false) == Isa::kAvx2) isas.push_back(Isa::kAvx2);
  if (DetectIsa(true) == Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      return "scalar";
  }
  return "?";
}

namespace internal {

float Hsum16(const float* a) {
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = a[l] + a[l + 8];
  return Hsum8(s);
}

int64_t Fp8BlockEnd(int64_t offset, int64_t i, int64_t limit) {
  return std::min(limit, ((offset + i) / kFp8BlockSize + 1) * kFp8BlockSize - offset);
}

float KernelWeight(const Matrix& w, const uint8_t* row, int64_t c) {
  const float v = LoadAsFloat(w.dtype, row, static_cast<size_t>(w.StoredColumn(c)));
  return w.dtype == DType::kFP8E4M3 ? v / kFp8Rebias : v;
}

float ScaledWeight(const Matrix& w, const uint8_t* row, int64_t r, int64_t c) {
  const float v = LoadAsFloat(w.dtype, row, static_cast<size_t>(w.StoredColumn(c)));
  return w.dtype == DType::kFP8E4M3 ? v * w.ScaleAt(r, c) : v;
}

float Hsum8(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

}  // namespace internal

namespace {

// The scalar kernel over x' (for FP8, scaled for rows [n0, n1)).
void ScalarKernel(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                  int64_t n0, int64_t n1) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  std::vector<float> wrow(static_cast<size_t>(K));
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.Row(n);
    for (int64_t k = 0; k < K; ++k) wrow[k] = internal::KernelWeight(w, row, k);
    for (int m = 0; m < M; ++m) {
      const float* xm = x + m * ldx;
      float a[16] = {};
      for (int64_t k = 0; k < K16; k += 16) {
        for (int l = 0; l < 16; ++l) a[l] = std::fma(wrow[k + l], xm[k + l], a[l]);
      }
      for (int64_t k = K16; k < K; ++k) a[k - K16] = std::fma(wrow[k], xm[k], a[k - K16]);
      y[m * ldy + n] = internal::Hsum16(a);
    }
  }
}

// The vector kernels of `isa` for rows [n0, n1), from x itself; false where
// `isa` has none. They step 16 columns at a time from the view's first
// column; a view starting mid-step (never made by our sharding) takes the
// scalar path, which computes the same sums.
bool VectorKernel(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                  int64_t n0, int64_t n1, Isa isa, bool panel) {
  [[maybe_unused]] const bool aligned = w.col_offset % 16 == 0;
#if defined(RINGLANE_HAVE_AVX512_KERNELS)
  if (isa == Isa::kAvx512 && aligned) {
    internal::MatMulRangeAvx512(w, x, ldx, M, y, ldy, n0, n1, panel);
    return true;
  }
#endif
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if ((isa == Isa::kAvx2 || isa == Isa::kAvx512) && aligned) {
    internal::MatMulRangeAvx2(w, x, ldx, M, y, ldy, n0, n1, panel);
    return true;
  }
#endif
  return false;
}

// x' for FP8 row r's 128-row block: x times (scale * kFp8Rebias) per
// 128-column block, columns [0, K) of each of M rows, into xs (ld ldxs);
// the scalar path's, ScaleTile (kernels_simd.h) the vector kernels'.
void ScaleActivations(const Matrix& w, int64_t r, const float* x, int64_t ldx, int M, float* xs,
                      int64_t ldxs) {
  internal::ForEachFp8ColumnBlock(w, r, [&](int64_t k0, int64_t k1, float s) {
    for (int m = 0; m < M; ++m) {
      const float* xm = x + m * ldx;
      float* o = xs + m * ldxs;
      for (int64_t k = k0; k < k1; ++k) o[k] = xm[k] * s;
    }
  });
}

void ScaledRange(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1, Isa isa, bool panel) {
  if (VectorKernel(w, x, ldx, M, y, ldy, n0, n1, isa, panel)) return;
  if (w.dtype != DType::kFP8E4M3) {
    ScalarKernel(w, x, ldx, M, y, ldy, n0, n1);
    return;
  }
  const int64_t ldxs = SpreadStride(w.cols);
  thread_local AlignedFloats xs;
  if (xs.size() < static_cast<size_t>(M * ldxs)) xs.resize(M * ldxs);
  // One x' per 128-row scale block the range touches.
  for (int64_t a = n0; a < n1;) {
    const int64_t b = internal::Fp8BlockEnd(w.row_offset, a, n1);
    ScaleActivations(w, a, x, ldx, M, xs.data(), ldxs);
    ScalarKernel(w, xs.data(), ldxs, M, y, ldy, a, b);
    a = b;
  }
}

}  // namespace

namespace internal {

void MatMulRangeScalar(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                       int64_t n0, int64_t n1) {
  ScaledRange(w, x, ldx, M, y, ldy, n0, n1, Isa::kScalar, false);
}

}  // namespace internal

void MatMulRange(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1, Isa isa, int force_path) {
  const bool panel = force_path == 0 ? M > kPanelMinRows : force_path == 2;
  ScaledRange(w, x, ldx, M, y, ldy, n0, n1, isa, panel);
}

void MatMulShared(std::initializer_list<MatMulOutput> outputs, const float* x, int64_t ldx, int M,
                  ThreadPool* pool, Isa isa) {
  if (M <= 0) return;
  // Tasks are tiles of (output rows, input rows); the tiling never changes a
  // sum. Decode (few input rows): long runs of output rows per task, few
  // enough tasks to synchronize cheaply. Prefill: 128 output rows (one FP8
  // scale block) x as many input rows as leave every thread kTasksPerThread
  // tasks: the panel kernel converts a task's weights once for all its input
  // rows and meets them with 64-row tiles of x. With one 64-row tile per task
  // a 512-token prefill converted each weight 8 times, 12% of its time.
  const bool panel = M > kPanelMinRows;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  constexpr int kTasksPerThread = 4;
  int m_block = M;
  if (panel) {
    int64_t n_blocks = 0;
    for (const MatMulOutput& o : outputs) n_blocks += (o.w->rows + 127) / 128;
    const int64_t tiles = (M + 63) / 64;
    const int64_t chunks = std::clamp<int64_t>(
        (kTasksPerThread * threads + n_blocks - 1) / std::max<int64_t>(1, n_blocks), 1, tiles);
    m_block = static_cast<int>((tiles + chunks - 1) / chunks * 64);
  }
  struct Task {
    const MatMulOutput* out;
    int64_t n0, n1;
    int m0;
  };
  std::vector<Task> tasks;
  for (const MatMulOutput& o : outputs) {
    // Decode streams each matrix once: two long contiguous runs per thread
    // keep the prefetchers on one stream each (measured 32 -> 36 GB/s at two
    // threads against 128-row tasks) with a little slack for a slow thread.
    const int64_t n_block =
        panel ? 128 : std::max<int64_t>(128, (o.w->rows / (2 * threads) + 15) & ~int64_t{15});
    for (int64_t n0 = 0; n0 < o.w->rows; n0 += n_block) {
      for (int m0 = 0; m0 < M; m0 += m_block) {
        tasks.push_back({&o, n0, std::min(o.w->rows, n0 + n_block), m0});
      }
    }
  }
  auto run = [&](int64_t t, int) {
    const Task& k = tasks[t];
    const int rows = std::min(m_block, M - k.m0);
    MatMulRange(*k.out->w, x + k.m0 * ldx, ldx, rows, k.out->y + k.m0 * k.out->ldy, k.out->ldy,
                k.n0, k.n1, isa, panel ? 2 : 1);
  };
  if (pool == nullptr || pool->num_threads() == 1) {
    for (size_t t = 0; t < tasks.size(); ++t) run(static_cast<int64_t>(t), 0);
  } else {
    pool->ParallelFor(static_cast<int64_t>(tasks.size()), run);
  }
}

void MatMul(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
            ThreadPool* pool, Isa isa) {
  MatMulShared({{&w, y, ldy}}, x, ldx, M, pool, isa);
}

void DequantRow(const Matrix& w, int64_t r, float* out, Isa isa) {
  const bool aligned = w.col_offset % 16 == 0;
#if defined(RINGLANE_HAVE_AVX512_KERNELS)
  if (isa == Isa::kAvx512 && aligned) {
    internal::DequantRowAvx512(w, r, out);
    return;
  }
#endif
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if ((isa == Isa::kAvx2 || isa == Isa::kAvx512) && aligned) {
    internal::DequantRowAvx2(w, r, out);
    return;
  }
#endif
  const uint8_t* row = w.Row(r);
  for (int64_t c = 0; c < w.cols; ++c) out[c] = internal::ScaledWeight(w, row, r, c);
}

void AttendHead(const AttendArgs& args, Isa isa) { AttendHeads(&args, 1, isa); }

void Transpose(const float* src, int64_t rows, int cols, int64_t ld_src, float* dst, int64_t ld_dst,
               Isa isa) {
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    internal::TransposeAvx2(src, rows, cols, ld_src, dst, ld_dst);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

namespace {

#if defined(RINGLANE_HAVE_AVX2_KERNELS)
// Positions [j0, j1) of a KV head (not packed) converted by the vector
// kernel into dst, position j at (j - j0) * pos_stride; `limit`, the end of
// the context, bounds the prefetch of the block after each one.
void GatherKvRangeAvx2(const KvCache& cache, absl::Span<const int32_t> block_ids, int64_t j0,
                       int64_t j1, int64_t limit, int layer, int kv, int head, float* dst,
                       int64_t ld, bool transposed) {
  const int bs = cache.spec().block_size;
  const int hd = cache.head_dim();
  const DType dtype = cache.spec().dtype;
  const int64_t pos_stride = transposed ? 1 : ld, dim_stride = transposed ? ld : 1;
  for (int64_t p = j0; p < j1;) {
    const int64_t b = p / bs;
    const int s0 = static_cast<int>(p % bs);
    const int slots = static_cast<int>(std::min<int64_t>(bs - s0, j1 - p));
    KvCache::HeadRows rows = cache.RowsOf(block_ids[b], layer, kv, head);
    rows.elems += s0 * rows.slot_stride;
    if (rows.scales != nullptr) rows.scales += s0 * rows.scale_stride;
    if ((b + 1) * bs < limit) cache.PrefetchRows(block_ids[b + 1], layer, kv, head);
    internal::ConvertKvBlockAvx2(
        {dtype, rows, slots, hd, dst + (p - j0) * pos_stride, pos_stride, dim_stride});
    p += slots;
  }
}
#endif

}  // namespace

void GatherKvHead(const KvCache& cache, absl::Span<const int32_t> block_ids, int64_t n, int layer,
                  int kv, int head, float* dst, int64_t ld, bool transposed, Isa isa) {
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if ((isa == Isa::kAvx2 || isa == Isa::kAvx512) && !cache.packed_latent()) {
    GatherKvRangeAvx2(cache, block_ids, 0, n, n, layer, kv, head, dst, ld, transposed);
    return;
  }
#endif
  if (transposed) {
    cache.GatherTransposed(block_ids, n, layer, kv, head, dst, ld);
  } else {
    cache.Gather(block_ids, n, layer, kv, head, dst, ld);
  }
}

void GatherLatentRows(const KvCache& cache, absl::Span<const int32_t> block_ids, int64_t first,
                      const int32_t* positions, int64_t n, int layer, int col0, int cols,
                      float* dst, int64_t ld, Isa isa) {
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if ((isa == Isa::kAvx2 || isa == Isa::kAvx512) && cache.packed_latent()) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = positions != nullptr ? positions[i] : first + i;
      internal::ConvertPackedLatentRowAvx2(cache.PackedRow(block_ids, pos, layer), cache.split(),
                                           col0, cols, dst + i * ld);
    }
    return;
  }
#endif
  if (positions != nullptr) {
    cache.GatherPositions(block_ids, absl::MakeConstSpan(positions, n), layer, col0, cols, dst, ld);
  } else {
    cache.GatherColumns(block_ids, first, n, layer, col0, cols, dst, ld);
  }
}

void FillPagedKv(const void* ctx, bool values, int64_t j0, int64_t j1, float* dst, int64_t ld) {
  const PagedKv& c = *static_cast<const PagedKv*>(ctx);
  if (c.cols > 0) {
    if (values) {
      GatherLatentRows(*c.cache, c.block_ids, j0, nullptr, j1 - j0, c.layer, 0, c.cols, dst, ld,
                       c.isa);
      return;
    }
    // Keys transposed: the rows, then the tile's transpose (both in cache).
    thread_local AlignedFloats rows;
    rows.resize(static_cast<size_t>((j1 - j0) * c.cols));
    GatherLatentRows(*c.cache, c.block_ids, j0, nullptr, j1 - j0, c.layer, 0, c.cols, rows.data(),
                     c.cols, c.isa);
    Transpose(rows.data(), j1 - j0, c.cols, c.cols, dst, ld, c.isa);
    return;
  }
  const int kv = values ? 1 : 0;
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if ((c.isa == Isa::kAvx2 || c.isa == Isa::kAvx512) && !c.cache->packed_latent()) {
    GatherKvRangeAvx2(*c.cache, c.block_ids, j0, j1, c.n, c.layer, kv, c.head, dst, ld, !values);
    return;
  }
#endif
  // The pool's own gathers start at a block: from j0's block, then the part
  // asked for (the scalar path asks for the whole context, j0 = 0).
  const int bs = c.cache->spec().block_size;
  const int hd = c.cache->head_dim();
  const int64_t b0 = j0 / bs, first = b0 * bs, m = j1 - first;
  std::vector<float> tmp(static_cast<size_t>(m * hd));
  c.cache->Gather(c.block_ids.subspan(b0), m, c.layer, kv, c.head, tmp.data(), hd);
  const float* part = tmp.data() + (j0 - first) * hd;
  if (values) {
    for (int64_t j = 0; j < j1 - j0; ++j) std::copy_n(part + j * hd, hd, dst + j * ld);
  } else {
    Transpose(part, j1 - j0, hd, hd, dst, ld, c.isa);
  }
}

void AttendHeads(const AttendArgs* heads, int count, Isa isa) {
  const AttendArgs& a0 = heads[0];
  const int vd = a0.v_dim > 0 ? a0.v_dim : a0.head_dim;
  const bool vector = isa == Isa::kAvx2 || isa == Isa::kAvx512;
  if (a0.source != nullptr && (!vector || vd <= internal::kNarrowValues)) {
    // The paths that read the whole context: fill it once, then attend as
    // to any copy (the floats are the same, so are the results).
    const int64_t n = a0.positions[a0.rows - 1] + 1;
    const int64_t ldkt = SpreadStride(n), ldv = std::max(a0.head_dim, vd);
    std::vector<float> kt(static_cast<size_t>(ldkt * a0.head_dim));
    std::vector<float> v(static_cast<size_t>(n * ldv));
    a0.source->fill(a0.source->ctx, false, 0, n, kt.data(), ldkt);
    a0.source->fill(a0.source->ctx, true, 0, n, v.data(), ldv);
    std::vector<AttendArgs> copies(heads, heads + count);
    for (AttendArgs& c : copies) {
      c.kt = kt.data();
      c.ldkt = ldkt;
      c.v = v.data();
      c.ldv = ldv;
      c.source = nullptr;
    }
    AttendHeads(copies.data(), count, isa);
    return;
  }
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    internal::AttendHeadsAvx2(heads, count);
    return;
  }
#endif
  for (int h = 0; h < count; ++h) internal::AttendHeadImpl(heads[h]);
}

void IndexerScores(const IndexerScoreArgs& args, Isa isa) {
#if defined(RINGLANE_HAVE_AVX2_KERNELS)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    internal::IndexerScoresAvx2(args);
    return;
  }
#endif
  internal::IndexerScoresImpl(args);
}

}  // namespace ringlane::worker::cpu
