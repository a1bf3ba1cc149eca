#include "worker/backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ringlane::worker::cpu {

float* CpuOps::Scratch(int slot, int64_t floats) {
  // Growing the outer vector moves the buffers, which keeps their memory: the
  // other slots' pointers stay valid.
  if (slot >= static_cast<int>(scratch_.size())) scratch_.resize(slot + 1);
  AlignedFloats& buf = scratch_[slot];
  if (buf.size() < static_cast<size_t>(floats)) buf.resize(floats);
  return buf.data();
}

void CpuOps::BeginRound(const RoundRows& rows) {
  rows_ = rows;
  const size_t threads = pool_->num_threads();
  kbuf_.resize(threads);
  ktbuf_.resize(threads);
  vbuf_.resize(threads);
  scores_.resize(threads);
}

void CpuOps::PrepareRope(absl::Span<const float> inv_freq) {
  const int half = static_cast<int>(inv_freq.size());
  rope_half_ = half;
  cos_.resize(rows_.rows * half);
  sin_.resize(rows_.rows * half);
  for (int64_t t = 0; t < rows_.rows; ++t) {
    for (int j = 0; j < half; ++j) {
      const float angle = static_cast<float>(rows_.positions[t]) * inv_freq[j];
      cos_[t * half + j] = std::cos(angle);
      sin_[t * half + j] = std::sin(angle);
    }
  }
}

void CpuOps::Rope(float* x, int64_t ld, int heads, int head_dim, RopeLayout layout) {
  const int hd = head_dim;
  const int half = hd / 2;
  const bool interleaved = layout == RopeLayout::kInterleaved;
  const int rows = static_cast<int>(rows_.rows);
  for (int t = 0; t < rows; ++t) {
    const float* c = cos_.data() + int64_t{t} * rope_half_;
    const float* s = sin_.data() + int64_t{t} * rope_half_;
    for (int h = 0; h < heads; ++h) {
      float* v = x + t * ld + int64_t{h} * hd;
      for (int i = 0; i < half; ++i) {
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        const float v0 = v[a], v1 = v[b];
        v[a] = v0 * c[i] - v1 * s[i];
        v[b] = v0 * s[i] + v1 * c[i];
      }
    }
  }
}

void CpuOps::Embed(const Matrix& table, int vocab0, int vocab, float* out) {
  const int64_t D = table.cols;
  for (int64_t t = 0; t < rows_.rows; ++t) {
    const int32_t local = rows_.tokens[t] - vocab0;
    if (local >= 0 && local < vocab) {
      DequantRow(table, local, out + t * D, isa_);
    } else {
      std::fill(out + t * D, out + (t + 1) * D, 0.0f);
    }
  }
}

void CpuOps::SelectRows(const float* x, int64_t dim, absl::Span<const int64_t> rows, float* out) {
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(out + r * dim, x + rows[r] * dim, dim * sizeof(float));
  }
}

void CpuOps::RmsNorm(const float* x, absl::Span<const float> w, int dim, float eps, float* out,
                     int rows) {
  const int D = dim;
  for (int t = 0; t < rows; ++t) {
    const float* xr = x + int64_t{t} * D;
    float* o = out + int64_t{t} * D;
    float ss = 0.0f;
    for (int j = 0; j < D; ++j) ss += xr[j] * xr[j];
    ss /= static_cast<float>(D);
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int j = 0; j < D; ++j) o[j] = w[j] * (ss * xr[j]);
  }
}

void CpuOps::MatMul(const Matrix& w, const float* x, int64_t ldx, int rows, float* y, int64_t ldy) {
  cpu::MatMul(w, x, ldx, rows, y, ldy, pool_, isa_);
}

void CpuOps::MatMulShared(absl::Span<const MatMulTarget> targets, const float* x, int64_t ldx,
                          int rows) {
  // The kernel takes its outputs as a braced list so that one parallel loop
  // covers them all; the graphs share an input between at most three.
  auto out = [&](size_t i) {
    const MatMulTarget& t = targets[i];
    return cpu::MatMulOutput{t.w, t.y, t.ldy};
  };
  switch (targets.size()) {
    case 0:
      return;
    case 1:
      cpu::MatMulShared({out(0)}, x, ldx, rows, pool_, isa_);
      return;
    case 2:
      cpu::MatMulShared({out(0), out(1)}, x, ldx, rows, pool_, isa_);
      return;
    case 3:
      cpu::MatMulShared({out(0), out(1), out(2)}, x, ldx, rows, pool_, isa_);
      return;
    default:
      // Each output's sums are the same however the outputs are grouped.
      for (size_t i = 0; i < targets.size(); ++i) {
        cpu::MatMulShared({out(i)}, x, ldx, rows, pool_, isa_);
      }
  }
}

