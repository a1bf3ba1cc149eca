// Kimi Delta Attention on the CPU (ComputeOps::KdaMix, GatedRmsNorm).
//
// Each (sequence, head) is one task: its rows run through the recurrence in
// position order, reading and writing only that head's channels of the
// convolution state and that head's matrix, so tasks never share memory and
// a value never depends on which thread computed it or on what else shares
// the round. Every sum runs over its index in increasing order.
#include <cmath>
#include <cstring>

#include "worker/backend/cpu/cpu_ops.h"

namespace ringlane::worker::cpu {
namespace {

// fla's l2norm epsilon, inside the square root.
constexpr float kL2Eps = 1e-6f;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x * Sigmoid(x); }
// log(1 + e^x) without overflow: x + log1p(e^-x) for large x.
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void CpuOps::KdaMix(int layer, const KdaInput& in, float* out) {
  const LinearAttentionConfig& c = *in.config;
  const KdaWeights& w = *in.w;
  const int H = c.heads, D = c.head_dim, K = c.conv_kernel, taps = K - 1;
  const int64_t C = int64_t{H} * D;
  const RoundInput& round = *rows_.round;
  const int64_t seqs = static_cast<int64_t>(round.seqs.size());
  const int64_t offset = state_offset_[layer];
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  kda_buf_.resize(pool_->num_threads());
  pool_->ParallelFor(seqs * H, [&](int64_t task, int thread) {
    const int64_t s = task / H;
    const int h = static_cast<int>(task % H);
    const SeqStep& q_step = round.seqs[s];
    float* state = state_ + q_step.state_slot * state_slot_floats_ + offset;
    // The state's layout: conv inputs [3][C][taps] (oldest first), then the
    // heads' matrices [H][D][D] indexed [key][value].
    float* conv[3] = {state, state + C * taps, state + 2 * C * taps};
    float* S = state + 3 * C * taps + int64_t{h} * D * D;
    const int64_t c0 = int64_t{h} * D;
    if (q_step.start_position == 0) {
      for (float* cv : conv) std::memset(cv + c0 * taps, 0, sizeof(float) * D * taps);
      std::memset(S, 0, sizeof(float) * D * D);
    }
    std::vector<float>& buf = kda_buf_[thread];
    buf.resize(static_cast<size_t>(5) * D);
    float* qv = buf.data();
    float* kv = qv + D;
    float* vv = kv + D;
    float* alpha = vv + D;
    float* delta = alpha + D;
    const float* proj[3] = {in.q, in.k, in.v};
    const std::vector<float>* weights[3] = {&w.conv_q, &w.conv_k, &w.conv_v};
    float* dst[3] = {qv, kv, vv};
    const float a = std::exp(w.a_log[h]);
    const int64_t row0 = rows_.seq_row0[s];
    const int64_t n = static_cast<int64_t>(q_step.tokens.size());
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = row0 + r;
      // Causal depthwise convolution over the last K inputs, then SiLU.
      for (int part = 0; part < 3; ++part) {
        const float* u = proj[part] + t * in.ld + c0;
        const float* wt = weights[part]->data() + c0 * K;
        float* hist = conv[part] + c0 * taps;
        for (int i = 0; i < D; ++i) {
          float* hi = hist + int64_t{i} * taps;
          const float* wi = wt + int64_t{i} * K;
          float acc = 0.0f;
          for (int j = 0; j < taps; ++j) acc += wi[j] * hi[j];
          acc += wi[taps] * u[i];
          for (int j = 0; j + 1 < taps; ++j) hi[j] = hi[j + 1];
          if (taps > 0) hi[taps - 1] = u[i];
          dst[part][i] = Silu(acc);
        }
      }
      for (float* x : {qv, kv}) {
        float ss = 0.0f;
        for (int i = 0; i < D; ++i) ss += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(ss + kL2Eps);
        for (int i = 0; i < D; ++i) x[i] *= inv;
      }
      for (int i = 0; i < D; ++i) qv[i] *= scale;
      // The per-channel decay of the key dimension.
      const float* graw = in.gate + t * in.ld_gate + c0;
      for (int i = 0; i < D; ++i) {
        const float z = graw[i] + w.dt_bias[c0 + i];
        const float g = c.has_lower_bound ? c.lower_bound * Sigmoid(a * z) : -a * Softplus(z);
        alpha[i] = std::exp(g);
      }
      const float beta = Sigmoid(in.beta[t * in.ld_beta + h]);
      // S <- diag(alpha) S; delta = beta (v - S^T k); S <- S + k delta^T;
      // out = S^T q.
      for (int j = 0; j < D; ++j) delta[j] = 0.0f;
      for (int i = 0; i < D; ++i) {
        float* Si = S + int64_t{i} * D;
        const float ai = alpha[i], ki = kv[i];
        for (int j = 0; j < D; ++j) {
          Si[j] *= ai;
          delta[j] += Si[j] * ki;
        }
      }
      for (int j = 0; j < D; ++j) delta[j] = beta * (vv[j] - delta[j]);
      float* o = out + t * C + c0;
      for (int j = 0; j < D; ++j) o[j] = 0.0f;
      for (int i = 0; i < D; ++i) {
        float* Si = S + int64_t{i} * D;
        const float ki = kv[i], qi = qv[i];
        for (int j = 0; j < D; ++j) {
          Si[j] += ki * delta[j];
          o[j] += Si[j] * qi;
        }
      }
      // Checkpoints of the state after this row: this head's part of it,
      // at the same place in the checkpoint as in the slot.
      for (const SeqStep::StateSave& save : q_step.state_saves) {
        if (save.offset != r) continue;
        float* ck = checkpoints_ + save.slot * state_slot_floats_ + offset;
        for (int part = 0; part < 3; ++part) {
          const int64_t at = part * C * taps + c0 * taps;
          std::memcpy(ck + at, state + at, sizeof(float) * D * taps);
        }
        const int64_t at = 3 * C * taps + int64_t{h} * D * D;
        std::memcpy(ck + at, state + at, sizeof(float) * D * D);
      }
    }
  });
}

void CpuOps::GatedRmsNorm(float* x, const float* gate, absl::Span<const float> w, int heads,
                          int dim, float eps, int rows) {
  const int64_t C = int64_t{heads} * dim;
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      float* xr = x + t * C + int64_t{h} * dim;
      const float* g = gate + t * C + int64_t{h} * dim;
      float ss = 0.0f;
      for (int j = 0; j < dim; ++j) ss += xr[j] * xr[j];
      ss /= static_cast<float>(dim);
      ss += eps;
      ss = 1.0f / std::sqrt(ss);
      for (int j = 0; j < dim; ++j) xr[j] = w[j] * (ss * xr[j]) * Sigmoid(g[j]);
    }
  }
}

}  // namespace ringlane::worker::cpu
