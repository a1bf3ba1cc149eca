// The vector matmul kernels, written once over a "V" of 16 float lanes and
// compiled twice: kernels_avx2.cc (V = two 256-bit registers) and
// kernels_avx512.cc (V = one 512-bit register). Both realize exactly the
// reduction order of kernels.h, so they agree bit for bit with each other and
// with the scalar path. Internal to those two files.
//
// V provides:
//   Vec                          16 floats in registers
//   Scale                        a broadcast FP8 block scale
//   Vec Zero(); Scale SetScale(float); Vec Mul(Vec, Scale)
//   Vec LoadF(const float* p)    p[0..16)
//   template <DType D> Vec LoadW(const uint8_t* row, int64_t k)
//                                columns [k, k+16) converted; FP8 without its
//                                block scale and divided by kFp8Rebias (the
//                                caller scales x instead, see kernels.h)
//   void LoadW64(const uint8_t* group, Vec out[4])
//                                one interleaved FP8 group (Matrix::interleaved):
//                                its 64 columns converted as LoadW would, in
//                                order, 16 per Vec
//   void LoadW64Raw(const uint8_t* group, Vec out[4])
//                                the same times 2^-112 (kFp8RawShift), cheaper
//   Part, kGroupParts (1 or 2), LoadW64RawPart<part>(group, Part out[4]),
//   FmaPart<part>(Part w, const float* x, Vec& acc)
//                                LoadW64Raw and Fma in kGroupParts slices of
//                                lanes (Part holds one slice of a Vec; x
//                                points at the Vec's lane 0)
//   Vec MaxAbs(Vec m, Vec v); float HMax(Vec m)
//                                lane-wise max of m and |v|; the largest lane
//   Vec Fma(Vec w, Vec x, Vec acc)  lane-wise fused multiply-add
//   void Store(Vec v, float* p)
//   constexpr int NrFor(int mr)  weight rows per in-register tile of mr rows
//   constexpr int kPanelMR, kPanelNR
#ifndef RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_
#define RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "worker/aligned.h"
#include "worker/backend/cpu/kernels.h"

// An anonymous namespace: each including file gets its own copy, compiled
// with its own instruction set flags, so the linker can never hand one file's
// AVX-512 code to another's callers.
namespace ringlane::worker::cpu::internal::simd {
namespace {

// The tail columns and the final sum of one output of the in-register
// kernels, from its 16 lanes.
inline float Finish(float* a, const Matrix& w, const uint8_t* row, const float* xm, int64_t K16,
                    int64_t K) {
  for (int64_t t = K16; t < K; ++t) {
    a[t - K16] = std::fma(KernelWeight(w, row, t), xm[t], a[t - K16]);
  }
  // Hsum16 of kernels.h, the same additions in the same tree, inlined here
  // (the panel path's HsumRows16 takes 16 outputs at once).
  float h[8];
  for (int l = 0; l < 8; ++l) h[l] = a[l] + a[l + 8];
  return ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));
}

