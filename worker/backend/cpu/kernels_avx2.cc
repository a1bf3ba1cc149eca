// AVX2/FMA/F16C kernels. Compiled with those flags and called only after
// DetectIsa() saw them. Every kernel follows the reduction order stated in
// kernels.h; see there before changing any loop here.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/backend/cpu/attention_impl.h"
#include "worker/backend/cpu/kernels.h"

namespace ringlane::worker::cpu::internal {
namespace {

// Columns [k, k + 8) of a row, converted to float. For FP8 `scale_rebiased`
// is the block scale times 256: the F16 route below yields value / 256
// exactly, so one rounding of (value / 256) * (scale * 256) equals the scalar
// value * scale.
template <DType D>
inline __m256 Load8(const uint8_t* row, int64_t k, __m256 scale_rebiased) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (D == DType::kBF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (D == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  } else {
    // E4M3 s.eeee.mmm -> F16 s.0eeee.mmm0000000: same bits, exponent bias 15
    // instead of 7, so the F16 value is the E4M3 value times 2^-8, subnormals
    // included, and the F16 converter handles those at full speed (an F32
    // route through subnormal floats was measured 2.4x slower at 5 rows).
    // Sign-extending to 16 bits and shifting left by 7 leaves the sign in bits
    // 15 and 14; clearing bit 14 gives the F16 pattern. The NaN code 0x7f
    // becomes a finite number; quantizers never emit it.
    __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
    __m128i h = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(static_cast<short>(0xbfff)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), scale_rebiased);
  }
}

// E4M3 values come out of Load8 scaled by the inverse of this.
constexpr float kRebias = 256.0f;

// Columns [k, k + 16) of an FP8 row as two vectors, the values Load8 gives
// for [k, k + 8) and [k + 8, k + 16), from one 16-byte load.
inline void LoadFp8x16(const uint8_t* row, int64_t k, __m256 scale_rebiased, __m256* lo,
                       __m256* hi) {
  __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
  __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
  *lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale_rebiased);
  *hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale_rebiased);
}

// Scalar conversion of one element, equal to what Load8 yields for it.
inline float ScalarWeight(const Matrix& w, const uint8_t* row, int64_t r, int64_t c) {
  float v = LoadAsFloat(w.dtype, row, static_cast<size_t>(c));
  if (w.dtype == DType::kFP8E4M3) v = v * w.ScaleAt(r, c);
  return v;
}

// End of the run of columns starting at k that share one FP8 scale column.
inline int64_t ScaleRunEnd(const Matrix& w, int64_t k, int64_t limit) {
  int64_t global = w.col_offset + k;
  int64_t next = (global / kFp8BlockSize + 1) * kFp8BlockSize - w.col_offset;
  return std::min(next, limit);
}

