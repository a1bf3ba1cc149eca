#include "worker/graph/llama.h"

#include <algorithm>
#include <utility>

#include "ringlane/v1/common.pb.h"
#include "worker/model/rope.h"

namespace ringlane::worker {
namespace {

// A worker advertises its layers' caches as the proto's enum; keep them one.
static_assert(static_cast<int>(CacheKind::kPagedKv) == v1::CACHE_KIND_PAGED_KV);
static_assert(static_cast<int>(CacheKind::kLatentKv) == v1::CACHE_KIND_LATENT_KV);
static_assert(static_cast<int>(CacheKind::kRecurrentState) == v1::CACHE_KIND_RECURRENT_STATE);

// The graph's activation buffers (ComputeOps::Scratch slots).
enum Slot : int {
  kX,       // [T][hidden] the residual stream
  kXb,      // [T][hidden] normed input of a block
  kQ,       // [T][heads * head_dim]
  kK,       // [T][kv_heads * head_dim]
  kV,       // [T][kv_heads * head_dim]
  kAtt,     // [T][heads * head_dim] attention output
  kTmp,     // [T][hidden] a block's output before the residual add
  kGate,    // [T][intermediate]
  kUp,      // [T][intermediate]
  kPicked,  // [R][hidden] the rows whose logits are asked for
  kNormed,  // [R][hidden]
  kLogits,  // [R][vocab]
  kLocal,   // [R][vocab rows of this rank]
  kAll,     // [world][R][vocab rows of a rank]
};

}  // namespace

LlamaGraph::LlamaGraph(std::shared_ptr<const ModelWeights> model)
    : model_(std::move(model)),
      cfg_(model_->config),
      shard_(model_->shard),
      inv_freq_(RopeInverseFrequencies(cfg_)) {}

std::vector<LayerCacheSpec> LlamaGraph::LayerCaches(const ModelConfig& config,
                                                    const TpShard& shard) {
  LayerCacheSpec paged;
  paged.kind = CacheKind::kPagedKv;
  paged.kv_heads = shard.kv_heads;
  paged.head_dim = config.head_dim;
  return std::vector<LayerCacheSpec>(config.layers, paged);
}

absl::StatusOr<RoundOutput> LlamaGraph::Forward(const RoundInput& round, ComputeOps* ops) {
  RoundOutput out;
  out.vocab = cfg_.vocab;
  out.logits.resize(round.seqs.size());
  if (round.seqs.empty()) return out;

  const int D = cfg_.hidden, hd = cfg_.head_dim;
  const int64_t qdim = int64_t{shard_.heads} * hd, kvdim = int64_t{shard_.kv_heads} * hd;
  const int I = shard_.intermediate;
  const bool tp = ops->group_size() > 1 && shard_.world > 1;
  // Sums a row-parallel layer's partial outputs over the group (rank order).
  auto reduce = [&](float* data, int64_t n) -> absl::Status {
    return tp ? ops->AllReduceSum(data, n) : absl::OkStatus();
  };

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
  RoundRows rows_info;
  rows_info.round = &round;
  rows_info.rows = T;
  rows_info.tokens = tokens_.data();
  rows_info.positions = positions_.data();
  rows_info.row_seq = row_seq_.data();
  rows_info.seq_row0 = seq_row0_.data();
  ops->BeginRound(rows_info);

  float* x = ops->Scratch(kX, T * D);
  float* xb = ops->Scratch(kXb, T * D);
  float* q = ops->Scratch(kQ, T * qdim);
  float* k = ops->Scratch(kK, T * kvdim);
  float* v = ops->Scratch(kV, T * kvdim);
  float* att = ops->Scratch(kAtt, T * qdim);
  float* tmp = ops->Scratch(kTmp, T * D);
  float* gate = ops->Scratch(kGate, T * I);
  float* up = ops->Scratch(kUp, T * I);

  // Vocabulary-parallel: the rank holding a token's row writes it, the others
  // zeros, and the sum over the group is that row exactly.
  ops->Embed(model_->embed, shard_.vocab0, shard_.vocab, x);
  ops->PrepareRope(inv_freq_);
  if (absl::Status st = reduce(x, T * D); !st.ok()) return st;

  AttentionHeads heads;
  heads.heads = shard_.heads;
  heads.kv_heads = shard_.kv_heads;
  heads.head_dim = hd;
  heads.head0 = shard_.head0;
  heads.kv_head0 = shard_.kv_head0;
  heads.group = cfg_.heads / cfg_.kv_heads;  // query heads per KV head, whole model

  const int rows = static_cast<int>(T);
  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerWeights& w = model_->layers[l];
    const DenseAttentionWeights& a = w.attn;
    ops->RmsNorm(x, w.attn_norm, D, cfg_.rms_eps, xb, rows);
    ops->MatMulShared({{&a.wq, q, qdim}, {&a.wk, k, kvdim}, {&a.wv, v, kvdim}}, xb, D, rows);
    ops->Rope(q, qdim, shard_.heads, hd, cfg_.rope_layout);
    ops->Rope(k, kvdim, shard_.kv_heads, hd, cfg_.rope_layout);
    ops->StorePagedKv(l, k, v, kvdim);
    ops->AttendPaged(l, heads, q, att, qdim);
    ops->MatMul(a.wo, att, qdim, rows, tmp, D);
    if (absl::Status st = reduce(tmp, T * D); !st.ok()) return st;
    ops->Add(x, tmp, T * D);

    const GatedMlpWeights& m = w.mlp;
    ops->RmsNorm(x, w.ffn_norm, D, cfg_.rms_eps, xb, rows);
    ops->MatMulShared({{&m.w_gate, gate, I}, {&m.w_up, up, I}}, xb, D, rows);
    ops->SiluMul(gate, up, T, I);
    ops->MatMul(m.w_down, gate, I, rows, tmp, D);
    if (absl::Status st = reduce(tmp, T * D); !st.ok()) return st;
    ops->Add(x, tmp, T * D);
  }

  // Logits only for the rows asked for.
  want_.clear();
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    for (int32_t o : round.seqs[s].logit_offsets) want_.push_back(seq_row0_[s] + o);
  }
  if (want_.empty()) return out;
  if (absl::Status st = Head(round, ops, &out); !st.ok()) return st;
  return out;
}

absl::Status LlamaGraph::Head(const RoundInput& round, ComputeOps* ops, RoundOutput* out) {
  const int D = cfg_.hidden;
  const int R = static_cast<int>(want_.size());
  const float* x = ops->Scratch(kX, 0);
  float* picked = ops->Scratch(kPicked, int64_t{R} * D);
  float* normed = ops->Scratch(kNormed, int64_t{R} * D);
  ops->SelectRows(x, D, want_, picked);
  ops->RmsNorm(picked, model_->final_norm, D, cfg_.rms_eps, normed, R);
  const int V = cfg_.vocab, Vl = shard_.vocab;
  float* logits = ops->Scratch(kLogits, int64_t{R} * V);
  if (!(ops->group_size() > 1 && shard_.world > 1)) {
    ops->MatMul(model_->lm_head, normed, D, R, logits, V);
  } else {
    // Vocabulary-parallel head: each rank its rows, then every rank gathers
    // all of them (each samples the same token from the same logits).
    const int64_t local_n = int64_t{R} * Vl;
    float* local = ops->Scratch(kLocal, local_n);
    float* all = ops->Scratch(kAll, local_n * shard_.world);
    ops->MatMul(model_->lm_head, normed, D, R, local, Vl);
    if (absl::Status st = ops->AllGather(local, local_n, all); !st.ok()) return st;
    for (int rk = 0; rk < shard_.world; ++rk)
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
