// AVX-512 kernels: the 16 lanes of kernels.h as one 512-bit register, so one
// instruction converts or accumulates what takes two in kernels_avx2.cc, with
// the same results bit for bit. Compiled with AVX-512F and BW (plus
// AVX2/FMA/F16C) and called only after DetectIsa() saw them.
#include <immintrin.h>

#include "worker/backend/cpu/kernels.h"
#include "worker/backend/cpu/kernels_simd.h"

namespace ringlane::worker::cpu::internal {
namespace {

struct Avx512 {
  using Vec = __m512;
  using Scale = __m512;

  static Vec Zero() { return _mm512_setzero_ps(); }
  static Scale SetScale(float s) { return _mm512_set1_ps(s); }
  static Vec Mul(Vec v, Scale s) { return _mm512_mul_ps(v, s); }
  static Vec LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static Vec Fma(Vec w, Vec x, Vec a) { return _mm512_fmadd_ps(w, x, a); }
  static void Store(Vec v, float* p) { _mm512_storeu_ps(p, v); }

  template <DType D>
  static Vec LoadW(const uint8_t* row, int64_t k) {
    if constexpr (D == DType::kF32) {
      return LoadF(reinterpret_cast<const float*>(row) + k);
    } else if constexpr (D == DType::kBF16) {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else if constexpr (D == DType::kF16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
    } else {
      // The E4M3 -> F16 bit move of kernels_avx2.cc, then one 16-wide
      // conversion.
      __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
      __m256i h =
          _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
      return _mm512_cvtph_ps(h);
    }
  }

  // An interleaved group (Matrix::interleaved): 16-bit lane j holds column j
  // in its low byte and column 32 + j in its high byte. The high byte is in
  // place after an arithmetic shift right by 1 (the sign lands in bits 15
  // and 14, E4M3's exponent and mantissa under F16's), the low byte after a
  // shift left by 8 first; clearing bit 14 and the bits below the mantissa
  // gives the F16 pattern of LoadW. 5 integer operations per 64 weights where
  // LoadW takes 3 per 16, on the ports the conversions and FMAs need.
  static void LoadW64(const uint8_t* group, Vec out[4]) {
    const __m512i v = _mm512_loadu_si512(group);
    const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xbf80));
    const __m512i lo = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1), keep);
    const __m512i hi = _mm512_and_si512(_mm512_srai_epi16(v, 1), keep);
    out[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
    out[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo, 1));
    out[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(hi));
    out[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hi, 1));
  }

  // 32 registers: tiles of up to 20 accumulators. Four weight rows for a
  // batch of 5 too, not 3: measured 1.2-1.4x on the engine's batch of 5
  // (a 4-row tile is one stream of Matrix::row_tile, and rows in order
  // gained as much).
  static constexpr int NrFor(int mr) { return mr <= 5 ? 4 : 3; }
  static constexpr int kPanelMR = 6;
  static constexpr int kPanelNR = 4;
};

}  // namespace

void MatMulRangeAvx512(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                       int64_t n0, int64_t n1, bool panel) {
  simd::MatMulRange<Avx512>(w, x, ldx, M, y, ldy, n0, n1, panel);
}

void DequantRowAvx512(const Matrix& w, int64_t r, float* out) {
  simd::DequantRow<Avx512>(w, r, out);
}

}  // namespace ringlane::worker::cpu::internal