// MR rows of x against NR consecutive weight rows starting at n, converting
// the weights in registers.
template <DType D, int MR, int NR>
void TileInRegisters(const Matrix& w, int64_t n, const float* x, int64_t ldx, float* y,
                     int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t K8 = K & ~int64_t{7};
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm256_setzero_ps();
  const uint8_t* rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = w.Row(n + j);

  int64_t k = 0;
  while (k < K8) {
    int64_t end = K8;
    __m256 s[NR];
    if constexpr (D == DType::kFP8E4M3) {
      end = ScaleRunEnd(w, k, K8);
      for (int j = 0; j < NR; ++j) s[j] = _mm256_set1_ps(w.ScaleAt(n + j, k) * kRebias);
    } else {
      for (int j = 0; j < NR; ++j) s[j] = _mm256_setzero_ps();
    }
    if constexpr (D == DType::kFP8E4M3) {
      // Two 8-column steps per load; the FMAs into each accumulator keep
      // their order (columns k..k+7, then k+8..k+15).
      for (; k + 16 <= end; k += 16) {
        __m256 xlo[MR], xhi[MR];
        for (int m = 0; m < MR; ++m) {
          xlo[m] = _mm256_loadu_ps(x + m * ldx + k);
          xhi[m] = _mm256_loadu_ps(x + m * ldx + k + 8);
        }
        for (int j = 0; j < NR; ++j) {
          __m256 wlo, whi;
          LoadFp8x16(rows[j], k, s[j], &wlo, &whi);
          for (int m = 0; m < MR; ++m) {
            acc[m][j] = _mm256_fmadd_ps(wlo, xlo[m], acc[m][j]);
            acc[m][j] = _mm256_fmadd_ps(whi, xhi[m], acc[m][j]);
          }
        }
      }
    }
    for (; k < end; k += 8) {
      __m256 xv[MR];
      for (int m = 0; m < MR; ++m) xv[m] = _mm256_loadu_ps(x + m * ldx + k);
      for (int j = 0; j < NR; ++j) {
        __m256 wv = Load8<D>(rows[j], k, s[j]);
        for (int m = 0; m < MR; ++m) acc[m][j] = _mm256_fmadd_ps(wv, xv[m], acc[m][j]);
      }
    }
  }
  for (int j = 0; j < NR; ++j) {
    for (int m = 0; m < MR; ++m) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[m][j]);
      const float* xm = x + m * ldx;
      for (int64_t t = K8; t < K; ++t) {
        a[t - K8] = std::fma(ScalarWeight(w, rows[j], n + j, t), xm[t], a[t - K8]);
      }
      y[m * ldy + n + j] = Hsum8(a);
    }
  }
}

// The same sums from a panel of already converted weights (NR rows of ldp
// floats): identical values, identical order.
template <int MR, int NR>
void TileFromPanel(const float* panel, int64_t ldp, int64_t K, int64_t n, const float* x,
                   int64_t ldx, float* y, int64_t ldy) {
  const int64_t K8 = K & ~int64_t{7};
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = _mm256_loadu_ps(x + m * ldx + k);
    for (int j = 0; j < NR; ++j) {
      __m256 wv = _mm256_loadu_ps(panel + j * ldp + k);
      for (int m = 0; m < MR; ++m) acc[m][j] = _mm256_fmadd_ps(wv, xv[m], acc[m][j]);
    }
  }
  for (int j = 0; j < NR; ++j) {
    for (int m = 0; m < MR; ++m) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[m][j]);
      const float* xm = x + m * ldx;
      const float* pj = panel + j * ldp;
      for (int64_t t = K8; t < K; ++t) a[t - K8] = std::fma(pj[t], xm[t], a[t - K8]);
      y[m * ldy + n + j] = Hsum8(a);
    }
  }
}

template <DType D>
void DequantRowTyped(const Matrix& w, int64_t r, float* out) {
  const int64_t K = w.cols;
  const int64_t K8 = K & ~int64_t{7};
  const uint8_t* row = w.Row(r);
  int64_t k = 0;
  while (k < K8) {
    int64_t end = K8;
    __m256 s = _mm256_setzero_ps();
    if constexpr (D == DType::kFP8E4M3) {
      end = ScaleRunEnd(w, k, K8);
      s = _mm256_set1_ps(w.ScaleAt(r, k) * kRebias);
    }
    for (; k < end; k += 8) _mm256_storeu_ps(out + k, Load8<D>(row, k, s));
  }
  for (int64_t t = K8; t < K; ++t) out[t] = ScalarWeight(w, row, r, t);
}

// Row tiles of the in-register path by M: enough independent accumulators to
// hide FMA latency, few enough to stay in the 16 vector registers.
template <DType D, int MR>
void RowsInRegisters(const Matrix& w, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int64_t n0, int64_t n1) {
  constexpr int NR = MR <= 3 ? 4 : (MR == 4 ? 3 : 2);
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) TileInRegisters<D, MR, NR>(w, n, x, ldx, y, ldy);
  for (; n < n1; ++n) TileInRegisters<D, MR, 1>(w, n, x, ldx, y, ldy);
}

