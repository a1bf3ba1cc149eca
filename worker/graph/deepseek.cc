#include "worker/graph/deepseek.h"

#include <cmath>
#include <utility>
#include <vector>

#include "worker/model/rope.h"

namespace ringlane::worker {
namespace {

// The graph's activation buffers (ComputeOps::Scratch slots).
enum Slot : int {
  kX,    // [T][hidden] the residual stream
  kXb,   // [T][hidden] normed input of a block
  kTmp,  // [T][hidden] a block's output before the residual add
  kQa,   // [T][q_lora_rank] query latent
  kQaNormed,
  kQ,       // [T][heads * (nope + rope)]
  kLatent,  // [T][kv_lora_rank]
  kLatentNormed,
  kRopeKey,       // [T][rope]
  kQLatent,       // [T][heads * kv_lora_rank] queries absorbed into the latent space
  kOLatent,       // [T][heads * kv_lora_rank] attention output in the latent space
  kAtt,           // [T][heads * v_head_dim]
  kGate,          // [rows][intermediate]
  kUp,            // [rows][intermediate]
  kRouter,        // [T][n_routed] router logits
  kExpertIn,      // [rows of an expert][hidden]
  kExpertOut,     // [rows of an expert][hidden]
  kSlots,         // [T * experts_per_token][hidden] each choice's output
  kShared,        // [T][hidden] the shared experts' output
  kIndexQ,        // [T][index heads * index_head_dim] the indexer's queries
  kIndexGate,     // [T][index_head_dim] the pooled indexer's gate scores
  kIndexKeyRaw,   // [T][index_head_dim] before its LayerNorm
  kIndexKey,      // [T][index_head_dim]
  kIndexWeights,  // [T][index heads]
  kQGathered,     // context parallel: [world][T][local heads * ...] as gathered
  kQLatentAll,    // [T][heads][kv_lora_rank] every head's absorbed query
  kQAll,          // [T][heads][nope + rope] every head's query
  kOParts,        // [T][heads][kv_lora_rank] this rank's part, then [world][...] gathered
  kOGathered,
  kLse,          // [T][heads] this rank's log-sum-exps
  kLseGathered,  // [world][T][heads]
  kMtpHidden,    // [T][hidden] an MTP drafter's hidden inputs
  kMtpPart,      // [T][hidden] the normed hidden inputs
  kKdaQ,         // [T][linear heads * head_dim] q, k, v projections before the convolutions
  kKdaK,
  kKdaV,
  kKdaGateLow,  // [T][head_dim] f_a(x), then g_a(x)
  kKdaGate,     // [T][linear heads * head_dim] f_b(f_a(x)), then g_b(g_a(x))
  kKdaBeta,     // [T][linear heads]
  kKdaOut,      // [T][linear heads * head_dim]
  kHcStreams,   // [T][hc_mult * hidden] the residual streams (hyper-connections)
  kHcNormed,    // [T][hc_mult * hidden] their RMS-normed copy
  kHcMixes,     // [T][(2 + hc_mult) * hc_mult]
  kHcCoeffs,    // [T][hc_mult + hc_mult^2] a sub-block's output weights and mixing matrix
  kHead,        // RoundIndex::Head's five slots (the last slot: Head uses kHead..kHead+4)
};

// transformers' and DeepSeek's indexer LayerNorm epsilon.
constexpr float kIndexerNormEps = 1e-6f;

// transformers and DeepSeek's own model.py build q_a_layernorm and
// kv_a_layernorm with their norm's default epsilon, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

float SoftmaxScale(const ModelConfig& c) {
  const double mscale = YarnSoftmaxMscale(c.rope_scaling);
  const double qk = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  return static_cast<float>(mscale * mscale / std::sqrt(qk));
}

}  // namespace

DeepseekGraph::DeepseekGraph(std::shared_ptr<const ModelWeights> model)
    : model_(std::move(model)),
      cfg_(model_->config),
      shard_(model_->shard),
      inv_freq_(RopeInverseFrequencies(cfg_)),
      scale_(SoftmaxScale(cfg_)),
      linear_(LocalLinear(cfg_, shard_)) {
  // The RMS of the concatenated streams, without a weight.
  if (cfg_.hyper.enabled())
    hc_ones_.assign(static_cast<size_t>(cfg_.hyper.mult) * cfg_.hidden, 1.0f);
  const MlaConfig& m = cfg_.mla;
  const int64_t nv = m.qk_nope_head_dim + m.v_head_dim;
  int kv_layers = 0;
  for (int l = 0; l < cfg_.layers; ++l) {
    kv_layer_.push_back(cfg_.linear.Linear(l) ? -1 : kv_layers++);
  }
  kv_layer_.push_back(kv_layers);  // an MTP drafter's layer index past the model's
  for (int l = 0; l < static_cast<int>(model_->layers.size()); ++l) {
    const LayerWeights& w = model_->layers[l];
    LayerViews v;
    if (cfg_.linear.Linear(l)) {
      views_.push_back(std::move(v));
      continue;
    }
    v.kv_a_latent = w.mla.wkv_a.Rows(0, m.kv_lora_rank);
    v.kv_a_rope = w.mla.wkv_a.Rows(m.kv_lora_rank, m.qk_rope_head_dim);
    for (int h = 0; h < shard_.heads; ++h) {
      v.uk.push_back(w.mla.wkv_b.Rows(h * nv, m.qk_nope_head_dim));
      v.uv.push_back(w.mla.wkv_b.Rows(h * nv + m.qk_nope_head_dim, m.v_head_dim));
    }
    views_.push_back(std::move(v));
  }
}

LinearAttentionConfig DeepseekGraph::LocalLinear(const ModelConfig& config, const TpShard& shard) {
  LinearAttentionConfig local = config.linear;
  local.heads = shard.linear_heads;
  return local;
}

std::vector<LayerCacheSpec> DeepseekGraph::LayerCaches(const ModelConfig& config,
                                                       const TpShard& shard) {
  LayerCacheSpec latent;
  latent.kind = CacheKind::kLatentKv;
  latent.kv_heads = 1;
  latent.latent_dim = config.mla.kv_lora_rank;
  latent.rope_dim = config.mla.qk_rope_head_dim;
  // The indexer's key lives in the same row, so it is stored, evicted,
  // offloaded and restored with its latent, never apart from it.
  latent.index_dim = config.indexer.CachedDim();
  latent.head_dim = latent.latent_dim + latent.rope_dim + latent.index_dim;
  std::vector<LayerCacheSpec> caches(config.layers, latent);
  LayerCacheSpec state;
  state.kind = CacheKind::kRecurrentState;
  state.state_floats = LocalLinear(config, shard).StateFloats();
  for (int l = 0; l < config.layers; ++l) {
    if (config.linear.Linear(l)) caches[l] = state;
  }
  return caches;
}

absl::StatusOr<RoundOutput> DeepseekGraph::Forward(const RoundInput& round, ComputeOps* ops) {
  RoundOutput out;
  out.vocab = cfg_.vocab;
  out.logits.resize(round.seqs.size());
  if (round.seqs.empty()) return out;

  const int D = cfg_.hidden;
  const bool tp = ops->group_size() > 1 && shard_.world > 1;
  // Sums a row-parallel block's partial outputs over the group (rank order).
  auto reduce = [&](float* data, int64_t n) -> absl::Status {
    return tp ? ops->AllReduceSum(data, n) : absl::OkStatus();
  };
  const int64_t T = index_.Begin(round, ops);
  const int rows = static_cast<int>(T);
  float* x = ops->Scratch(kX, T * D);
  float* xb = ops->Scratch(kXb, T * D);
  float* tmp = ops->Scratch(kTmp, T * D);

  ops->Embed(model_->embed, shard_.vocab0, shard_.vocab, x);
  ops->PrepareRope(inv_freq_);
  if (absl::Status st = reduce(x, T * D); !st.ok()) return st;
  if (cfg_.mtp_drafter) MtpInput(round, rows, ops, x);

  // Hyper-connections: the residual is H streams, and x is always the sum
  // the next sub-block (or the head) reads.
  const bool hyper = cfg_.hyper.enabled();
  const int H = cfg_.hyper.mult;
  float* streams = nullptr;
  float* coeffs = nullptr;
  if (hyper) {
    streams = ops->Scratch(kHcStreams, T * H * D);
    coeffs = ops->Scratch(kHcCoeffs, T * (H + H * H));
    ops->HyperExpand(x, H, D, rows, streams);
    HyperPre(model_->layers[0].hc_attn, /*head=*/false, streams, rows, ops, x, coeffs);
  }

  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerWeights& w = model_->layers[l];
    ops->RmsNorm(x, w.attn_norm, D, cfg_.rms_eps, xb, rows);
    if (cfg_.linear.Linear(l)) {
      LinearAttention(l, xb, rows, ops, tmp);
    } else if (absl::Status st = Attention(l, xb, rows, ops, tmp); !st.ok()) {
      return st;
    }
    if (absl::Status st = reduce(tmp, T * D); !st.ok()) return st;
    if (hyper) {
      ops->HyperPost(tmp, coeffs, H, D, rows, streams);
      HyperPre(w.hc_ffn, /*head=*/false, streams, rows, ops, x, coeffs);
    } else {
      ops->Add(x, tmp, T * D);
    }

    ops->RmsNorm(x, w.ffn_norm, D, cfg_.rms_eps, xb, rows);
    if (w.sparse) {
      Moe(w, xb, rows, ops, tmp);
    } else {
      GatedMlp(w.mlp, shard_.intermediate, xb, rows, ops, tmp);
    }
    if (absl::Status st = reduce(tmp, T * D); !st.ok()) return st;
    if (hyper) {
      ops->HyperPost(tmp, coeffs, H, D, rows, streams);
      // The next layer's input, or the head's.
      const bool last = l + 1 == cfg_.layers;
      HyperPre(last ? model_->hc_head : model_->layers[l + 1].hc_attn, last, streams, rows, ops, x,
               coeffs);
    } else {
      ops->Add(x, tmp, T * D);
    }
  }

