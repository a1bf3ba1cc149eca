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
//   Vec Fma(Vec w, Vec x, Vec acc)  lane-wise fused multiply-add
//   void Store(Vec v, float* p)
//   constexpr int NrFor(int mr)  weight rows per in-register tile of mr rows
//   constexpr int kPanelMR, kPanelNR
#ifndef RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_
#define RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/aligned.h"
#include "worker/backend/cpu/kernels.h"

// An anonymous namespace: each including file gets its own copy, compiled
// with its own instruction set flags, so the linker can never hand one file's
// AVX-512 code to another's callers.
namespace ringlane::worker::cpu::internal::simd {
namespace {

// The tail columns and the final sum of one output, from its 16 lanes.
inline float Finish(float* a, const float* wrow_or_null, const Matrix* w, const uint8_t* row,
                    const float* xm, int64_t K16, int64_t K) {
  for (int64_t t = K16; t < K; ++t) {
    const float wv = wrow_or_null != nullptr ? wrow_or_null[t] : KernelWeight(*w, row, t);
    a[t - K16] = std::fma(wv, xm[t], a[t - K16]);
  }
  // Hsum16 of kernels.h, the same additions in the same tree, inlined here:
  // prefill finishes hundreds of millions of outputs.
  float h[8];
  for (int l = 0; l < 8; ++l) h[l] = a[l] + a[l + 8];
  return ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));
}

// MR rows of x against NR consecutive weight rows starting at n, converting
// the weights in registers.
template <class V, DType D, int MR, int NR>
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
        for (int j = 0; j < NR; ++j) __builtin_prefetch(next[j] + at);
        for (int j = 0; j < NR; ++j) {
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
      y[m * ldy + n + j] = Finish(a, nullptr, &w, rows[j], x + m * ldx, K16, K);
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
template <class V, DType D, bool scaled>
void DequantRowTyped(const Matrix& w, int64_t r, float* out) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  const uint8_t* row = w.Row(r);
  int64_t k = 0;
  if constexpr (D == DType::kFP8E4M3) {
    if (w.interleaved) {
      for (int64_t K64 = K & ~int64_t{63}, at = 0; k < K64; k += 64, at += 64 * w.row_tile) {
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

template <class V, DType D, int MR>
void RowsInRegisters(const Matrix& w, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int64_t n0, int64_t n1) {
  constexpr int NR = V::NrFor(MR);
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) TileInRegisters<V, D, MR, NR>(w, n, x, ldx, y, ldy);
  for (; n < n1; ++n) TileInRegisters<V, D, MR, 1>(w, n, x, ldx, y, ldy);
}

// Up to 6 rows in one tile, so each weight is converted once per step for the
// usual decode batches; beyond that, tiles of 4.
template <class V, DType D>
void InRegisters(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  int m = 0;
  if (M > 6) {
    for (; M - m > 6; m += 4)
      RowsInRegisters<V, D, 4>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
  }
  const float* xm = x + m * ldx;
  float* ym = y + m * ldy;
  switch (M - m) {
    case 6:
      return RowsInRegisters<V, D, 6>(w, xm, ldx, ym, ldy, n0, n1);
    case 5:
      return RowsInRegisters<V, D, 5>(w, xm, ldx, ym, ldy, n0, n1);
    case 4:
      return RowsInRegisters<V, D, 4>(w, xm, ldx, ym, ldy, n0, n1);
    case 3:
      return RowsInRegisters<V, D, 3>(w, xm, ldx, ym, ldy, n0, n1);
    case 2:
      return RowsInRegisters<V, D, 2>(w, xm, ldx, ym, ldy, n0, n1);
    case 1:
      return RowsInRegisters<V, D, 1>(w, xm, ldx, ym, ldy, n0, n1);
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

template <class V, DType D>
void ThroughPanel(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                  int64_t n0, int64_t n1) {
  const int64_t K = w.cols;
  const int64_t K16 = K & ~int64_t{15};
  const int64_t ldp = SpreadStride(K);
  thread_local AlignedFloats panel, accs;
  if (panel.size() < static_cast<size_t>(kPanelRows * ldp)) panel.resize(kPanelRows * ldp);
  if (accs.size() < static_cast<size_t>(M * kPanelRows * 16)) accs.resize(M * kPanelRows * 16);
  for (int64_t nb = n0; nb < n1; nb += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, n1 - nb);
    for (int64_t j = 0; j < rows; ++j) {
      DequantRowTyped<V, D, false>(w, nb + j, panel.data() + j * ldp);
    }
    if (K16 == 0) std::fill(accs.begin(), accs.begin() + M * kPanelRows * 16, 0.0f);
    // Column passes of kPanelCols: within one, the panel slice (16 rows) and
    // an MR-row x tile stay in L2 while the tile meets every panel row.
    for (int64_t k0 = 0; k0 < K16; k0 += kPanelCols) {
      const int64_t k1 = std::min(K16, k0 + kPanelCols);
      PanelAllRows<V, V::kPanelMR>(panel.data(), ldp, rows, k0, k1, x, ldx, 0, M, accs.data(),
                                   k0 == 0);
    }
    for (int m = 0; m < M; ++m) {
      for (int64_t j = 0; j < rows; ++j) {
        float* a = accs.data() + (m * kPanelRows + j) * 16;
        y[m * ldy + nb + j] =
            Finish(a, panel.data() + j * ldp, nullptr, nullptr, x + m * ldx, K16, K);
      }
    }
  }
}

template <class V, DType D>
void Dispatch(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
              int64_t n0, int64_t n1, bool use_panel) {
  if (use_panel) {
    ThroughPanel<V, D>(w, x, ldx, M, y, ldy, n0, n1);
  } else {
    InRegisters<V, D>(w, x, ldx, M, y, ldy, n0, n1);
  }
}

template <class V>
void MatMulRange(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1, bool use_panel) {
  switch (w.dtype) {
    case DType::kF32:
      return Dispatch<V, DType::kF32>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kBF16:
      return Dispatch<V, DType::kBF16>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kF16:
      return Dispatch<V, DType::kF16>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kFP8E4M3:
      return Dispatch<V, DType::kFP8E4M3>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
  }
}

template <class V>
void DequantRow(const Matrix& w, int64_t r, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      return DequantRowTyped<V, DType::kF32, true>(w, r, out);
    case DType::kBF16:
      return DequantRowTyped<V, DType::kBF16, true>(w, r, out);
    case DType::kF16:
      return DequantRowTyped<V, DType::kF16, true>(w, r, out);
    case DType::kFP8E4M3:
      return DequantRowTyped<V, DType::kFP8E4M3, true>(w, r, out);
  }
}

}  // namespace
}  // namespace ringlane::worker::cpu::internal::simd

#endif  // RINGLANE_WORKER_BACKEND_CPU_KERNELS_SIMD_H_
