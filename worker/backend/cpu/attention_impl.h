// The attention core, included by the scalar and the AVX2 translation units so
// both compile the same source (the AVX2 one inlines std::fma as an
// instruction and vectorizes the lane loops). Internal to kernels*.cc.
#ifndef RINGLANE_WORKER_BACKEND_CPU_ATTENTION_IMPL_H_
#define RINGLANE_WORKER_BACKEND_CPU_ATTENTION_IMPL_H_

#include <cmath>
#include <cstdint>

#include "worker/backend/cpu/kernels.h"

// Anonymous: each including file compiles its own copy with its own flags, so
// the AVX2 build of this code can never be linked into the scalar path.
namespace ringlane::worker::cpu::internal {
namespace {

// Each query row r attends to context positions [0, positions[r]] in order:
// scores (see AttendArgs), max, exponentials and their sum in increasing
// position, probabilities normalized, then the values accumulated in
// increasing position. Nothing here depends on how many rows are processed
// together. The position loops are independent across positions (scores) or
// across dimensions (values), so the compiler vectorizes them without
// reordering any sum.
inline void AttendHeadImpl(const AttendArgs& a) {
  const float sqrt_hd = std::sqrt(static_cast<float>(a.head_dim));
  for (int r = 0; r < a.rows; ++r) {
    const float* q = a.q + r * a.ldq;
    const int64_t n = a.positions[r] + 1;
    float* s = a.scores;
    for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) {
      const float qd = q[d];
      const float* kd = a.kt + d * a.ldkt;
      for (int64_t j = 0; j < n; ++j) s[j] = std::fma(qd, kd[j], s[j]);
    }
    float mx = -INFINITY;
    if (a.scale > 0.0f) {
      for (int64_t j = 0; j < n; ++j) {
        s[j] = s[j] * a.scale;
        mx = std::fmax(mx, s[j]);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        s[j] = s[j] / sqrt_hd;
        mx = std::fmax(mx, s[j]);
      }
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    for (int64_t j = 0; j < n; ++j) s[j] /= sum;
    if (a.lse != nullptr) a.lse[r * a.ld_lse] = mx + std::log(sum);
    float* o = a.out + r * a.ldo;
    const int vd = a.v_dim > 0 ? a.v_dim : a.head_dim;
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