template <DType D>
void InRegisters(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  // Up to 6 rows in one tile, so each weight is converted once per step for
  // the usual decode batches; beyond that, tiles of 4.
  int m = 0;
  if (M == 5) return RowsInRegisters<D, 5>(w, x, ldx, y, ldy, n0, n1);
  if (M == 6) return RowsInRegisters<D, 6>(w, x, ldx, y, ldy, n0, n1);
  for (; m + 4 <= M; m += 4) RowsInRegisters<D, 4>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
  switch (M - m) {
    case 3:
      RowsInRegisters<D, 3>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
      break;
    case 2:
      RowsInRegisters<D, 2>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
      break;
    case 1:
      RowsInRegisters<D, 1>(w, x + m * ldx, ldx, y + m * ldy, ldy, n0, n1);
      break;
    default:
      break;
  }
}

template <int NR>
void PanelColumns(const float* panel, int64_t ldp, int64_t K, int64_t n, const float* x,
                  int64_t ldx, int M, float* y, int64_t ldy) {
  int m = 0;
  for (; m + 3 <= M; m += 3)
    TileFromPanel<3, NR>(panel, ldp, K, n, x + m * ldx, ldx, y + m * ldy, ldy);
  if (M - m == 2) TileFromPanel<2, NR>(panel, ldp, K, n, x + m * ldx, ldx, y + m * ldy, ldy);
  if (M - m == 1) TileFromPanel<1, NR>(panel, ldp, K, n, x + m * ldx, ldx, y + m * ldy, ldy);
}

template <DType D>
void ThroughPanel(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                  int64_t n0, int64_t n1) {
  constexpr int64_t kPanelRows = 16;
  const int64_t K = w.cols;
  const int64_t ldp = (K + 15) & ~int64_t{15};
  thread_local std::vector<float> panel;
  if (panel.size() < static_cast<size_t>(kPanelRows * ldp)) panel.resize(kPanelRows * ldp);
  for (int64_t nb = n0; nb < n1; nb += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, n1 - nb);
    for (int64_t j = 0; j < rows; ++j) DequantRowTyped<D>(w, nb + j, panel.data() + j * ldp);
    // Within the block: 3 x 4 tiles over all of x, so each panel row is read
    // from cache M/3 times and each x row once per 4 weight rows.
    int64_t j = 0;
    for (; j + 4 <= rows; j += 4)
      PanelColumns<4>(panel.data() + j * ldp, ldp, K, nb + j, x, ldx, M, y, ldy);
    for (; j < rows; ++j)
      PanelColumns<1>(panel.data() + j * ldp, ldp, K, nb + j, x, ldx, M, y, ldy);
  }
}

template <DType D>
void Dispatch(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
              int64_t n0, int64_t n1, bool use_panel) {
  if (use_panel) {
    ThroughPanel<D>(w, x, ldx, M, y, ldy, n0, n1);
  } else {
    InRegisters<D>(w, x, ldx, M, y, ldy, n0, n1);
  }
}

}  // namespace

void MatMulRangeAvx2(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                     int64_t n0, int64_t n1, bool use_panel) {
  switch (w.dtype) {
    case DType::kF32:
      return Dispatch<DType::kF32>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kBF16:
      return Dispatch<DType::kBF16>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kF16:
      return Dispatch<DType::kF16>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
    case DType::kFP8E4M3:
      return Dispatch<DType::kFP8E4M3>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
  }
}

void AttendHeadAvx2(const AttendArgs& a) { AttendHeadImpl(a); }

void DequantRowAvx2(const Matrix& w, int64_t r, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      return DequantRowTyped<DType::kF32>(w, r, out);
    case DType::kBF16:
      return DequantRowTyped<DType::kBF16>(w, r, out);
    case DType::kF16:
      return DequantRowTyped<DType::kF16>(w, r, out);
    case DType::kFP8E4M3:
      return DequantRowTyped<DType::kFP8E4M3>(w, r, out);
  }
}

}  // namespace ringlane::worker::cpu::internal
