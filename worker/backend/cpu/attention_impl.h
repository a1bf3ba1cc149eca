// The attention core, included by the scalar and the AVX2 translation units so
// both compile the same source (the AVX2 one inlines std::fma as an
// instruction and vectorizes the lane loops). Internal to kernels*.cc.
#ifndef RINGLANE_WORKER_BACKEND_CPU_ATTENTION_IMPL_H_
#define RINGLANE_WORKER_BACKEND_CPU_ATTENTION_IMPL_H_

#include <bit>
#include <cmath>
#include <cstdint>

#include "worker/backend/cpu/kernels.h"

// Anonymous: each including file compiles its own copy with its own flags, so
// the AVX2 build of this code can never be linked into the scalar path.
namespace ringlane::worker::cpu::internal {
namespace {

// exp(x) for a softmax's x = score - max <= 0, from exactly rounded basic
// operations so that every instruction set gives the same bits and the loop
// over positions vectorizes (libm's expf is a call per element, and was half
// of a small head's attention): x = n ln2 + r with n = round(x log2 e) and
// |r| <= ln2 / 2, exp(r) by its Taylor series to r^7 (truncation below 3e-9,
// under float rounding), 2^n set in the exponent. Below -87.3 (2^-126) it
// gives 0 where expf gives a subnormal, which no softmax whose largest term
// is 1 can tell. NaN stays NaN.
inline constexpr float kExpLow = -87.3f;
// Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
inline constexpr float kExpShift = 12582912.0f;
inline constexpr float kExpLog2e = 1.44269502f;
// ln 2 in two parts: n * kExpLn2Hi is exact for |n| < 2^8.
inline constexpr float kExpLn2Hi = 0.693145751953125f;
inline constexpr float kExpLn2Lo = 1.42860677e-6f;
// 1/7!, 1/6!, ..., 1/1!, 1/0!: Horner's order.
inline constexpr float kExpPoly[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                      1.0f / 6.0f,    0.5f,          1.0f,          1.0f};

inline float SoftmaxExp(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  const float t = std::fma(xc, kExpLog2e, kExpShift);
  const float n = t - kExpShift;
  float r = std::fma(n, -kExpLn2Hi, xc);
  r = std::fma(n, -kExpLn2Lo, r);
  float p = kExpPoly[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, r, kExpPoly[i]);
  const uint32_t two_n = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kExpShift) + 127u)
                         << 23;
  const float e = p * std::bit_cast<float>(two_n);
  return x < kExpLow ? 0.0f : e;
}

// The max and the sum over a row's positions are taken in kSoftmaxLanes
// interleaved lanes (position j in lane j % kSoftmaxLanes), then the lanes
// pairwise (the sum in Hsum8's tree): a fixed order whatever the rows
// beside it, and one a vector unit runs without a chain of dependent adds
// per position.
inline constexpr int kSoftmaxLanes = 8;
static_assert(kSoftmaxLanes == 8, "Hsum8 sums the lanes");

// Values of at most kNarrowValues dimensions (head_dim 8 in the bundled
// model) are summed in kValueLanes partial sums, position j in sum j %
// kValueLanes, added as (s0 + s1) + (s2 + s3): summed in increasing
// position, each output is one FMA chain as long as the context (4 cycles of
// latency a position, most of a head_dim-8 row's attention). Wider values
// keep that order: their outputs are already that many independent chains.
inline constexpr int kNarrowValues = kNarrowValueDims;
inline constexpr int kValueLanes = 4;
static_assert(kValueLanes == 4, "the partial sums are added as (s0 + s1) + (s2 + s3)");

// One narrow output: sum over j < n of p[j] * v[j * ldv] in the partial
// sums above.
inline float NarrowValue(const float* p, const float* v, int64_t ldv, int64_t n) {
  float part[kValueLanes] = {};
  for (int64_t j = 0; j < n; ++j) {
    part[j % kValueLanes] = std::fma(p[j], v[j * ldv], part[j % kValueLanes]);
  }
  return (part[0] + part[1]) + (part[2] + part[3]);
}

inline float LaneTreeMax(const float* l) {
  float m = l[0];
  for (int i = 1; i < kSoftmaxLanes; ++i) m = l[i] > m ? l[i] : m;
  return m;
}

