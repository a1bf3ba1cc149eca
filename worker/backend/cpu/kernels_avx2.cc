// AVX2/FMA/F16C kernels: the 16 lanes of kernels.h as two 256-bit registers.
// Compiled with those flags and called only after DetectIsa() saw them.
#include <immintrin.h>

#include "worker/backend/cpu/attention_impl.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/backend/cpu/kernels_simd.h"

namespace ringlane::worker::cpu::internal {
namespace {

struct Avx2 {
  struct Vec {
    __m256 lo, hi;  // lanes 0..7 and 8..15
  };
  using Scale = __m256;

  static Vec Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Scale SetScale(float s) { return _mm256_set1_ps(s); }
  static Vec Mul(Vec v, Scale s) { return {_mm256_mul_ps(v.lo, s), _mm256_mul_ps(v.hi, s)}; }
  static Vec LoadF(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Vec Fma(Vec w, Vec x, Vec a) {
    return {_mm256_fmadd_ps(w.lo, x.lo, a.lo), _mm256_fmadd_ps(w.hi, x.hi, a.hi)};
  }
  static void Store(Vec v, float* p) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }

  template <DType D>
  static Vec LoadW(const uint8_t* row, int64_t k) {
    if constexpr (D == DType::kF32) {
      return LoadF(reinterpret_cast<const float*>(row) + k);
    } else if constexpr (D == DType::kBF16) {
      const __m128i* p = reinterpret_cast<const __m128i*>(row + 2 * k);
      auto widen = [](__m128i h) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      };
      return {widen(_mm_loadu_si128(p)), widen(_mm_loadu_si128(p + 1))};
    } else if constexpr (D == DType::kF16) {
      const __m128i* p = reinterpret_cast<const __m128i*>(row + 2 * k);
      return {_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p + 1))};
    } else {
      // E4M3 s.eeee.mmm -> F16 s.0eeee.mmm0000000: the same bits with exponent
      // bias 15 instead of 7, so the F16 value is the E4M3 value times 2^-8,
      // subnormals included; F16C converts those at full speed (an F32 route
      // through subnormal floats measured 2.4x slower). Sign-extending to 16
      // bits and shifting left by 7 leaves the sign in bits 15 and 14; clearing
      // bit 14 gives the F16 pattern. The NaN code 0x7f becomes a finite
      // number; quantizers never emit it.
      __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
      __m256i h =
          _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
      return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    }
  }

  // An interleaved group (Matrix::interleaved), as in kernels_avx512.cc one
  // 32-byte half at a time: half h holds columns 16h..16h+15 in its low bytes
  // and 32+16h.. in its high ones.
  static void LoadW64(const uint8_t* group, Vec out[4]) {
    const __m256i keep = _mm256_set1_epi16(static_cast<short>(0xbf80));
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * h));
      const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), keep);
      const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(v, 1), keep);
      out[h] = {_mm256_cvtph_ps(_mm256_castsi256_si128(lo)),
                _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1))};
      out[2 + h] = {_mm256_cvtph_ps(_mm256_castsi256_si128(hi)),
                    _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1))};
    }
  }

  // Two registers per accumulator: tiles of at most 12 registers.
  static constexpr int NrFor(int mr) { return mr == 1 ? 4 : (mr == 2 ? 3 : (mr == 3 ? 2 : 1)); }
  static constexpr int kPanelMR = 3;
  static constexpr int kPanelNR = 2;
};

}  // namespace

void MatMulRangeAvx2(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                     int64_t n0, int64_t n1, bool use_panel) {
  simd::MatMulRange<Avx2>(w, x, ldx, M, y, ldy, n0, n1, use_panel);
}

void DequantRowAvx2(const Matrix& w, int64_t r, float* out) { simd::DequantRow<Avx2>(w, r, out); }

void AttendHeadAvx2(const AttendArgs& a) { AttendHeadImpl(a); }

void IndexerScoresAvx2(const IndexerScoreArgs& a) { IndexerScoresImpl(a); }

}  // namespace ringlane::worker::cpu::internal