  if (round.want_hidden) Hidden(round, x, rows, ops, &out);
  if (absl::Status st = index_.Head(*model_, round, x, kHead, ops, &out); !st.ok()) return st;
  return out;
}

void DeepseekGraph::HyperPre(const HyperWeights& w, bool head, const float* streams, int rows,
                             ComputeOps* ops, float* x, float* coeffs) {
  const HyperConfig& h = cfg_.hyper;
  const int64_t width = int64_t{h.mult} * cfg_.hidden;
  const int mix = head ? h.mult : h.mix_dim();
  HyperArgs a;
  // A head without weights (GLM-5.3-Flash's checkpoints have no hc_head).
  a.mean = head && w.fn.data == nullptr;
  float* mixes = nullptr;
  if (!a.mean) {
    float* normed = ops->Scratch(kHcNormed, rows * width);
    mixes = ops->Scratch(kHcMixes, int64_t{rows} * h.mix_dim());
    ops->RmsNorm(streams, hc_ones_, static_cast<int>(width), cfg_.rms_eps, normed, rows);
    ops->MatMul(w.fn, normed, width, rows, mixes, mix);
  }
  a.mult = h.mult;
  a.dim = cfg_.hidden;
  a.sinkhorn_iters = h.sinkhorn_iters;
  a.eps = h.eps;
  a.scale = w.scale;
  a.base = w.base;
  a.head = head;
  ops->HyperPre(a, streams, mixes, mix, rows, x, coeffs);
}

