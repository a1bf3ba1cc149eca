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

  // An interleaved group (Matrix::interleaved) as value * 2^-120
  // (kFp8RawShift): 32-bit lane i holds columns i, 16 + i, 32 + i, 48 + i in
  // its bytes 0..3. An arithmetic shift right by 4 of a 16-bit lane puts its
  // high byte's sign in bits 15..11 and the exponent and mantissa in bits
  // 10..4, which in the high half of a 32-bit lane are F32's sign, low
  // exponent bits and top mantissa bits; the low halves move up by 16 and the
  // low bytes up by 8 first, and a mask keeps those bits. 5 shifts and 4 ands
  // per 64 weights on the simple integer ports, where the F16 route took
  // 4 conversions of two uops each plus 7 operations.
  static void LoadW64Raw(const uint8_t* group, Vec out[4]) {
    const __m512i v = _mm512_loadu_si512(group);
    const __m512i keep = _mm512_set1_epi32(static_cast<int>(0x87f00000u));
    const __m512i odd = _mm512_srai_epi16(v, 4);                         // bytes 1, 3
    const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);  // bytes 0, 2
    out[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(even, 16), keep));
    out[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(odd, 16), keep));
    out[2] = _mm512_castsi512_ps(_mm512_and_si512(even, keep));
    out[3] = _mm512_castsi512_ps(_mm512_and_si512(odd, keep));
  }
  // As LoadW yields them (value / kFp8Rebias): exact, a power of two.
  static void LoadW64(const uint8_t* group, Vec out[4]) {
    LoadW64Raw(group, out);
    for (int s = 0; s < 4; ++s) out[s] = _mm512_mul_ps(out[s], _mm512_set1_ps(kFp8RawShift));
  }
  using Part = Vec;
  static constexpr int kGroupParts = 1;
  template <int>
  static void LoadW64RawPart(const uint8_t* group, Part out[4]) {
    LoadW64Raw(group, out);
  }
  template <int>
  static void FmaPart(Part w, const float* x, Vec& acc) {
    acc = Fma(w, LoadF(x), acc);
  }
  // The largest |v| of a tile of x', to choose the raw route.
  static Vec MaxAbs(Vec m, Vec v) { return _mm512_max_ps(m, _mm512_abs_ps(v)); }
  static float HMax(Vec m) { return _mm512_reduce_max_ps(m); }

  // 32 registers: tiles of up to 20 accumulators. Four weight rows for a
  // batch of 5 too, not 3: measured 1.2-1.4x on the engine's batch of 5
  // (a 4-row tile is one stream of Matrix::row_tile, and rows in order
  // gained as much). One row of x takes 8 weight rows, two row tiles: its 4
  // FMA chains per tile were the limit in L2 (38 GB/s), and 8 chains with two
  // streams took more of a plain read from DRAM (BM_MatMulDram/1/0, 0.75 ->
  // 0.80 of it, 3 alternating runs) though 0.9x in L2.
  static constexpr int NrFor(int mr) { return mr == 1 ? 8 : (mr <= 5 ? 4 : 3); }
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
