// The CPU backend: a Llama-family forward pass over a round, with the
// kernels of kernels.h on a persistent thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/aligned.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/collectives/communicator.h"
#include "worker/model/rope.h"
#include "worker/thread_pool.h"

namespace ringlane::worker {
namespace {

using cpu::Isa;

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const ModelWeights> model, const CpuBackendOptions& options)
      : model_(std::move(model)),
        cfg_(model_->config),
        shard_(model_->shard),
        comm_(options.comm),
        isa_(options.force_scalar ? Isa::kScalar : cpu::DetectIsa(options.allow_avx512)),
        pool_(options.threads, options.spin_us),
        inv_freq_(RopeInverseFrequencies(cfg_)) {}

  std::string name() const override {
    return absl::StrCat("cpu(", cpu::IsaName(isa_), ", ", pool_.num_threads(), " threads",
                        shard_.world > 1
                            ? absl::StrCat(", TP rank ", shard_.rank, "/", shard_.world)
                            : std::string(),
                        ")");
  }
  const ModelConfig& config() const override { return cfg_; }
  const KvPoolSpec& kv_pool() const override { return kv_spec_; }

  absl::Status AllocateKvPool(const KvPoolSpec& spec) override {
    kv_.reset();
    auto kv = KvCache::Create(cfg_.layers, shard_.kv_heads, cfg_.head_dim, spec);
    if (!kv.ok()) return kv.status();
    kv_ = std::move(*kv);
    kv_spec_ = spec;
    return absl::OkStatus();
  }

  int64_t kv_block_bytes() const override { return kv_ ? kv_->block_bytes() : 0; }

  absl::Status ExportKvBlock(int32_t block, std::vector<uint8_t>* out) const override {
    if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
    if (block < 0 || block >= kv_spec_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block ", block, " out of range [0, ", kv_spec_.num_blocks, ")"));
    }
    const uint8_t* p = kv_->BlockData(block);
    out->assign(p, p + kv_->block_bytes());
    return absl::OkStatus();
  }

  absl::Status ImportKvBlock(int32_t block, absl::Span<const uint8_t> data) override {
    if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
    if (block < 0 || block >= kv_spec_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block ", block, " out of range [0, ", kv_spec_.num_blocks, ")"));
    }
    if (static_cast<int64_t>(data.size()) != kv_->block_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("KV block payload is ", data.size(),
                                                     " bytes, expected ", kv_->block_bytes()));
    }
    std::memcpy(kv_->BlockData(block), data.data(), data.size());
    return absl::OkStatus();
  }

  absl::StatusOr<RoundOutput> Step(const RoundInput& round) override;

 private:
  absl::Status Validate(const RoundInput& round) const;
  void RmsNorm(const float* x, const std::vector<float>& w, float* out, int rows);
  void ApplyRope(float* x, int64_t ld, int heads, int rows);
  void Attention(const RoundInput& round, int layer);

  const std::shared_ptr<const ModelWeights> model_;
  const ModelConfig& cfg_;
  const TpShard shard_;       // this rank's heads, MLP columns and vocabulary rows
  Communicator* const comm_;  // null when not sharded
  const Isa isa_;
  ThreadPool pool_;
  const std::vector<float> inv_freq_;
  KvPoolSpec kv_spec_;
  std::unique_ptr<KvCache> kv_;

  // Per-round buffers, kept between rounds to avoid reallocation.
  std::vector<int64_t> positions_;  // [T]
  std::vector<int> row_seq_;        // [T] sequence of each row
  std::vector<int64_t> seq_row0_;   // first row of each sequence
  std::vector<float> cos_, sin_;    // [T][head_dim / 2]
  AlignedFloats x_, xb_, q_, k_, v_, att_, tmp_, gate_, up_;
  // Per-thread attention scratch.
  std::vector<std::vector<float>> kbuf_, ktbuf_, vbuf_, scores_;
};

