// AVX2/FMA/F16C kernels: the 16 lanes of kernels.h as two 256-bit registers.
// Compiled with those flags and called only after DetectIsa() saw them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "worker/backend/cpu/attention_impl.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/backend/cpu/kernels_simd.h"

namespace ringlane::worker::cpu::internal {
namespace {

// 8 BF16 values to floats: the bits moved up by 16, exact.
inline __m256 Bf16x8ToFloat(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

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
      return {Bf16x8ToFloat(_mm_loadu_si128(p)), Bf16x8ToFloat(_mm_loadu_si128(p + 1))};
    } else if constexpr (D == DType::kF16) {
      const __m128i* p = reinterpret_cast<const __m128i*>(row + 2 * k);
      return {_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p + 1))};
    } else {
      // E4M3 s.eeee.mmm -> F16 s.0eeee.mmm0000000: the same bits with exponent
      // bias 15 instead of 7, so the F16 value is the E4M3 value times 2^-8,
      // subnormals included; F16C converts those at full speed (an F32 route
      // through subnormal floats once measured 2.4x slower; the interleaved
      // groups' LoadW64Raw takes that route now, and on the AMD EPYC here
      // weights 80% subnormal run as fast as normal ones,
      // ringlane-kernels-bench FP8RowTilesSubnormalInL2). Sign-extending to 16
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

  // An interleaved group (Matrix::interleaved) as value * 2^-120, as in
  // kernels_avx512.cc one 32-byte half at a time: half h holds lanes
  // 8h..8h+7 of each of the four outputs.
  static void LoadHalfRaw(const uint8_t* group, int h, __m256 f[4]) {
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(0x87f00000u));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * h));
    const __m256i odd = _mm256_srai_epi16(v, 4);
    const __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
    f[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(even, 16), keep));
    f[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(odd, 16), keep));
    f[2] = _mm256_castsi256_ps(_mm256_and_si256(even, keep));
    f[3] = _mm256_castsi256_ps(_mm256_and_si256(odd, keep));
  }
  static void LoadW64Raw(const uint8_t* group, Vec out[4]) {
    for (int h = 0; h < 2; ++h) {
      __m256 f[4];
      LoadHalfRaw(group, h, f);
      for (int s = 0; s < 4; ++s) (h == 0 ? out[s].lo : out[s].hi) = f[s];
    }
  }
  // Half by half in the decode kernel: each half feeds only its own lanes'
  // accumulators, so it holds 4 registers of weights where LoadW64Raw's 8
  // would leave too few of the 16 for a 5-row tile's 10 accumulators.
  using Part = __m256;
  static constexpr int kGroupParts = 2;
  template <int h>
  static void LoadW64RawPart(const uint8_t* group, Part out[4]) {
    LoadHalfRaw(group, h, out);
  }
  template <int h>
  static void FmaPart(Part w, const float* x, Vec& acc) {
    __m256& a = h == 0 ? acc.lo : acc.hi;
    a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8 * h), a);
  }
  static void LoadW64(const uint8_t* group, Vec out[4]) {
    LoadW64Raw(group, out);
    const __m256 shift = _mm256_set1_ps(kFp8RawShift);
    for (int s = 0; s < 4; ++s)
      out[s] = {_mm256_mul_ps(out[s].lo, shift), _mm256_mul_ps(out[s].hi, shift)};
  }
  static Vec MaxAbs(Vec m, Vec v) {
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return {_mm256_max_ps(m.lo, _mm256_and_ps(v.lo, mag)),
            _mm256_max_ps(m.hi, _mm256_and_ps(v.hi, mag))};
  }
  static float HMax(Vec m) {
    alignas(32) float a[8];
    _mm256_store_ps(a, _mm256_max_ps(m.lo, m.hi));
    return *std::max_element(a, a + 8);
  }

  // Two registers per accumulator: tiles of at most 12 registers.
  static constexpr int NrFor(int mr) { return mr == 1 ? 4 : (mr == 2 ? 3 : (mr == 3 ? 2 : 1)); }
  static constexpr int kPanelMR = 3;
  static constexpr int kPanelNR = 2;
};

}  // namespace

void MatMulRangeAvx2(const Matrix& w, const float* x, int64_t ldx, int M, float* y, int64_t ldy,
                     int64_t n0, int64_t n1, bool panel) {
  simd::MatMulRange<Avx2>(w, x, ldx, M, y, ldy, n0, n1, panel);
}