// MR rows of x against NR consecutive weight rows starting at n, converting
// the weights in registers.
// kRaw: interleaved FP8 groups read by LoadW64Raw, against x' times
// kFp8RawShift (the caller's); the products are those of LoadW64 and x'.
template <class V, DType D, int MR, int NR, bool kRaw>
void TileInRegisters(const Matrix& w, int64_t n, const float* x, int64_t ldx, float* y,
                     int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  typename V::Vec acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = V::Zero();
  // This tile's rows and the next tile's, whose same columns are prefetched;
  // from Row(), so a tile that straddles the stored tiles (Matrix::row_tile)
  // prefetches its real successors. Past the end of the matrix is harmless
  // (prefetches never fault).
  const uint8_t* rows[NR];
  const uint8_t* next[NR];
  for (int j = 0; j < NR; ++j) {
    rows[j] = w.Row(n + j);
    next[j] = w.Row(n + NR + j);
  }
  constexpr int64_t kElemBytes = D == DType::kF32 ? 4 : (D == DType::kFP8E4M3 ? 1 : 2);

  int64_t k = 0;
  if constexpr (D == DType::kFP8E4M3) {
    if (w.interleaved) {
      // Whole groups: 64 columns per row from one load and a few shifts, the
      // lanes' sums taken in the same order as 16 columns at a time.
      // Group g of a row is at g * row_tile bytes from its start (rows in
      // tiles, Matrix::row_tile).
      const int64_t step = 64 * w.row_tile;
      for (int64_t K64 = K & ~int64_t{63}, at = 0; k < K64; k += 64, at += step) {
        // Non-temporal (locality 0): the lines are read once. Measured against
        // the default (3) in 8 + 6 alternating pairs of the engine's decode:
        // 1.01x / 1.05x at one thread, 1.03x at two (AVX2 1.01x / 1.04x); a
        // standalone loop of this kernel from DRAM went 0.71-0.78 -> 0.84-0.96
        // of that loop's own plain read, 3 runs.
        for (int j = 0; j < NR; ++j) __builtin_prefetch(next[j] + at, 0, 0);
        for (int j = 0; j < NR; ++j) {
          if constexpr (kRaw) {
            // Parts as constants, so each accumulator half stays a register.
            auto part_of_group = [&](auto part) {
              typename V::Part wv[4];
              V::template LoadW64RawPart<part()>(rows[j] + at, wv);
              for (int s = 0; s < 4; ++s) {
                for (int m = 0; m < MR; ++m) {
                  V::template FmaPart<part()>(wv[s], x + m * ldx + k + 16 * s, acc[m][j]);
                }
              }
            };
            part_of_group(std::integral_constant<int, 0>{});
            if constexpr (V::kGroupParts == 2) part_of_group(std::integral_constant<int, 1>{});
          } else {
            typename V::Vec wv[4];
            V::LoadW64(rows[j] + at, wv);
            for (int s = 0; s < 4; ++s) {
              for (int m = 0; m < MR; ++m) {
                acc[m][j] = V::Fma(wv[s], V::LoadF(x + m * ldx + k + 16 * s), acc[m][j]);
              }
            }
          }
        }
      }
    }
  }
  for (; k < K16; k += 16) {
    // Rows are short streams (a few KB) that the hardware prefetcher barely
    // catches; fetch the same columns of the next tile's rows meanwhile.
    if ((k * kElemBytes) % 64 == 0) {
      for (int j = 0; j < NR; ++j) __builtin_prefetch(next[j] + k * kElemBytes);
    }
    typename V::Vec xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = V::LoadF(x + m * ldx + k);
    for (int j = 0; j < NR; ++j) {
      const typename V::Vec wv = V::template LoadW<D>(rows[j], k);
      for (int m = 0; m < MR; ++m) acc[m][j] = V::Fma(wv, xv[m], acc[m][j]);
    }
  }
  for (int j = 0; j < NR; ++j) {
    for (int m = 0; m < MR; ++m) {
      alignas(64) float a[16];
      V::Store(acc[m][j], a);
      y[m * ldy + n + j] = Finish(a, w, rows[j], x + m * ldx, K16, K);
    }
  }
}