void DeepseekGraph::MtpInput(const RoundInput& round, int rows, ComputeOps* ops, float* x) {
  const MtpWeights& m = *model_->mtp;
  const int D = cfg_.hidden;
  const int64_t T = rows;
  float* xb = ops->Scratch(kXb, T * D);
  float* h = ops->Scratch(kMtpHidden, T * D);
  float* part = ops->Scratch(kMtpPart, T * D);
  ops->RmsNorm(x, m.enorm, D, cfg_.rms_eps, xb, rows);
  // Zeroing the normed embedding equals normalising a zeroed one.
  zeros_.assign(static_cast<size_t>(D), 0.0f);
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const SeqStep& q = round.seqs[s];
    const int64_t row0 = index_.seq_row0()[s];
    ops->Upload(q.hidden_in.data(), static_cast<int64_t>(q.hidden_in.size()), h + row0 * D);
    if (q.start_position == 0) ops->Upload(zeros_.data(), D, xb + row0 * D);
  }
  ops->RmsNorm(h, m.hnorm, D, cfg_.rms_eps, part, rows);
  // eh_proj over the concatenation, as its two column halves.
  ops->MatMul(m.eh_proj.Cols(0, D), xb, D, rows, x, D);
  ops->MatMul(m.eh_proj.Cols(D, D), part, D, rows, h, D);
  ops->Add(x, h, T * D);
}