void DequantRowAvx2(const Matrix& w, int64_t r, float* out) { simd::DequantRow<Avx2>(w, r, out); }

namespace {

// SoftmaxExp (attention_impl.h) on 8 lanes, operation for operation.
__m256 SoftmaxExp8(__m256 x) {
  const __m256 low = _mm256_set1_ps(kExpLow);
  const __m256 shift = _mm256_set1_ps(kExpShift);
  const __m256 under = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  const __m256 xc = _mm256_blendv_ps(x, low, under);
  const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(kExpLog2e), shift);
  const __m256 n = _mm256_sub_ps(t, shift);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Hi), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i two_n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shift)),
                       _mm256_set1_epi32(127)),
      23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
  return _mm256_blendv_ps(e, _mm256_setzero_ps(), under);
}

// Scores of positions [j0, j0 + 8 * V) for query q, scaled, stored in s.
// K's position j0 is column kj of kt (rows of ldkt floats).
template <int V>
void ScoreBlock(const AttendArgs& a, const float* q, const float* kt, int64_t ldkt, int64_t kj,
                int64_t j0, __m256 scale, bool multiply, float* s, __m256* lane_max) {
  __m256 acc[V];
  for (int i = 0; i < V; ++i) acc[i] = _mm256_setzero_ps();
  for (int d = 0; d < a.head_dim; ++d) {
    const __m256 qd = _mm256_set1_ps(q[d]);
    const float* kd = kt + d * ldkt + kj;
    for (int i = 0; i < V; ++i) acc[i] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kd + 8 * i), acc[i]);
  }
  for (int i = 0; i < V; ++i) {
    const __m256 v = multiply ? _mm256_mul_ps(acc[i], scale) : _mm256_div_ps(acc[i], scale);
    _mm256_storeu_ps(s + j0 + 8 * i, v);
    // max(v, m) is v > m ? v : m, the reference's comparison.
    *lane_max = _mm256_max_ps(v, *lane_max);
  }
}

// Positions [j0, j1) of the values weighted by p into o[d0, d0 + 8 * kChunk)
// (less at the end of vd, a multiple of 8), so the accumulators stay in
// registers; from zero at j0 = 0, else on from what o holds: an output's
// chain stays in increasing position however the positions are split.
// V's row j is at v + (j - v0) * ldv.
void AccumulateValues(const float* v_rows, int64_t ldv, int64_t v0, const float* p, int64_t j0,
                      int64_t j1, int d0, int vd, float* o) {
  constexpr int kChunk = 8;
  const int vecs = (vd - d0) / 8 < kChunk ? (vd - d0) / 8 : kChunk;
  __m256 acc[kChunk];
  for (int i = 0; i < vecs; ++i)
    acc[i] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + d0 + 8 * i);
  for (int64_t j = j0; j < j1; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* v = v_rows + (j - v0) * ldv + d0;
    for (int i = 0; i < vecs; ++i) acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * i), acc[i]);
  }
  for (int i = 0; i < vecs; ++i) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
}

// NarrowValue for the vd8 (8 or 16) vector outputs of narrow values: the
// same partial sums, added in the same order.
template <int kVecs>
void AccumulateNarrowValues(const AttendArgs& a, const float* p, int64_t n, float* o) {
  __m256 acc[kValueLanes][kVecs];
  for (int l = 0; l < kValueLanes; ++l)
    for (int i = 0; i < kVecs; ++i) acc[l][i] = _mm256_setzero_ps();
  // Position j into partial sum l (j % kValueLanes).
  auto add = [&](int64_t j, int l) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* v = a.v + j * a.ldv;
    for (int i = 0; i < kVecs; ++i)
      acc[l][i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * i), acc[l][i]);
  };
  int64_t j = 0;
  for (; j + kValueLanes <= n; j += kValueLanes) {
    for (int l = 0; l < kValueLanes; ++l) add(j + l, l);
  }
  for (int l = 0; j < n; ++j, ++l) add(j, l);
  for (int i = 0; i < kVecs; ++i) {
    _mm256_storeu_ps(o + 8 * i, _mm256_add_ps(_mm256_add_ps(acc[0][i], acc[1][i]),
                                              _mm256_add_ps(acc[2][i], acc[3][i])));
  }
}

