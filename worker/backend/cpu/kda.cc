// Kimi Delta Attention on the CPU (ComputeOps::KdaMix, GatedRmsNorm).
//
// Each (sequence, head) is one task: its rows run in position order, one at
// a time through the recurrence, or a whole chunk at once (the chunked form
// for prefill, on chunks at fixed absolute positions, so that a row's result
// depends on where the chunks of its prompt lie and never on how rounds cut
// the prompt, when the planner keeps chunks whole). A task reads and writes
// only that head's channels of the convolution state and that head's
// matrix, so tasks never share memory and a value never depends on which
// thread computed it or on what else shares the round. Every sum runs over
// its index in increasing order.
#include <cmath>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "worker/backend/cpu/cpu_ops.h"

namespace ringlane::worker::cpu {
namespace {

// fla's l2norm epsilon, inside the square root.
constexpr float kL2Eps = 1e-6f;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x * Sigmoid(x); }
// Decays multiplied over positions fall below float's normal range where
// the gate is strong, and x86 computes with denormals a hundred times more
// slowly: a task runs with them flushed to zero (inputs and results), which
// changes nothing that weighs against the terms they are added to, and
// restores the thread's mode after.
class FlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

// log(1 + e^x) without overflow: x + log1p(e^-x) for large x.
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void CpuOps::KdaMix(int layer, const KdaInput& in, float* out) {
  const LinearAttentionConfig& c = *in.config;
  const KdaWeights& w = *in.w;
  const int H = c.heads, D = c.head_dim, K = c.conv_kernel, taps = K - 1;
  const int64_t C = int64_t{H} * D;
  const int64_t chunk = c.chunk;
  const RoundInput& round = *rows_.round;
  const int64_t seqs = static_cast<int64_t>(round.seqs.size());
  const int64_t offset = state_offset_[layer];
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  kda_buf_.resize(pool_->num_threads());
  pool_->ParallelFor(seqs * H, [&](int64_t task, int thread) {
    const FlushDenormals flush;
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
    const int64_t n = static_cast<int64_t>(q_step.tokens.size());
    // Whether rows [r, r + chunk) run as one chunk: a whole chunk at
    // absolute multiples of `chunk`, before linear_chunked_until, with no
    // checkpoint inside it (one at its end is taken after it).
    auto whole_chunk = [&](int64_t r) {
      const int64_t p = q_step.start_position + r;
      if (chunk <= 0 || p % chunk != 0 || p + chunk > q_step.linear_chunked_until ||
          r + chunk > n) {
        return false;
      }
      for (const SeqStep::StateSave& save : q_step.state_saves) {
        if (save.offset >= r && save.offset < r + chunk - 1) return false;
      }
      return true;
    };
    // Rows a pass holds: a chunk's, or the one of a recurrent step.
    const int64_t m = chunk > 0 ? chunk : 1;
    std::vector<float>& buf = kda_buf_[thread];
    // Per row of a pass: q, k, v, decay; then E, F, X (2 D), U; then A, P.
    buf.resize(static_cast<size_t>(m * D * 9 + 2 * m * m + m + D));
    float* Qb = buf.data();
    float* Kb = Qb + m * D;
    float* Vb = Kb + m * D;
    float* Al = Vb + m * D;
    float* E = Al + m * D;
    float* F = E + m * D;
    float* X = F + m * D;
    float* U = X + 2 * m * D;
    float* A = U + m * D;
    float* P = A + m * m;
    float* Bt = P + m * m;
    float* dec = Bt + m;
    const float* proj[3] = {in.q, in.k, in.v};
    const std::vector<float>* weights[3] = {&w.conv_q, &w.conv_k, &w.conv_v};
    const float a = std::exp(w.a_log[h]);
    const int64_t row0 = rows_.seq_row0[s];
    // Row t's conv (which advances the conv state), normalised and scaled q,
    // k, v and per-channel decay, into slot j of the pass buffers.
    auto prepare = [&](int64_t t, int64_t j) {
      float* dst[3] = {Qb + j * D, Kb + j * D, Vb + j * D};
      // Causal depthwise convolution over the last K inputs, then SiLU.
      for (int part = 0; part < 3; ++part) {
        const float* u = proj[part] + t * in.ld + c0;
        const float* wt = weights[part]->data() + c0 * K;
        float* hist = conv[part] + c0 * taps;
        for (int i = 0; i < D; ++i) {
          float* hi = hist + int64_t{i} * taps;
          const float* wi = wt + int64_t{i} * K;
          float acc = 0.0f;
          for (int jj = 0; jj < taps; ++jj) acc += wi[jj] * hi[jj];
          acc += wi[taps] * u[i];
          for (int jj = 0; jj + 1 < taps; ++jj) hi[jj] = hi[jj + 1];
          if (taps > 0) hi[taps - 1] = u[i];
          dst[part][i] = Silu(acc);
        }
      }
      for (float* x : {dst[0], dst[1]}) {
        float ss = 0.0f;
        for (int i = 0; i < D; ++i) ss += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(ss + kL2Eps);
        for (int i = 0; i < D; ++i) x[i] *= inv;
      }
      for (int i = 0; i < D; ++i) dst[0][i] *= scale;
      // The per-channel decay of the key dimension.
      const float* graw = in.gate + t * in.ld_gate + c0;
      float* alpha = Al + j * D;
      for (int i = 0; i < D; ++i) {
        const float z = graw[i] + w.dt_bias[c0 + i];
        const float g = c.has_lower_bound ? c.lower_bound * Sigmoid(a * z) : -a * Softplus(z);
        alpha[i] = std::exp(g);
      }
      Bt[j] = Sigmoid(in.beta[t * in.ld_beta + h]);
    };
    auto save_checkpoints = [&](int64_t r) {
      // Checkpoints of the state after row r: this head's part of it, at
      // the same place in the checkpoint as in the slot.
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
    };
    int64_t r = 0;
    while (r < n) {
      if (!whole_chunk(r)) {
        // One position: S <- diag(alpha) S; delta = beta (v - S^T k);
        // S <- S + k delta^T; out = S^T q.
        const int64_t t = row0 + r;
        prepare(t, 0);
        const float* qv = Qb;
        const float* kv = Kb;
        const float* vv = Vb;
        const float beta = Bt[0];
        float* delta = U;
        for (int j = 0; j < D; ++j) delta[j] = 0.0f;
        for (int i = 0; i < D; ++i) {
          float* Si = S + int64_t{i} * D;
          const float ai = Al[i], ki = kv[i];
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
        save_checkpoints(r);
        ++r;
        continue;
      }
      // A whole chunk of L rows in the WY / UT form (the reference's
      // kda_chunk, tests/reference/glm5_next_reference.py): with S0 the
      // state before the chunk and decays between rows as products of the
      // rows' alphas (never quotients, so nothing overflows or divides a
      // denormal),
      //   A_ri = beta_r k_r . (decay(i..r] k_i),  P_ri = q_r . (decay(i..r] k_i),
      //   (I + A) X = diag(beta) [E K | V]   (forward substitution),
      //   U = X_V - X_EK S0,  O = (E Q) S0 + P U,
      //   S = diag(E_last) S0 + F^T U,
      // E_r the decay from the chunk's start through r, F_i = decay(i..end]
      // k_i (after i through the chunk's end). Sums run in increasing index
      // order.
      const int64_t L = chunk;
      for (int64_t j = 0; j < L; ++j) prepare(row0 + r + j, j);
      for (int64_t j = 0; j < L; ++j) {
        float* e = E + j * D;
        const float* al = Al + j * D;
        if (j == 0) {
          for (int d = 0; d < D; ++d) e[d] = al[d];
        } else {
          const float* prev = e - D;
          for (int d = 0; d < D; ++d) e[d] = prev[d] * al[d];
        }
      }
      for (int64_t i = 0; i < L; ++i) {
        const float* ki = Kb + i * D;
        for (int d = 0; d < D; ++d) dec[d] = ki[d];  // decay(i..r] k_i, for r = i
        for (int64_t rr = i; rr < L; ++rr) {
          if (rr > i) {
            const float* al = Al + rr * D;
            for (int d = 0; d < D; ++d) dec[d] *= al[d];
          }
          const float* kr = Kb + rr * D;
          const float* qr = Qb + rr * D;
          float ak = 0.0f, pq = 0.0f;
          for (int d = 0; d < D; ++d) {
            ak += kr[d] * dec[d];
            pq += qr[d] * dec[d];
          }
          A[rr * L + i] = rr > i ? Bt[rr] * ak : 0.0f;
          P[rr * L + i] = pq;
        }
        float* f = F + i * D;  // decay(i..end] k_i
        for (int d = 0; d < D; ++d) f[d] = dec[d];
      }
      for (int64_t rr = 0; rr < L; ++rr) {
        float* x = X + rr * 2 * D;
        const float* e = E + rr * D;
        const float* kr = Kb + rr * D;
        const float* vr = Vb + rr * D;
        const float b = Bt[rr];
        for (int d = 0; d < D; ++d) x[d] = b * (e[d] * kr[d]);
        for (int d = 0; d < D; ++d) x[D + d] = b * vr[d];
        for (int64_t i = 0; i < rr; ++i) {
          const float ari = A[rr * L + i];
          const float* xi = X + i * 2 * D;
          for (int d = 0; d < 2 * D; ++d) x[d] -= ari * xi[d];
        }
      }
      for (int64_t rr = 0; rr < L; ++rr) {
        const float* x = X + rr * 2 * D;
        float* u = U + rr * D;
        for (int j = 0; j < D; ++j) u[j] = 0.0f;
        for (int d = 0; d < D; ++d) {
          const float wd = x[d];
          const float* Sd = S + int64_t{d} * D;
          for (int j = 0; j < D; ++j) u[j] += wd * Sd[j];
        }
        for (int j = 0; j < D; ++j) u[j] = x[D + j] - u[j];
      }
      for (int64_t rr = 0; rr < L; ++rr) {
        float* o = out + (row0 + r + rr) * C + c0;
        const float* e = E + rr * D;
        const float* qr = Qb + rr * D;
        for (int j = 0; j < D; ++j) o[j] = 0.0f;
        for (int d = 0; d < D; ++d) {
          const float eq = e[d] * qr[d];
          const float* Sd = S + int64_t{d} * D;
          for (int j = 0; j < D; ++j) o[j] += eq * Sd[j];
        }
        for (int64_t i = 0; i <= rr; ++i) {
          const float pri = P[rr * L + i];
          const float* ui = U + i * D;
          for (int j = 0; j < D; ++j) o[j] += pri * ui[j];
        }
      }
      const float* last = E + (L - 1) * D;
      for (int d = 0; d < D; ++d) {
        float* Sd = S + int64_t{d} * D;
        const float ed = last[d];
        for (int j = 0; j < D; ++j) Sd[j] *= ed;
        for (int64_t i = 0; i < L; ++i) {
          const float fk = F[i * D + d];
          const float* ui = U + i * D;
          for (int j = 0; j < D; ++j) Sd[j] += fk * ui[j];
        }
      }
      save_checkpoints(r + L - 1);
      r += L;
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