void DeepseekGraph::Hidden(const RoundInput& round, const float* x, int rows, ComputeOps* ops,
                           RoundOutput* out) {
  const int D = cfg_.hidden;
  const float* h = x;
  if (!cfg_.mtp_drafter) {
    float* normed = ops->Scratch(kXb, int64_t{rows} * D);
    ops->RmsNorm(x, model_->final_norm, D, cfg_.rms_eps, normed, rows);
    h = normed;
  }
  out->hidden.resize(round.seqs.size());
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(round.seqs[s].tokens.size()) * D;
    out->hidden[s].resize(static_cast<size_t>(n));
    ops->Download(h + index_.seq_row0()[s] * D, n, out->hidden[s].data());
  }
}

void DeepseekGraph::LinearAttention(int layer, const float* xb, int rows, ComputeOps* ops,
                                    float* out) {
  const LinearAttentionConfig& c = linear_;  // this rank's heads
  const KdaWeights& w = model_->layers[layer].kda;
  const int D = cfg_.hidden, H = c.heads, HD = c.head_dim;
  const int64_t T = rows, C = int64_t{H} * HD;
  float* q = ops->Scratch(kKdaQ, T * C);
  float* k = ops->Scratch(kKdaK, T * C);
  float* v = ops->Scratch(kKdaV, T * C);
  float* low = ops->Scratch(kKdaGateLow, T * HD);
  float* gate = ops->Scratch(kKdaGate, T * C);
  float* beta = ops->Scratch(kKdaBeta, T * H);
  float* o = ops->Scratch(kKdaOut, T * C);
  ops->MatMulShared({{&w.wq, q, C}, {&w.wk, k, C}, {&w.wv, v, C}}, xb, D, rows);
  ops->MatMulShared({{&w.f_a, low, HD}, {&w.b, beta, H}}, xb, D, rows);
  ops->MatMul(w.f_b, low, HD, rows, gate, C);
  KdaInput in;
  in.q = q;
  in.k = k;
  in.v = v;
  in.ld = C;
  in.gate = gate;
  in.ld_gate = C;
  in.beta = beta;
  in.ld_beta = H;
  in.w = &w;
  in.config = &c;
  ops->KdaMix(layer, in, o);
  // The output gate reuses the gate buffers: f_b's output is consumed.
  ops->MatMul(w.g_a, xb, D, rows, low, HD);
  ops->MatMul(w.g_b, low, HD, rows, gate, C);
  ops->GatedRmsNorm(o, gate, w.o_norm, H, HD, cfg_.rms_eps, rows);
  ops->MatMul(w.wo, o, C, rows, out, D);
}