// Heads attended in one pass over K and V (AttendHeads): their lane maxima
// stay in registers. A block of 32 positions of K (hd rows of 128 bytes) and
// kValueChunk positions of V stay in L2 while every head of the pass uses
// them.
constexpr int kHeadsPerPass = 16;
constexpr int64_t kValueChunk = kAttendVTile;
static_assert(kAttendKTile == 32, "a tile of K is one 32-position block of scores");

// AttendHeadImpl's arithmetic for each head of the pass, each position's and
// each output's operations in the same order (checked bit for bit against it
// by kernels_test), with the positions' loops on 8 lanes: the lane j % 8 of
// the max and the sum is the register lane. Only the order in which heads
// and blocks of positions are visited differs from one head at a time.
// With a KvTileSource (AttendArgs::source, wide values only: AttendHeads
// hands narrow ones whole copies) K comes a kAttendKTile block at a time and
// V a kValueChunk at a time, each converted once for the pass's heads.
void AttendPassAvx2(const AttendArgs* hs, int count) {
  constexpr int L = kSoftmaxLanes;
  static_assert(L == 8, "one register of lanes");
  const AttendArgs& a0 = hs[0];
  const float sqrt_hd = std::sqrt(static_cast<float>(a0.head_dim));
  const bool multiply = a0.scale > 0.0f;
  const float scale_f = multiply ? a0.scale : sqrt_hd;
  const __m256 scale = _mm256_set1_ps(scale_f);
  const int vd = a0.v_dim > 0 ? a0.v_dim : a0.head_dim;
  const int vd8 = vd - vd % 8;
  const KvTileSource* src = a0.source;
  // The tiles of a source: a few KiB per thread, reused for every call.
  thread_local AlignedFloats k_tile, v_tile;
  const int64_t ld_vtile = std::max(a0.head_dim, vd);
  if (src != nullptr) {
    k_tile.resize(static_cast<size_t>(kAttendKTile) * a0.head_dim);
    v_tile.resize(static_cast<size_t>(kValueChunk * ld_vtile));
  }
  for (int r = 0; r < a0.rows; ++r) {
    const int64_t n = a0.positions[r] + 1;
    const int64_t n_full = n - n % L;
    __m256 lane_max[kHeadsPerPass];
    for (int h = 0; h < count; ++h) lane_max[h] = _mm256_set1_ps(-INFINITY);
    // Where K is: position j is column j - kt0 of kt. The positions past
    // n_full (scored one at a time below) lie in the last tile a source
    // filled, which starts at or before n_full.
    const float* kt = a0.kt;
    int64_t ldkt = a0.ldkt, kt0 = 0;
    auto score = [&](int64_t j0, int64_t j1) {
      int64_t j = j0;
      for (; j + 32 <= j1; j += 32) {
        for (int h = 0; h < count; ++h) {
          ScoreBlock<4>(hs[h], hs[h].q + r * hs[h].ldq, kt, ldkt, j - kt0, j, scale, multiply,
                        hs[h].scores, &lane_max[h]);
        }
      }
      for (; j < j1; j += 8) {
        for (int h = 0; h < count; ++h) {
          ScoreBlock<1>(hs[h], hs[h].q + r * hs[h].ldq, kt, ldkt, j - kt0, j, scale, multiply,
                        hs[h].scores, &lane_max[h]);
        }
      }
    };
    if (src == nullptr) {
      score(0, n_full);
    } else {
      for (int64_t t0 = 0; t0 < n; t0 += kAttendKTile) {
        const int64_t t1 = std::min<int64_t>(n, t0 + kAttendKTile);
        src->fill(src->ctx, false, t0, t1, k_tile.data(), kAttendKTile);
        kt = k_tile.data();
        ldkt = kAttendKTile;
        kt0 = t0;
        score(t0, std::min(t1, n_full));
      }
    }
    int64_t j;
    for (int h = 0; h < count; ++h) {
      const AttendArgs& a = hs[h];
      const float* q = a.q + r * a.ldq;
      float* s = a.scores;
      alignas(32) float lane[L];
      _mm256_store_ps(lane, lane_max[h]);
      for (j = n_full; j < n; ++j) {
        float sj = 0.0f;
        for (int d = 0; d < a.head_dim; ++d) sj = std::fma(q[d], kt[d * ldkt + j - kt0], sj);
        sj = multiply ? sj * scale_f : sj / scale_f;
        s[j] = sj;
        lane[j - n_full] = sj > lane[j - n_full] ? sj : lane[j - n_full];
      }
      const float mx = LaneTreeMax(lane);
      const __m256 mxv = _mm256_set1_ps(mx);
      __m256 sum8 = _mm256_setzero_ps();
      for (j = 0; j < n_full; j += 8) {
        const __m256 e = SoftmaxExp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mxv));
        _mm256_storeu_ps(s + j, e);
        sum8 = _mm256_add_ps(sum8, e);
      }
      _mm256_store_ps(lane, sum8);
      for (; j < n; ++j) lane[j - n_full] += (s[j] = SoftmaxExp(s[j] - mx));
      const float sum = Hsum8(lane);
      const __m256 sumv = _mm256_set1_ps(sum);
      for (j = 0; j < n_full; j += 8)
        _mm256_storeu_ps(s + j, _mm256_div_ps(_mm256_loadu_ps(s + j), sumv));
      for (; j < n; ++j) s[j] /= sum;
      if (a.lse != nullptr) a.lse[r * a.ld_lse] = mx + std::log(sum);
      if (vd <= kNarrowValues) {
        float* o = a.out + r * a.ldo;
        if (vd8 == 8) AccumulateNarrowValues<1>(a, s, n, o);
        if (vd8 == 16) AccumulateNarrowValues<2>(a, s, n, o);
        for (int d = vd8; d < vd; ++d) o[d] = NarrowValue(s, a.v + d, a.ldv, n);
      }
    }
    if (vd <= kNarrowValues) continue;
    // Each output is one chain in increasing position, carried through o
    // from one chunk to the next (the dimensions past vd8 too).
    for (int64_t j0 = 0; j0 < n; j0 += kValueChunk) {
      const int64_t j1 = std::min(n, j0 + kValueChunk);
      const float* v = a0.v;
      int64_t ldv = a0.ldv, v0 = 0;
      if (src != nullptr) {
        src->fill(src->ctx, true, j0, j1, v_tile.data(), ld_vtile);
        v = v_tile.data();
        ldv = ld_vtile;
        v0 = j0;
      }
      for (int h = 0; h < count; ++h) {
        float* o = hs[h].out + r * hs[h].ldo;
        for (int d0 = 0; d0 < vd8; d0 += 64) {
          AccumulateValues(v, ldv, v0, hs[h].scores, j0, j1, d0, vd8, o);
        }
        for (int d = vd8; d < vd; ++d) {
          float od = j0 == 0 ? 0.0f : o[d];
          for (j = j0; j < j1; ++j) od = std::fma(hs[h].scores[j], v[(j - v0) * ldv + d], od);
          o[d] = od;
        }
      }
    }
  }
}

}  // namespace