// The same sums from a panel of already converted weights (NR rows of ldp
// floats), for columns [k0, k1) only: the lane accumulators start from `accs`
// (or zero when `first`) and are stored back there, which changes no value, so
// the order is that of one pass over all columns.
// accs[(m * kPanelRows + j) * 16 ...] holds the 16 lanes of (row m, weight row j).
template <class V, int MR, int NR>
void TileFromPanel(const float* panel, int64_t ldp, int64_t k0, int64_t k1, const float* x,
                   int64_t ldx, float* accs, int64_t acc_row_stride, bool first) {
  typename V::Vec acc[MR][NR];
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < NR; ++j) {
      acc[m][j] = first ? V::Zero() : V::LoadF(accs + m * acc_row_stride + j * 16);
    }
  }
  for (int64_t k = k0; k < k1; k += 16) {
    typename V::Vec xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = V::LoadF(x + m * ldx + k);
    for (int j = 0; j < NR; ++j) {
      const typename V::Vec wv = V::LoadF(panel + j * ldp + k);
      for (int m = 0; m < MR; ++m) acc[m][j] = V::Fma(wv, xv[m], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) V::Store(acc[m][j], accs + m * acc_row_stride + j * 16);
}

// Row r converted as LoadW yields it; with `scaled`, FP8 times its block
// scale as well (one rounding of (value / kFp8Rebias) * (scale * kFp8Rebias), which
// is value * scale rounded once: DequantRow's contract).
// `k_begin` (a multiple of 64, or the end of the whole groups): columns
// before it are already converted.
template <class V, DType D, bool scaled>
void DequantRowTyped(const Matrix& w, int64_t r, float* out, int64_t k_begin = 0) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  const uint8_t* row = w.Row(r);
  int64_t k = k_begin;
  if constexpr (D == DType::kFP8E4M3) {
    if (w.interleaved) {
      for (int64_t K64 = K & ~int64_t{63}, at = k / 64 * 64 * w.row_tile; k < K64;
           k += 64, at += 64 * w.row_tile) {
        typename V::Vec wv[4];
        V::LoadW64(row + at, wv);
        for (int s = 0; s < 4; ++s) {
          if constexpr (scaled) {
            const float sc = w.ScaleAt(r, k + 16 * s) * internal::kFp8Rebias;
            V::Store(V::Mul(wv[s], V::SetScale(sc)), out + k + 16 * s);
          } else {
            V::Store(wv[s], out + k + 16 * s);
          }
        }
      }
    }
  }
  if constexpr (D == DType::kFP8E4M3 && scaled) {
    // Scale runs are whole 16-column steps: col_offset % 16 == 0 (checked by
    // the caller).
    while (k < K16) {
      const int64_t end = Fp8BlockEnd(w.col_offset, k, K16);
      const typename V::Scale s = V::SetScale(w.ScaleAt(r, k) * internal::kFp8Rebias);
      for (; k < end; k += 16) V::Store(V::Mul(V::template LoadW<D>(row, k), s), out + k);
    }
    for (int64_t t = K16; t < K; ++t) out[t] = ScaledWeight(w, row, r, t);
  } else {
    for (; k < K16; k += 16) V::Store(V::template LoadW<D>(row, k), out + k);
    for (int64_t t = K16; t < K; ++t) out[t] = KernelWeight(w, row, t);
  }
}

// Rows [r0, r0 + n) converted as LoadW yields them, into out (ld ldo): for
// interleaved FP8, group g of n rows before group g + 1, which walks a tile
// of rows (Matrix::row_tile) in memory order; one row at a time strode
// 64 * row_tile bytes per group and stalled on memory (a third of the
// conversion's time in a prefill profile).
template <class V, DType D>
void DequantRows(const Matrix& w, int64_t r0, int64_t n, float* out, int64_t ldo) {
  int64_t k_done = 0;
  if constexpr (D == DType::kFP8E4M3) {
    if (w.interleaved && n <= 8) {
      const int64_t K64 = w.cols & ~int64_t{63};
      const uint8_t* rows[8];
      for (int64_t j = 0; j < n; ++j) rows[j] = w.Row(r0 + j);
      for (int64_t k = 0, at = 0; k < K64; k += 64, at += 64 * w.row_tile) {
        for (int64_t j = 0; j < n; ++j) {
          typename V::Vec wv[4];
          V::LoadW64(rows[j] + at, wv);
          for (int s = 0; s < 4; ++s) V::Store(wv[s], out + j * ldo + k + 16 * s);
        }
      }
      k_done = K64;
    }
  }
  for (int64_t j = 0; j < n; ++j) DequantRowTyped<V, D, false>(w, r0 + j, out + j * ldo, k_done);
}

template <class V, DType D, int MR, bool kRaw>
void RowsInRegisters(const Matrix& w, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int64_t n0, int64_t n1) {
  constexpr int NR = V::NrFor(MR);
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) TileInRegisters<V, D, MR, NR, kRaw>(w, n, x, ldx, y, ldy);
  for (; n < n1; ++n) TileInRegisters<V, D, MR, 1, kRaw>(w, n, x, ldx, y, ldy);
}

// Up to 6 rows in one tile, so each weight is converted once per step for the
// usual decode batches; beyond that, tiles of 4.
template <class V, DType D, bool kRaw = false>
void InRegisters(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  int m = 0;
  if (M > 6) {
    for (; M - m > 6; m += 4)
      RowsInRegisters<V, D, 4, kRaw>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
  }
  const float* xm = x + m * ldx;
  float* ym = y + m * ldy;
  switch (M - m) {
    case 6:
      return RowsInRegisters<V, D, 6, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    case 5:
      return RowsInRegisters<V, D, 5, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    case 4:
      return RowsInRegisters<V, D, 4, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    case 3:
      return RowsInRegisters<V, D, 3, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    case 2:
      return RowsInRegisters<V, D, 2, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    case 1:
      return RowsInRegisters<V, D, 1, kRaw>(w, xm, ldx, ym, ldy, n0, n1);
    default:
      return;
  }
}