// Each query row r attends to context positions [0, positions[r]]: scores
// (see AttendArgs), their max, exponentials and their sum (in lanes, above),
// probabilities normalized, then the values accumulated in increasing
// position (narrow values in kValueLanes partial sums). Nothing here depends
// on how many rows are processed together. The position loops are
// independent across positions (scores) or across dimensions (values), or
// run in fixed lanes. This is the reference every instruction set's kernel
// must match bit for bit (kernels_avx2.cc has the vector one: the compiler
// does not vectorize the exponentials).
inline void AttendHeadImpl(const AttendArgs& a) {
  const float sqrt_hd = std::sqrt(static_cast<float>(a.head_dim));
  constexpr int L = kSoftmaxLanes;
  for (int r = 0; r < a.rows; ++r) {
    const float* q = a.q + r * a.ldq;
    const int64_t n = a.positions[r] + 1;
    const int64_t n_full = n - n % L;
    float* s = a.scores;
    for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) {
      const float qd = q[d];
      const float* kd = a.kt + d * a.ldkt;
      for (int64_t j = 0; j < n; ++j) s[j] = std::fma(qd, kd[j], s[j]);
    }
    if (a.scale > 0.0f) {
      for (int64_t j = 0; j < n; ++j) s[j] = s[j] * a.scale;
    } else {
      for (int64_t j = 0; j < n; ++j) s[j] = s[j] / sqrt_hd;
    }
    float lane[L];
    for (int l = 0; l < L; ++l) lane[l] = -INFINITY;
    for (int64_t j = 0; j < n_full; j += L) {
      for (int l = 0; l < L; ++l) lane[l] = s[j + l] > lane[l] ? s[j + l] : lane[l];
    }
    for (int64_t j = n_full; j < n; ++j) {
      lane[j - n_full] = s[j] > lane[j - n_full] ? s[j] : lane[j - n_full];
    }
    const float mx = LaneTreeMax(lane);
    for (int64_t j = 0; j < n; ++j) s[j] = SoftmaxExp(s[j] - mx);
    for (int l = 0; l < L; ++l) lane[l] = 0.0f;
    for (int64_t j = 0; j < n_full; j += L) {
      for (int l = 0; l < L; ++l) lane[l] += s[j + l];
    }
    for (int64_t j = n_full; j < n; ++j) lane[j - n_full] += s[j];
    const float sum = Hsum8(lane);
    for (int64_t j = 0; j < n; ++j) s[j] /= sum;
    if (a.lse != nullptr) a.lse[r * a.ld_lse] = mx + std::log(sum);
    float* o = a.out + r * a.ldo;
    const int vd = a.v_dim > 0 ? a.v_dim : a.head_dim;
    if (vd <= kNarrowValues) {
      for (int d = 0; d < vd; ++d) o[d] = NarrowValue(s, a.v + d, a.ldv, n);
      continue;
    }
    for (int d = 0; d < vd; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float* v = a.v + j * a.ldv;
      const float p = s[j];
      for (int d = 0; d < vd; ++d) o[d] = std::fma(p, v[d], o[d]);
    }
  }
}

// IndexerScoreArgs' definition: the loops over keys are independent, so
// they vectorize without reordering any sum.
inline void IndexerScoresImpl(const IndexerScoreArgs& a) {
  float* s = a.scores;
  float* dot = a.dot;
  for (int64_t j = 0; j < a.n; ++j) s[j] = 0.0f;
  for (int h = 0; h < a.heads; ++h) {
    const float* q = a.q + int64_t{h} * a.head_dim;
    for (int64_t j = 0; j < a.n; ++j) dot[j] = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) {
      const float qd = q[d];
      const float* kd = a.kt + d * a.ldkt;
      for (int64_t j = 0; j < a.n; ++j) dot[j] = std::fma(qd, kd[j], dot[j]);
    }
    const float wh = a.w[h];
    for (int64_t j = 0; j < a.n; ++j) s[j] = s[j] + wh * std::fmax(dot[j], 0.0f);
  }
}

}  // namespace
}  // namespace ringlane::worker::cpu::internal

#endif  // RINGLANE_WORKER_BACKEND_CPU_ATTENTION_IMPL_H_