void CpuOps::StorePagedKv(int layer, const float* k, const float* v, int64_t ld) {
  const int bs = kv_->spec().block_size;
  for (int64_t t = 0; t < rows_.rows; ++t) {
    const SeqStep& seq = rows_.round->seqs[rows_.row_seq[t]];
    const int64_t p = rows_.positions[t];
    kv_->Store(seq.block_ids[p / bs], static_cast<int>(p % bs), layer, 0, k + t * ld);
    kv_->Store(seq.block_ids[p / bs], static_cast<int>(p % bs), layer, 1, v + t * ld);
  }
}

void CpuOps::AttendPaged(int layer, const AttentionHeads& heads, const float* q, float* out,
                         int64_t ld) {
  const int hd = heads.head_dim;
  const int group = heads.group;
  const int64_t ldq = ld;
  const int64_t nseq = static_cast<int64_t>(rows_.round->seqs.size());
  const int64_t tasks = nseq * heads.kv_heads;
  pool_->ParallelFor(tasks, [&](int64_t task, int thread) {
    const int s = static_cast<int>(task / heads.kv_heads);
    const int g = static_cast<int>(task % heads.kv_heads);
    const SeqStep& seq = rows_.round->seqs[s];
    const int rows = static_cast<int>(seq.tokens.size());
    const int64_t n_ctx = seq.start_position + rows;
    std::vector<float>& kb = kbuf_[thread];
    std::vector<float>& kt = ktbuf_[thread];
    std::vector<float>& vb = vbuf_[thread];
    std::vector<float>& sc = scores_[thread];
    if (kb.size() < static_cast<size_t>(n_ctx * hd)) {
      kb.resize(n_ctx * hd);
      kt.resize(n_ctx * hd);
      vb.resize(n_ctx * hd);
    }
    if (sc.size() < static_cast<size_t>(n_ctx)) sc.resize(n_ctx);
    // Every row, this chunk's own included, reads K/V back from the cache in
    // the stored dtype, exactly as a later decode step will.
    kv_->Gather(seq.block_ids, n_ctx, layer, 0, g, kb.data(), hd);
    kv_->Gather(seq.block_ids, n_ctx, layer, 1, g, vb.data(), hd);
    for (int64_t j = 0; j < n_ctx; ++j)
      for (int d = 0; d < hd; ++d) kt[d * n_ctx + j] = kb[j * hd + d];
    const int64_t row0 = rows_.seq_row0[s];
    for (int h = 0; h < heads.heads; ++h) {
      // Local query head h uses the KV head of its global index.
      if ((heads.head0 + h) / group - heads.kv_head0 != g) continue;
      AttendArgs a;
      a.q = q + row0 * ldq + int64_t{h} * hd;
      a.ldq = ldq;
      a.rows = rows;
      a.positions = rows_.positions + row0;
      a.kt = kt.data();
      a.ldkt = n_ctx;
      a.v = vb.data();
      a.ldv = hd;
      a.head_dim = hd;
      a.scores = sc.data();
      a.out = out + row0 * ldq + int64_t{h} * hd;
      a.ldo = ldq;
      AttendHead(a, isa_);
    }
  });
}

void CpuOps::SiluMul(float* gate, const float* up, int64_t rows, int64_t cols) {
  // Tasks of 16 rows: the split only decides which thread computes an
  // element, never its value.
  const int64_t T = rows, I = cols;
  const int64_t row_tasks = (T + 15) / 16;
  pool_->ParallelFor(row_tasks, [&](int64_t task, int) {
    const int64_t end = std::min(T, task * 16 + 16) * I;
    for (int64_t i = task * 16 * I; i < end; ++i) {
      const float g = gate[i];
      gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
    }
  });
}

void CpuOps::Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
}

absl::Status CpuOps::AllReduceSum(float* data, int64_t count) {
  if (comm_ == nullptr) return absl::OkStatus();
  return comm_->AllReduceSum(data, static_cast<size_t>(count));
}

absl::Status CpuOps::AllGather(const float* in, int64_t count, float* out) {
  if (comm_ == nullptr) {
    std::copy_n(in, count, out);
    return absl::OkStatus();
  }
  return comm_->AllGather(in, static_cast<size_t>(count), out);
}

}  // namespace ringlane::worker::cpu