absl::Status DeepseekGraph::Attention(int model_layer, const float* xb, int rows, ComputeOps* ops,
                                      float* out) {
  const MlaConfig& m = cfg_.mla;
  const MlaWeights& a = model_->layers[model_layer].mla;
  const LayerViews& v = views_[model_layer];
  // The KV pool holds the attention layers only (recurrent ones keep state).
  const int layer = kv_layer_[model_layer];
  const int D = cfg_.hidden, H = shard_.heads;
  const int C = m.kv_lora_rank, R = m.qk_rope_head_dim, N = m.qk_nope_head_dim;
  const int QK = N + R, V = m.v_head_dim, QL = m.q_lora_rank;
  const int64_t T = rows;
  float* q = ops->Scratch(kQ, T * H * QK);
  float* latent = ops->Scratch(kLatent, T * C);
  float* rope_key = ops->Scratch(kRopeKey, T * R);

  const IndexerConfig& ix = cfg_.indexer;
  const bool indexer = ix.topk > 0, full = indexer && ix.FullLayer(model_layer);
  const IndexerWeights& iw = model_->layers[model_layer].indexer;
  const int I = ix.head_dim, IH = ix.heads;
  float* index_key_raw = full ? ops->Scratch(kIndexKeyRaw, T * I) : nullptr;
  float* index_weights = full ? ops->Scratch(kIndexWeights, T * IH) : nullptr;
  // Pooled: each position's gate scores, cached beside its key.
  const bool pooled = indexer && ix.Pooled();
  float* index_gate = pooled ? ops->Scratch(kIndexGate, T * I) : nullptr;
  float* qa_normed = nullptr;
  // The projections of xb share their input: one op for all of them.
  if (QL > 0) {
    float* qa = ops->Scratch(kQa, T * QL);
    qa_normed = ops->Scratch(kQaNormed, T * QL);
    const MatMulTarget down[] = {{&a.wq_a, qa, QL},
                                 {&v.kv_a_latent, latent, C},
                                 {&v.kv_a_rope, rope_key, R},
                                 {&iw.wk, index_key_raw, I},
                                 {&iw.weights_proj, index_weights, IH},
                                 {&iw.kpool_gate, index_gate, I}};
    ops->MatMulShared(absl::MakeConstSpan(down, !full ? 3 : pooled ? 6 : 5), xb, D, rows);
    ops->RmsNorm(qa, a.q_a_norm, QL, kLatentNormEps, qa_normed, rows);
    ops->MatMul(a.wq_b, qa_normed, QL, rows, q, int64_t{H} * QK);
  } else {
    ops->MatMulShared(
        {{&a.wq_b, q, int64_t{H} * QK}, {&v.kv_a_latent, latent, C}, {&v.kv_a_rope, rope_key, R}},
        xb, D, rows);
  }
  float* latent_normed = ops->Scratch(kLatentNormed, T * C);
  ops->RmsNorm(latent, a.kv_a_norm, C, kLatentNormEps, latent_normed, rows);
  ops->Rope(rope_key, R, 1, R, cfg_.rope_layout);
  for (int h = 0; h < H; ++h)
    ops->Rope(q + int64_t{h} * QK + N, int64_t{H} * QK, 1, R, cfg_.rope_layout);
  float* index_key = nullptr;
  if (full) {
    // The indexer: its queries from the query latent, one key per token from
    // xb, both with RoPE on their first rope dims (the rope part leads).
    const RopeLayout layout = ix.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalf;
    float* index_q = ops->Scratch(kIndexQ, T * IH * I);
    index_key = ops->Scratch(kIndexKey, T * I);
    ops->MatMul(iw.wq_b, qa_normed, QL, rows, index_q, int64_t{IH} * I);
    ops->LayerNorm(index_key_raw, iw.k_norm, iw.k_norm_bias, I, kIndexerNormEps, index_key, rows);
    ops->Rope(index_key, I, 1, R, layout);
    for (int h = 0; h < IH; ++h) ops->Rope(index_q + int64_t{h} * I, int64_t{IH} * I, 1, R, layout);
  }
  const LatentPart parts[] = {
      {latent_normed, C, C}, {rope_key, R, R}, {index_key, I, I}, {index_gate, I, I}};
  ops->StoreLatent(layer, absl::MakeConstSpan(parts, !indexer ? 2 : pooled ? 4 : 3));
  if (full) {
    IndexerQuery iq;
    iq.q = ops->Scratch(kIndexQ, 0);
    iq.ldq = int64_t{IH} * I;
    iq.w = index_weights;
    iq.ldw = IH;
    iq.heads = IH;
    iq.head_dim = I;
    iq.key_offset = C + R;
    // The published score's constant factors: they scale every score of a
    // row alike, so they never change the choice, only its rounding.
    iq.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)) /
                                         std::sqrt(static_cast<double>(I)));
    if (pooled) {
      iq.kpool = ix.kpool;
      iq.ape = iw.kpool_ape.data();
      iq.pools = ix.topk / ix.kpool;
    }
    selected_.resize(T * ix.SelectionWidth());
    selected_count_.resize(T);
    if (absl::Status st = ops->IndexerSelect(layer, iq, ix.dense_window, ix.SelectionWidth(),
                                             selected_.data(), selected_count_.data());
        !st.ok()) {
      return st;
    }
  }

  // Absorb W_UK into each head's query: q_nope . (W_UK c) = (W_UK^T q_nope) . c.
  float* q_latent = ops->Scratch(kQLatent, T * H * C);
  for (int h = 0; h < H; ++h) {
    ops->MatMulTransposed(v.uk[h], q + int64_t{h} * QK, int64_t{H} * QK, rows,
                          q_latent + int64_t{h} * C, int64_t{H} * C);
  }
  float* o_latent = ops->Scratch(kOLatent, T * H * C);
  LatentHeads lh;
  lh.heads = H;
  lh.latent_dim = C;
  lh.rope_dim = R;
  lh.scale = scale_;
  lh.pe_ld = int64_t{H} * QK;
  lh.pe_stride = QK;
  // A shared layer (GLM-5.2) attends where the last full layer chose.
  const LatentSelection selection{selected_.data(), selected_count_.data(), ix.SelectionWidth()};
  const int W = ops->context_parallel();
  if (W <= 1) {
    ops->AttendLatent(layer, lh, q_latent, q + N, indexer ? &selection : nullptr, o_latent);
  } else {
    // Decode context parallel: this rank holds every W-th position, so it
    // attends with every head's query over those (the ranks' heads are
    // gathered, rank r's being heads r * H ..), and the ranks' partial
    // outputs are merged by their log-sum-exps for this rank's heads.
    const int HA = H * W;
    float* gathered = ops->Scratch(kQGathered, int64_t{W} * T * H * std::max(C, QK));
    float* q_latent_all = ops->Scratch(kQLatentAll, T * HA * C);
    float* q_all = ops->Scratch(kQAll, T * HA * QK);
    if (absl::Status st = ops->AllGather(q_latent, T * H * C, gathered); !st.ok()) return st;
    ops->TransposeBlocks(gathered, W, T, int64_t{H} * C, q_latent_all);
    if (absl::Status st = ops->AllGather(q, T * H * QK, gathered); !st.ok()) return st;
    ops->TransposeBlocks(gathered, W, T, int64_t{H} * QK, q_all);
    float* o_part = ops->Scratch(kOParts, T * HA * C);
    float* lse = ops->Scratch(kLse, T * HA);
    lh.heads = HA;
    lh.pe_ld = int64_t{HA} * QK;
    lh.lse = lse;
    ops->AttendLatent(layer, lh, q_latent_all, q_all + N, indexer ? &selection : nullptr, o_part);
    float* o_all = ops->Scratch(kOGathered, int64_t{W} * T * HA * C);
    float* lse_all = ops->Scratch(kLseGathered, int64_t{W} * T * HA);
    if (absl::Status st = ops->AllGather(o_part, T * HA * C, o_all); !st.ok()) return st;
    if (absl::Status st = ops->AllGather(lse, T * HA, lse_all); !st.ok()) return st;
    ops->MergeAttention(o_all, lse_all, W, T, HA, ops->context_rank() * H, H, C, o_latent);
  }

  // Each head's values: W_UV applied to its attention output in the latent space.
  float* att = ops->Scratch(kAtt, T * H * V);
  for (int h = 0; h < H; ++h) {
    ops->MatMul(v.uv[h], o_latent + int64_t{h} * C, int64_t{H} * C, rows, att + int64_t{h} * V,
                int64_t{H} * V);
  }
  ops->MatMul(a.wo, att, int64_t{H} * V, rows, out, D);
  return absl::OkStatus();
}