void AttendHeadsAvx2(const AttendArgs* heads, int count) {
  for (int h0 = 0; h0 < count; h0 += kHeadsPerPass) {
    AttendPassAvx2(heads + h0, std::min(kHeadsPerPass, count - h0));
  }
}

namespace {

// Rows t[0..8) of 8 floats transposed: u[i] is column i.
inline void Transpose8x8(const __m256 t[8], __m256 u[8]) {
  // Pairs, quads, then halves: the standard unpack/shuffle/permute tree.
  const __m256 a0 = _mm256_unpacklo_ps(t[0], t[1]), a1 = _mm256_unpackhi_ps(t[0], t[1]);
  const __m256 a2 = _mm256_unpacklo_ps(t[2], t[3]), a3 = _mm256_unpackhi_ps(t[2], t[3]);
  const __m256 a4 = _mm256_unpacklo_ps(t[4], t[5]), a5 = _mm256_unpackhi_ps(t[4], t[5]);
  const __m256 a6 = _mm256_unpacklo_ps(t[6], t[7]), a7 = _mm256_unpackhi_ps(t[6], t[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  u[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
  u[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
  u[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
  u[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
  u[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
  u[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
  u[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
  u[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

// KvCache's conversion of one stored element: the edges of a block and the
// FP8 slots holding a NaN code.
inline float KvElem(DType dtype, const uint8_t* row, int d, float scale) {
  const float x = LoadAsFloat(dtype, row, static_cast<size_t>(d));
  return dtype == DType::kFP8E4M3 ? x * scale : x;
}

// Elements [d, d + 8) of a stored row as floats; FP8 without its scale, as
// the value times 2^-120 (KvRaw8 moves the E4M3 bits under F32's sign and
// exponent, subnormals becoming F32 subnormals), which KvFinish8 multiplies
// back: 2^120 exactly, then the scale, the one rounding the table's value
// times the scale also takes. NaN codes come out as finite numbers here.
template <DType D>
inline __m256 KvRaw8(const uint8_t* row, int d) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d);
  } else if constexpr (D == DType::kBF16) {
    return Bf16x8ToFloat(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
  } else {
    // Sign-extended, the byte's sign fills bits 7..31; shifted by 20 it is
    // F32's sign (and bits 27..30, cleared), the exponent and mantissa bits
    // land on 20..26.
    const __m256i w =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d)));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 20),
                                                _mm256_set1_epi32(static_cast<int>(0x87F00000u))));
  }
}
template <DType D>
inline __m256 KvFinish8(__m256 raw, __m256 scale) {
  if constexpr (D == DType::kFP8E4M3) {
    return _mm256_mul_ps(_mm256_mul_ps(raw, _mm256_set1_ps(0x1p120f)), scale);
  } else {
    return raw;
  }
}

// Whether a slot's FP8 row holds a NaN code (0x7F or 0xFF).
inline bool HasFp8Nan(const uint8_t* row, int hd) {
  const __m128i m = _mm_set1_epi8(0x7F);
  int d = 0;
  __m128i any = _mm_setzero_si128();
  for (; d + 16 <= hd; d += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d));
    any = _mm_or_si128(any, _mm_cmpeq_epi8(_mm_and_si128(b, m), m));
  }
  if (_mm_movemask_epi8(any) != 0) return true;
  for (; d < hd; ++d) {
    if ((row[d] & 0x7F) == 0x7F) return true;
  }
  return false;
}

template <DType D>
void ConvertKvBlock(const KvBlockArgs& a) {
  const int hd = a.head_dim, hd8 = hd & ~7;
  const KvCache::HeadRows& r = a.rows;
  auto row_of = [&](int s) { return r.elems + s * r.slot_stride; };
  auto scale_of = [&](int s) {
    float f = 1.0f;
    if constexpr (D == DType::kFP8E4M3) std::memcpy(&f, r.scales + s * r.scale_stride, 4);
    return f;
  };
  auto slow_slot = [&](int s) {
    const uint8_t* row = row_of(s);
    const float sc = scale_of(s);
    for (int d = 0; d < hd; ++d) a.dst[s * a.pos_stride + d * a.dim_stride] = KvElem(D, row, d, sc);
  };
  if (a.dim_stride == 1) {
    for (int s = 0; s < a.slots; ++s) {
      const uint8_t* row = row_of(s);
      if (D == DType::kFP8E4M3 && HasFp8Nan(row, hd)) {
        slow_slot(s);
        continue;
      }
      const float sc = scale_of(s);
      const __m256 scv = _mm256_set1_ps(sc);
      float* o = a.dst + s * a.pos_stride;
      int d = 0;
      for (; d < hd8; d += 8) _mm256_storeu_ps(o + d, KvFinish8<D>(KvRaw8<D>(row, d), scv));
      for (; d < hd; ++d) o[d] = KvElem(D, row, d, sc);
    }
    return;
  }
  // Transposed: 8 slots' rows in, 8 dimensions' runs of 8 positions out. The
  // scale multiplies each element alone, so it goes on after the transpose,
  // as one vector of the 8 slots' scales.
  const int64_t ld = a.dim_stride;
  const int slots8 = a.slots & ~7;
  for (int s0 = 0; s0 < slots8; s0 += 8) {
    const uint8_t* rows[8];
    float sc[8];
    for (int i = 0; i < 8; ++i) {
      rows[i] = row_of(s0 + i);
      sc[i] = scale_of(s0 + i);
    }
    const __m256 scv = _mm256_loadu_ps(sc);
    float* o = a.dst + s0;
    for (int d = 0; d < hd8; d += 8) {
      __m256 t[8];
      for (int i = 0; i < 8; ++i) t[i] = KvRaw8<D>(rows[i], d);
      __m256 u[8];
      Transpose8x8(t, u);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + (d + i) * ld, KvFinish8<D>(u[i], scv));
    }
    for (int d = hd8; d < hd; ++d) {
      for (int i = 0; i < 8; ++i) o[d * ld + i] = KvElem(D, rows[i], d, sc[i]);
    }
  }
  for (int s = slots8; s < a.slots; ++s) slow_slot(s);
  if constexpr (D == DType::kFP8E4M3) {
    for (int s = 0; s < slots8; ++s) {
      if (HasFp8Nan(row_of(s), hd)) slow_slot(s);
    }
  }
}

}  // namespace