inline constexpr int64_t kPanelRows = 16;  // weight rows converted per panel
// Columns per pass. Each pass stores the tiles' lane accumulators and loads
// them back, so fewer, longer passes: on an AMD EPYC (48 KiB L1, 1 MiB L2)
// 1024 ran a 512-row prefill tile 1.08x as fast as 512, whose x tile and
// panel slice fit L1 (ringlane-kernels-bench FP8Tiled, 3 alternating runs:
// 106-115 -> 113-125 GFLOP/s); 256 was 0.6x, 2048 and 8192 1.04x.
inline constexpr int64_t kPanelCols = 1024;

// MR rows of x against every row of the panel for columns [k0, k1): NR rows
// at a time, then single rows. The x tile stays in cache across the panel rows.
template <class V, int MR>
void PanelTileRow(const float* panel, int64_t ldp, int64_t rows, int64_t k0, int64_t k1,
                  const float* x, int64_t ldx, float* accs, bool first) {
  constexpr int NR = V::kPanelNR;
  constexpr int64_t stride = kPanelRows * 16;
  int64_t j = 0;
  for (; j + NR <= rows; j += NR) {
    TileFromPanel<V, MR, NR>(panel + j * ldp, ldp, k0, k1, x, ldx, accs + j * 16, stride, first);
  }
  for (; j < rows; ++j) {
    TileFromPanel<V, MR, 1>(panel + j * ldp, ldp, k0, k1, x, ldx, accs + j * 16, stride, first);
  }
}

// Rows [m, M) of x: full tiles of MR rows, then the rest with smaller tiles.
template <class V, int MR>
void PanelAllRows(const float* panel, int64_t ldp, int64_t rows, int64_t k0, int64_t k1,
                  const float* x, int64_t ldx, int m, int M, float* accs, bool first) {
  constexpr int64_t stride = kPanelRows * 16;
  for (; m + MR <= M; m += MR) {
    PanelTileRow<V, MR>(panel, ldp, rows, k0, k1, x + m * ldx, ldx, accs + m * stride, first);
  }
  if constexpr (MR > 1) {
    if (m < M) PanelAllRows<V, MR - 1>(panel, ldp, rows, k0, k1, x, ldx, m, M, accs, first);
  }
}

// The sums of 16 outputs at once from their lanes (output j's 16 lanes at
// a + 16 * j), each in Hsum16's tree: lane l plus lane l + 8, then adjacent
// pairs, pairs of pairs, and the two halves. Transposed so one addition
// serves eight outputs; a scalar Finish per output was 8% of a 512-token
// prefill. Both includers compile with AVX2, so this is written once.
inline void HsumRows16(const float* a, float* out) {
  for (int g = 0; g < 2; ++g) {
    const float* ag = a + 128 * g;
    __m256 h[8];
    for (int j = 0; j < 8; ++j) {
      h[j] = _mm256_add_ps(_mm256_loadu_ps(ag + 16 * j), _mm256_loadu_ps(ag + 16 * j + 8));
    }
    // hadd(p, q) = (p0+p1, p2+p3, q0+q1, q2+q3 | p4+p5, p6+p7, q4+q5, q6+q7).
    const __m256 p01 = _mm256_hadd_ps(h[0], h[1]);
    const __m256 p23 = _mm256_hadd_ps(h[2], h[3]);
    const __m256 p45 = _mm256_hadd_ps(h[4], h[5]);
    const __m256 p67 = _mm256_hadd_ps(h[6], h[7]);
    // Output j's ((h0+h1)+(h2+h3)) in lane j % 4, its ((h4+h5)+(h6+h7)) in
    // lane 4 + j % 4.
    const __m256 q0123 = _mm256_hadd_ps(p01, p23);
    const __m256 q4567 = _mm256_hadd_ps(p45, p67);
    const __m256 lo = _mm256_permute2f128_ps(q0123, q4567, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(q0123, q4567, 0x31);
    _mm256_storeu_ps(out + 8 * g, _mm256_add_ps(lo, hi));
  }
}

// Rows [0, M) of y for the `rows` (at most kPanelRows) weight rows of one
// panel: the tail columns into each output's lanes, then the sums.
inline void FinishPanel(float* accs, const float* panel, int64_t ldp, int64_t rows, const float* x,
                        int64_t ldx, int M, float* y, int64_t ldy, int64_t K16, int64_t K) {
  for (int m = 0; m < M; ++m) {
    float* a = accs + m * kPanelRows * 16;
    const float* xm = x + m * ldx;
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t t = K16; t < K; ++t) {
        a[j * 16 + t - K16] = std::fma(panel[j * ldp + t], xm[t], a[j * 16 + t - K16]);
      }
    }
    if (rows == kPanelRows) {
      HsumRows16(a, y + m * ldy);
    } else {
      alignas(64) float s[kPanelRows];
      HsumRows16(a, s);
      std::copy(s, s + rows, y + m * ldy);
    }
  }
}