void DeepseekGraph::GatedMlp(const GatedMlpWeights& m, int inter, const float* in, int rows,
                             ComputeOps* ops, float* out, float limit) {
  float* gate = ops->Scratch(kGate, int64_t{rows} * inter);
  float* up = ops->Scratch(kUp, int64_t{rows} * inter);
  ops->MatMulShared({{&m.w_gate, gate, inter}, {&m.w_up, up, inter}}, in, cfg_.hidden, rows);
  ops->SiluMul(gate, up, rows, inter, limit);
  ops->MatMul(m.w_down, gate, inter, rows, out, cfg_.hidden);
}

void DeepseekGraph::Moe(const LayerWeights& w, const float* xb, int rows, ComputeOps* ops,
                        float* out) {
  const MoeConfig& e = cfg_.moe;
  const int D = cfg_.hidden, E = e.n_routed, k = e.experts_per_token;
  const int64_t T = rows;
  float* logits = ops->Scratch(kRouter, T * E);
  ops->MatMul(w.moe.router, xb, D, rows, logits, E);
  experts_.resize(T * k);
  weights_.resize(T * k);
  ops->MoeRoute(logits, rows, e, w.moe.correction_bias, experts_.data(), weights_.data());

  expert_tokens_.resize(E);
  expert_slots_.resize(E);
  for (int x = 0; x < E; ++x) {
    expert_tokens_[x].clear();
    expert_slots_[x].clear();
  }
  // Expert parallel: choices of another rank's experts weigh 0 here (their
  // rank adds them in the all-reduce), so they are neither run nor read.
  const int x0 = shard_.expert0, x1 = shard_.expert0 + shard_.experts;
  for (int64_t t = 0; t < T; ++t) {
    for (int s = 0; s < k; ++s) {
      const int32_t x = experts_[t * k + s];
      if (x < x0 || x >= x1) {
        weights_[t * k + s] = 0.0f;
        continue;
      }
      expert_tokens_[x].push_back(t);
      expert_slots_[x].push_back(t * k + s);
    }
  }
  // Each expert over the rows that chose it; a row's result is the same
  // whichever other rows an expert runs with.
  float* slots = ops->Scratch(kSlots, T * k * D);
  for (int x = x0; x < x1; ++x) {
    const int n = static_cast<int>(expert_tokens_[x].size());
    if (n == 0) continue;
    float* in = ops->Scratch(kExpertIn, int64_t{n} * D);
    float* res = ops->Scratch(kExpertOut, int64_t{n} * D);
    ops->SelectRows(xb, D, expert_tokens_[x], in);
    GatedMlp(w.moe.experts[x - x0], shard_.expert_intermediate, in, n, ops, res, e.swiglu_limit);
    ops->ScatterRows(res, D, expert_slots_[x], slots);
  }
  ops->WeightedRowSum(slots, weights_.data(), k, T, D, out);
  if (e.n_shared > 0) {
    float* shared = ops->Scratch(kShared, T * D);
    GatedMlp(w.moe.shared, shard_.shared_intermediate, xb, rows, ops, shared, e.swiglu_limit);
    ops->Add(out, shared, T * D);
  }
}

}  // namespace ringlane::worker