void ConvertKvBlockAvx2(const KvBlockArgs& a) {
  switch (a.dtype) {
    case DType::kF32:
      return ConvertKvBlock<DType::kF32>(a);
    case DType::kBF16:
      return ConvertKvBlock<DType::kBF16>(a);
    case DType::kFP8E4M3:
      return ConvertKvBlock<DType::kFP8E4M3>(a);
    case DType::kF16:  // not a pool dtype (KvCache::Create refuses it)
      for (int s = 0; s < a.slots; ++s) {
        for (int d = 0; d < a.head_dim; ++d) {
          a.dst[s * a.pos_stride + d * a.dim_stride] =
              KvElem(a.dtype, a.rows.elems + s * a.rows.slot_stride, d, 1.0f);
        }
      }
      return;
  }
}

namespace {

// n E4M3 codes times `scale`, as KvCache converts them.
inline void Fp8Run(const uint8_t* src, int n, float scale, float* dst) {
  int i = 0;
  if (!HasFp8Nan(src, n)) {
    const __m256 scv = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, KvFinish8<DType::kFP8E4M3>(KvRaw8<DType::kFP8E4M3>(src, i), scv));
    }
  }
  for (; i < n; ++i) dst[i] = KvElem(DType::kFP8E4M3, src, i, scale);
}