absl::Status CpuBackend::Validate(const RoundInput& round) const {
  if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
  const int bs = kv_spec_.block_size;
  std::set<std::pair<int32_t, int>> written;
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const SeqStep& q = round.seqs[s];
    auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat("round sequence ", s, ": ", parts...));
    };
    if (q.tokens.empty()) return bad("no tokens");
    if (q.start_position < 0) return bad("negative start position ", q.start_position);
    for (int32_t t : q.tokens) {
      if (t < 0 || t >= cfg_.vocab)
        return bad("token id ", t, " outside vocabulary [0, ", cfg_.vocab, ")");
    }
    const int64_t end = q.start_position + static_cast<int64_t>(q.tokens.size());
    if (end > static_cast<int64_t>(q.block_ids.size()) * bs) {
      return bad("positions up to ", end, " need ", (end + bs - 1) / bs, " blocks, got ",
                 q.block_ids.size());
    }
    for (int32_t b : q.block_ids) {
      if (b < 0 || b >= kv_spec_.num_blocks) {
        return bad("KV block ", b, " outside pool [0, ", kv_spec_.num_blocks, ")");
      }
    }
    for (int32_t o : q.logit_offsets) {
      if (o < 0 || o >= static_cast<int32_t>(q.tokens.size())) {
        return bad("logit offset ", o, " outside the ", q.tokens.size(), " new tokens");
      }
    }
    for (int64_t p = q.start_position; p < end; ++p) {
      if (!written.insert({q.block_ids[p / bs], static_cast<int>(p % bs)}).second) {
        return bad("KV slot ", p % bs, " of block ", q.block_ids[p / bs],
                   " is written by two sequences in one round");
      }
    }
  }
  return absl::OkStatus();
}

void CpuBackend::RmsNorm(const float* x, const std::vector<float>& w, float* out, int rows) {
  const int D = cfg_.hidden;
  for (int t = 0; t < rows; ++t) {
    const float* xr = x + int64_t{t} * D;
    float* o = out + int64_t{t} * D;
    float ss = 0.0f;
    for (int j = 0; j < D; ++j) ss += xr[j] * xr[j];
    ss /= static_cast<float>(D);
    ss += cfg_.rms_eps;
    ss = 1.0f / std::sqrt(ss);
    for (int j = 0; j < D; ++j) o[j] = w[j] * (ss * xr[j]);
  }
}