// x' of an M-row tile for FP8 row r's 128-row block: x times (scale *
// kFp8Rebias) per 128-column block, one rounding per value as in
// ScaleActivations (kernels.cc). Column blocks start at multiples of 16
// (col_offset % 16 == 0). Row by row, so x and x' are read and written in
// one stream each: block by block over the rows jumped a row every 512
// bytes, and this loop was half the panel path's own time in a profile.
// kShift: x' times kFp8RawShift for LoadW64Raw (K a multiple of 16), where
// every |x'| < kFp8RawLimit keeps that exact; returns whether they did (if
// not, the tile is x' * kFp8RawShift with some values wrong: scale it again
// without; the plain variant returns false). One pass: a separate pass to
// shift x' was 3% of a decode profile.
template <class V, bool kShift = false>
bool ScaleTile(const Matrix& w, int64_t r, const float* x, int64_t ldx, int M, float* xs,
               int64_t ldxs) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  typename V::Vec big = V::Zero();
  const typename V::Scale shift = V::SetScale(kFp8RawShift);
  for (int m = 0; m < M; ++m) {
    const float* xm = x + m * ldx;
    float* o = xs + m * ldxs;
    ForEachFp8ColumnBlock(w, r, [&](int64_t k0, int64_t k1, float s) {
      const typename V::Scale vs = V::SetScale(s);
      const int64_t v1 = std::min(k1, K16);
      int64_t k = k0;
      for (; k < v1; k += 16) {
        typename V::Vec v = V::Mul(V::LoadF(xm + k), vs);
        if constexpr (kShift) {
          big = V::MaxAbs(big, v);
          v = V::Mul(v, shift);
        }
        V::Store(v, o + k);
      }
      for (; k < k1; ++k) o[k] = xm[k] * s;  // never with kShift (K % 16 == 0)
    });
  }
  // Not `>=`: a NaN goes the plain way too.
  return kShift && V::HMax(big) < kFp8RawLimit;
}

// Input rows per tile of the panel path: x and x' of a tile (64 x K floats
// each) share L2 with the panel slices passing over them.
inline constexpr int kPanelTileRows = 64;

