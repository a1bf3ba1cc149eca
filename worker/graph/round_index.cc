#include "worker/graph/round_index.h"

#include <algorithm>

namespace ringlane::worker {

int64_t RoundIndex::Begin(const RoundInput& round, ComputeOps* ops) {
  int64_t T = 0;
  seq_row0_.clear();
  for (const SeqStep& s : round.seqs) {
    seq_row0_.push_back(T);
    T += static_cast<int64_t>(s.tokens.size());
  }
  tokens_.resize(T);
  positions_.resize(T);
  row_seq_.resize(T);
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const SeqStep& seq = round.seqs[s];
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      const int64_t t = seq_row0_[s] + static_cast<int64_t>(i);
      tokens_[t] = seq.tokens[i];
      positions_[t] = seq.start_position + static_cast<int64_t>(i);
      row_seq_[t] = static_cast<int>(s);
    }
  }
  RoundRows rows;
  rows.round = &round;
  rows.rows = T;
  rows.tokens = tokens_.data();
  rows.positions = positions_.data();
  rows.row_seq = row_seq_.data();
  rows.seq_row0 = seq_row0_.data();
  ops->BeginRound(rows);
  return T;
}

absl::Status RoundIndex::Head(const ModelWeights& model, const RoundInput& round, const float* x,
                              int first_slot, ComputeOps* ops, RoundOutput* out) {
  want_.clear();
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    for (int32_t o : round.seqs[s].logit_offsets) want_.push_back(seq_row0_[s] + o);
  }
  if (want_.empty()) return absl::OkStatus();
  const ModelConfig& cfg = model.config;
  const TpShard& shard = model.shard;
  const int D = cfg.hidden;
  const int R = static_cast<int>(want_.size());
  float* picked = ops->Scratch(first_slot, int64_t{R} * D);
  float* normed = ops->Scratch(first_slot + 1, int64_t{R} * D);
  ops->SelectRows(x, D, want_, picked);
  ops->RmsNorm(picked, model.final_norm, D, cfg.rms_eps, normed, R);
  const int V = cfg.vocab, Vl = shard.vocab;
  float* logits = ops->Scratch(first_slot + 2, int64_t{R} * V);
  if (!(ops->group_size() > 1 && shard.world > 1)) {
    ops->MatMul(model.lm_head, normed, D, R, logits, V);
  } else {
    // Vocabulary-parallel head: each rank its rows, then every rank gathers
    // all of them (each samples the same token from the same logits).
    const int64_t local_n = int64_t{R} * Vl;
    float* local = ops->Scratch(first_slot + 3, local_n);
    float* all = ops->Scratch(first_slot + 4, local_n * shard.world);
    ops->MatMul(model.lm_head, normed, D, R, local, Vl);
    if (absl::Status st = ops->AllGather(local, local_n, all); !st.ok()) return st;
    for (int rk = 0; rk < shard.world; ++rk)
      for (int r = 0; r < R; ++r)
        std::copy_n(all + (int64_t{rk} * R + r) * Vl, Vl,
                    logits + int64_t{r} * V + int64_t{rk} * Vl);
  }
  int r = 0;
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const size_t n = round.seqs[s].logit_offsets.size();
    out->logits[s].assign(logits + int64_t{r} * V, logits + int64_t(r + n) * V);
    r += static_cast<int>(n);
  }
  return absl::OkStatus();
}

}  // namespace ringlane::worker