void CpuBackend::ApplyRope(float* x, int64_t ld, int heads, int rows) {
  const int hd = cfg_.head_dim;
  const int half = hd / 2;
  const bool interleaved = cfg_.rope_layout == RopeLayout::kInterleaved;
  for (int t = 0; t < rows; ++t) {
    const float* c = cos_.data() + int64_t{t} * half;
    const float* s = sin_.data() + int64_t{t} * half;
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

void CpuBackend::Attention(const RoundInput& round, int layer) {
  const int hd = cfg_.head_dim;
  const int group = cfg_.heads / cfg_.kv_heads;  // query heads per KV head, whole model
  const int64_t ldq = int64_t{shard_.heads} * hd;
  const int64_t nseq = static_cast<int64_t>(round.seqs.size());
  const int64_t tasks = nseq * shard_.kv_heads;
  pool_.ParallelFor(tasks, [&](int64_t task, int thread) {
    const int s = static_cast<int>(task / shard_.kv_heads);
    const int g = static_cast<int>(task % shard_.kv_heads);
    const SeqStep& seq = round.seqs[s];
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
    const int64_t row0 = seq_row0_[s];
    for (int h = 0; h < shard_.heads; ++h) {
      // Local query head h uses the KV head of its global index.
      if ((shard_.head0 + h) / group - shard_.kv_head0 != g) continue;
      cpu::AttendArgs a;
      a.q = q_.data() + row0 * ldq + int64_t{h} * hd;
      a.ldq = ldq;
      a.rows = rows;
      a.positions = positions_.data() + row0;
      a.kt = kt.data();
      a.ldkt = n_ctx;
      a.v = vb.data();
      a.ldv = hd;
      a.head_dim = hd;
      a.scores = sc.data();
      a.out = att_.data() + row0 * ldq + int64_t{h} * hd;
      a.ldo = ldq;
      cpu::AttendHead(a, isa_);
    }
  });
}

absl::StatusOr<RoundOutput> CpuBackend::Step(const RoundInput& round) {
  if (absl::Status st = Validate(round); !st.ok()) return st;
  RoundOutput out;
  out.vocab = cfg_.vocab;
  out.logits.resize(round.seqs.size());
  if (round.seqs.empty()) return out;

  const int D = cfg_.hidden, hd = cfg_.head_dim, half = hd / 2;
  const int64_t qdim = int64_t{shard_.heads} * hd, kvdim = int64_t{shard_.kv_heads} * hd;
  const int I = shard_.intermediate;
  const bool tp = comm_ != nullptr && shard_.world > 1;
  // Sums a row-parallel layer's partial outputs over the group (rank order).
  auto reduce = [&](float* data, int64_t n) -> absl::Status {
    return tp ? comm_->AllReduceSum(data, static_cast<size_t>(n)) : absl::OkStatus();
  };
  const int bs = kv_spec_.block_size;

  int64_t T = 0;
  seq_row0_.clear();
  for (const SeqStep& s : round.seqs) {
    seq_row0_.push_back(T);
    T += static_cast<int64_t>(s.tokens.size());
  }
  positions_.resize(T);
  row_seq_.resize(T);
  cos_.resize(T * half);
  sin_.resize(T * half);
  x_.resize(T * D);
  xb_.resize(T * D);
  q_.resize(T * qdim);
  k_.resize(T * kvdim);
  v_.resize(T * kvdim);
  att_.resize(T * qdim);
  tmp_.resize(T * D);
  gate_.resize(T * I);
  up_.resize(T * I);
  kbuf_.resize(pool_.num_threads());
  ktbuf_.resize(pool_.num_threads());
  vbuf_.resize(pool_.num_threads());
  scores_.resize(pool_.num_threads());

  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const SeqStep& seq = round.seqs[s];
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      const int64_t t = seq_row0_[s] + static_cast<int64_t>(i);
      positions_[t] = seq.start_position + static_cast<int64_t>(i);
      row_seq_[t] = static_cast<int>(s);
      // Vocabulary-parallel: the rank holding the row writes it, the others
      // zeros, and the sum over the group is that row exactly.
      const int32_t local = seq.tokens[i] - shard_.vocab0;
      if (local >= 0 && local < shard_.vocab) {
        cpu::DequantRow(model_->embed, local, x_.data() + t * D, isa_);
      } else {
        std::fill(x_.begin() + t * D, x_.begin() + (t + 1) * D, 0.0f);
      }
      for (int j = 0; j < half; ++j) {
        const float angle = static_cast<float>(positions_[t]) * inv_freq_[j];
        cos_[t * half + j] = std::cos(angle);
        sin_[t * half + j] = std::sin(angle);
      }
    }
  }

  if (absl::Status st = reduce(x_.data(), T * D); !st.ok()) return st;
  const int rows = static_cast<int>(T);
  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerWeights& w = model_->layers[l];
    RmsNorm(x_.data(), w.attn_norm, xb_.data(), rows);
    cpu::MatMulShared(
        {{&w.wq, q_.data(), qdim}, {&w.wk, k_.data(), kvdim}, {&w.wv, v_.data(), kvdim}},
        xb_.data(), D, rows, &pool_, isa_);
    ApplyRope(q_.data(), qdim, shard_.heads, rows);
    ApplyRope(k_.data(), kvdim, shard_.kv_heads, rows);
    for (int64_t t = 0; t < T; ++t) {
      const SeqStep& seq = round.seqs[row_seq_[t]];
      const int64_t p = positions_[t];
      kv_->Store(seq.block_ids[p / bs], static_cast<int>(p % bs), l, 0, k_.data() + t * kvdim);
      kv_->Store(seq.block_ids[p / bs], static_cast<int>(p % bs), l, 1, v_.data() + t * kvdim);
    }
    Attention(round, l);
    cpu::MatMul(w.wo, att_.data(), qdim, rows, tmp_.data(), D, &pool_, isa_);
    if (absl::Status st = reduce(tmp_.data(), T * D); !st.ok()) return st;
    for (int64_t i = 0; i < T * D; ++i) x_[i] = x_[i] + tmp_[i];

    RmsNorm(x_.data(), w.ffn_norm, xb_.data(), rows);
    cpu::MatMulShared({{&w.w_gate, gate_.data(), I}, {&w.w_up, up_.data(), I}}, xb_.data(), D, rows,
                      &pool_, isa_);
    const int64_t row_tasks = (T + 15) / 16;
    pool_.ParallelFor(row_tasks, [&](int64_t task, int) {
      const int64_t end = std::min(T, task * 16 + 16) * I;
      for (int64_t i = task * 16 * I; i < end; ++i) {
        const float g = gate_[i];
        gate_[i] = g * (1.0f / (1.0f + std::exp(-g))) * up_[i];
      }
    });
    cpu::MatMul(w.w_down, gate_.data(), I, rows, tmp_.data(), D, &pool_, isa_);
    if (absl::Status st = reduce(tmp_.data(), T * D); !st.ok()) return st;
    for (int64_t i = 0; i < T * D; ++i) x_[i] = x_[i] + tmp_[i];
  }

  // Logits only for the rows asked for.
  std::vector<int64_t> want;
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    for (int32_t o : round.seqs[s].logit_offsets) want.push_back(seq_row0_[s] + o);
  }
  if (want.empty()) return out;
  const int R = static_cast<int>(want.size());
  AlignedFloats picked(static_cast<size_t>(R) * D), normed(static_cast<size_t>(R) * D);
  for (int r = 0; r < R; ++r) {
    std::memcpy(picked.data() + int64_t{r} * D, x_.data() + want[r] * D, D * sizeof(float));
  }
  RmsNorm(picked.data(), model_->final_norm, normed.data(), R);
  const int V = cfg_.vocab, Vl = shard_.vocab;
  std::vector<float> logits(static_cast<size_t>(R) * V);
  if (!tp) {
    cpu::MatMul(model_->lm_head, normed.data(), D, R, logits.data(), V, &pool_, isa_);
  } else {
    // Vocabulary-parallel head: each rank its rows, then every rank gathers
    // all of them (each samples the same token from the same logits).
    std::vector<float> local(static_cast<size_t>(R) * Vl), all(local.size() * shard_.world);
    cpu::MatMul(model_->lm_head, normed.data(), D, R, local.data(), Vl, &pool_, isa_);
    if (absl::Status st = comm_->AllGather(local.data(), local.size(), all.data()); !st.ok()) {
      return st;
    }
    for (int rk = 0; rk < shard_.world; ++rk)
      for (int r = 0; r < R; ++r)
        std::copy_n(all.data() + (int64_t{rk} * R + r) * Vl, Vl,
                    logits.data() + int64_t{r} * V + int64_t{rk} * Vl);
  }
  int r = 0;
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const size_t n = round.seqs[s].logit_offsets.size();
    out.logits[s].assign(logits.begin() + int64_t{r} * V, logits.begin() + int64_t(r + n) * V);
    r += static_cast<int>(n);
  }
  return out;
}

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(std::shared_ptr<const ModelWeights> model,
                                          const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(std::move(model), options);
}

absl::StatusOr<int64_t> CpuKvBlockBytes(const ModelConfig& config, const TpShard& shard,
                                        const KvPoolSpec& spec) {
  // The pool AllocateKvPool would make is a KvCache of exactly this shape.
  return KvCache::BlockBytes(config.layers, shard.kv_heads, config.head_dim, spec);
}

}  // namespace ringlane::worker