// Rows [n0, n1) through the panel. Each weight block (an FP8 scale block of
// at most 128 rows, or 128 rows) is converted once for all M rows of x, then
// met by 64-row tiles of x (x' for FP8), 16 converted rows at a time. Before,
// a task held one 64-row tile, so a 512-token prefill converted every weight
// 8 times (12% of its time).
template <class V, DType D>
void PanelRangeTyped(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                     int64_t n0, int64_t n1) {
  constexpr int64_t kBlockRows = 128;
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  const int64_t ldp = SpreadStride(K);
  thread_local AlignedFloats block, xs, accs;
  if (block.size() < static_cast<size_t>(kBlockRows * ldp)) block.resize(kBlockRows * ldp);
  if (accs.size() < static_cast<size_t>(kPanelTileRows * kPanelRows * 16)) {
    accs.resize(kPanelTileRows * kPanelRows * 16);
  }
  if constexpr (D == DType::kFP8E4M3) {
    if (xs.size() < static_cast<size_t>(kPanelTileRows * ldp)) xs.resize(kPanelTileRows * ldp);
  }
  for (int64_t a = n0; a < n1;) {
    const int64_t b =
        D == DType::kFP8E4M3 ? Fp8BlockEnd(w.row_offset, a, n1) : std::min(n1, a + kBlockRows);
    // In runs that end on the stored tiles' edges (Matrix::row_tile).
    for (int64_t r = a; r < b;) {
      const int64_t q = r + w.row_phase;
      const int64_t e = std::min(b, (q / w.row_tile + 1) * w.row_tile - w.row_phase);
      DequantRows<V, D>(w, r, e - r, block.data() + (r - a) * ldp, ldp);
      r = e;
    }
    for (int m0 = 0; m0 < M; m0 += kPanelTileRows) {
      const int mt = std::min<int>(kPanelTileRows, M - m0);
      const float* xt = x + m0 * ldx;
      int64_t ldt = ldx;
      if constexpr (D == DType::kFP8E4M3) {
        ScaleTile<V>(w, a, xt, ldx, mt, xs.data(), ldp);
        xt = xs.data();
        ldt = ldp;
      }
      for (int64_t nb = a; nb < b; nb += kPanelRows) {
        const int64_t rows = std::min(kPanelRows, b - nb);
        const float* panel = block.data() + (nb - a) * ldp;
        if (K16 == 0) std::fill(accs.begin(), accs.begin() + mt * kPanelRows * 16, 0.0f);
        // Column passes of kPanelCols: within one, the panel slice (16 rows)
        // and an MR-row x tile stay in L2 while the tile meets every panel row.
        for (int64_t k0 = 0; k0 < K16; k0 += kPanelCols) {
          const int64_t k1 = std::min(K16, k0 + kPanelCols);
          PanelAllRows<V, V::kPanelMR>(panel, ldp, rows, k0, k1, xt, ldt, 0, mt, accs.data(),
                                       k0 == 0);
        }
        FinishPanel(accs.data(), panel, ldp, rows, xt, ldt, mt, y + m0 * ldy + nb, ldy, K16, K);
      }
    }
    a = b;
  }
}

// f(std::integral_constant<DType, D>) for w's dtype D: one switch for every
// entry point below.
template <class F>
void ByDType(DType d, F&& f) {
  switch (d) {
    case DType::kF32:
      return f(std::integral_constant<DType, DType::kF32>{});
    case DType::kBF16:
      return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16:
      return f(std::integral_constant<DType, DType::kF16>{});
    case DType::kFP8E4M3:
      return f(std::integral_constant<DType, DType::kFP8E4M3>{});
  }
}

// Rows [n0, n1) in registers from x itself: for FP8, x' of each 128-row
// scale block the range touches, then that block's rows.
template <class V, DType D>
void InRegistersFromX(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                      int64_t n0, int64_t n1) {
  if constexpr (D != DType::kFP8E4M3) {
    InRegisters<V, D>(w, x, ldx, M, y, ldy, n0, n1);
  } else {
    const int64_t ldxs = SpreadStride(w.cols);
    thread_local AlignedFloats xs;
    if (xs.size() < static_cast<size_t>(M * ldxs)) xs.resize(M * ldxs);
    // Rows of whole interleaved groups only: LoadW's columns would meet
    // x' * kFp8RawShift.
    const bool raw_groups = w.interleaved && w.cols % 64 == 0;
    for (int64_t a = n0; a < n1;) {
      const int64_t b = Fp8BlockEnd(w.row_offset, a, n1);
      if (raw_groups && ScaleTile<V, true>(w, a, x, ldx, M, xs.data(), ldxs)) {
        InRegisters<V, D, true>(w, xs.data(), ldxs, M, y, ldy, a, b);
      } else {
        ScaleTile<V>(w, a, x, ldx, M, xs.data(), ldxs);
        InRegisters<V, D>(w, xs.data(), ldxs, M, y, ldy, a, b);
      }
      a = b;
    }
  }
}

template <class V>
void MatMulRange(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1, bool panel) {
  ByDType(w.dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    if (panel) {
      PanelRangeTyped<V, D>(w, x, ldx, M, y, ldy, n0, n1);
    } else {
      InRegistersFromX<V, D>(w, x, ldx, M, y, ldy, n0, n1);
    }
  });
}

template <class V>
void DequantRow(const Matrix& w, int64_t r, float* out) {
  ByDType(w.dtype, [&](auto d) { DequantRowTyped<V, decltype(d)::value, true>(w, r, out); });
}

}  // namespace
}  // namespace ringlane::worker::cpu::internal::simd

#endif  // RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_