inline void Bf16Run(const uint8_t* src, int n, float* dst) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, KvRaw8<DType::kBF16>(src, i));
  for (; i < n; ++i) dst[i] = KvElem(DType::kBF16, src, i, 1.0f);
}

}  // namespace

void ConvertPackedLatentRowAvx2(const uint8_t* src, const LatentSplit& split, int col0, int cols,
                                float* dst) {
  const int C = split.latent, R = split.rope, I = split.index;
  const int group = KvCache::kLatentGroup;
  const int groups = (C + group - 1) / group;
  const uint8_t* scales = src + C;
  const uint8_t* rope = scales + 4 * groups;
  // Whole parts, as KvCache::GatherColumns takes them; dst starts at col0.
  dst -= col0;
  if (col0 == 0) {
    for (int g = 0; g < groups; ++g) {
      float scale;
      std::memcpy(&scale, scales + 4 * g, 4);
      const int c0 = g * group;
      Fp8Run(src + c0, std::min(group, C - c0), scale, dst + c0);
    }
    Bf16Run(rope, R, dst + C);
  }
  if (I > 0 && col0 + cols == C + R + I) {
    const uint8_t* index = rope + 2 * R;
    float scale;
    std::memcpy(&scale, index + I, 4);
    Fp8Run(index, I, scale, dst + C + R);
  }
}

void TransposeAvx2(const float* src, int64_t rows, int cols, int64_t ld_src, float* dst,
                   int64_t ld_dst) {
  const int64_t rows8 = rows - rows % 8;
  const int cols8 = cols - cols % 8;
  // 8 x 8 tiles, rows outer so that a tile's 8 source rows stay in L1 while
  // its columns are written, each a run of 8 floats.
  for (int64_t r = 0; r < rows8; r += 8) {
    const float* s = src + r * ld_src;
    for (int c = 0; c < cols8; c += 8) {
      __m256 t[8];
      for (int i = 0; i < 8; ++i) t[i] = _mm256_loadu_ps(s + i * ld_src + c);
      __m256 u[8];
      Transpose8x8(t, u);
      float* d = dst + int64_t{c} * ld_dst + r;
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(d + i * ld_dst, u[i]);
    }
    for (int c = cols8; c < cols; ++c)
      for (int64_t i = r; i < r + 8; ++i) dst[c * ld_dst + i] = src[i * ld_src + c];
  }
  for (int64_t r = rows8; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

void IndexerScoresAvx2(const IndexerScoreArgs& a) { IndexerScoresImpl(a); }

}  // namespace ringlane::worker::cpu::internal
