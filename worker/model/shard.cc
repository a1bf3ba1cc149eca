#include "worker/model/shard.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::worker {

absl::StatusOr<std::shared_ptr<const ModelWeights>> ShardModel(
    std::shared_ptr<const ModelWeights> full, int rank, int world, const ShardOptions& options) {
  const ModelConfig& c = full->config;
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside a group of ", world));
  }
  if (world == 1) return full;
  if (c.linear.heads % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.linear.heads, " linear-attention heads do not split over ", world, " ranks"));
  }
  if (c.heads % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.heads, " attention heads do not split over ", world, " ranks"));
  }
  if (c.kv_heads % world != 0 && world % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.kv_heads, " KV heads neither split over nor replicate across ", world, " ranks"));
  }
  if (c.vocab % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary of ", c.vocab, " does not split over ", world, " ranks"));
  }
  const bool ep = options.expert_parallel;
  if (ep && (c.moe.n_routed == 0 || c.moe.n_routed % world != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("expert parallel: ", c.moe.n_routed,
                                                   " routed experts do not split over ", world,
                                                   " ranks"));
  }
  if (!ep && c.moe.n_routed > 0 && c.moe.expert_intermediate < world) {
    return absl::InvalidArgumentError(absl::StrCat("moe_intermediate_size of ",
                                                   c.moe.expert_intermediate,
                                                   " does not split over ", world, " ranks"));
  }
  auto s = std::make_shared<ModelWeights>();
  s->config = c;
  s->source = absl::StrCat(full->source, " [TP rank ", rank, "/", world, "]");
  s->files = full->files;
  TpShard& t = s->shard;
  t.rank = rank;
  t.world = world;
  t.heads = c.heads / world;
  t.head0 = rank * t.heads;
  if (c.kv_heads >= world) {
    t.kv_heads = c.kv_heads / world;
    t.kv_head0 = rank * t.kv_heads;
  } else {
    // Fewer KV heads than ranks: each rank keeps the one its query heads use.
    t.kv_heads = 1;
    t.kv_head0 = t.head0 / (c.heads / c.kv_heads);
  }
  // The MLP splits as evenly as it goes (the last ranks take one less).
  const int base = c.intermediate / world, extra = c.intermediate % world;
  t.intermediate = base + (rank < extra ? 1 : 0);
  t.inter0 = rank * base + std::min(rank, extra);
  t.vocab = c.vocab / world;
  t.vocab0 = rank * t.vocab;
  // Each expert, and the shared experts, split their columns like the MLP.
  auto split = [&](int n, int* begin, int* count) {
    const int b = n / world, x = n % world;
    *count = b + (rank < x ? 1 : 0);
    *begin = rank * b + std::min(rank, x);
  };
  if (ep) {
    t.experts = c.moe.n_routed / world;
    t.expert0 = rank * t.experts;
    t.expert_inter0 = 0;
    t.expert_intermediate = c.moe.expert_intermediate;
  } else {
    t.experts = c.moe.n_routed;
    split(c.moe.expert_intermediate, &t.expert_inter0, &t.expert_intermediate);
  }
  split(c.moe.n_shared * c.moe.expert_intermediate, &t.shared_inter0, &t.shared_intermediate);
  t.linear_heads = c.linear.heads / world;
  t.linear_head0 = rank * t.linear_heads;

  const int64_t hd = c.head_dim;
  s->embed = full->embed.Rows(t.vocab0, t.vocab);
  s->lm_head = full->lm_head.Rows(t.vocab0, t.vocab);
  s->final_norm = full->final_norm;
  s->hc_head = full->hc_head;
  // Megatron's column-then-row split of a gated MLP over [i0, i0 + n).
  auto mlp = [](const GatedMlpWeights& g, int i0, int n) {
    GatedMlpWeights o;
    if (g.w_gate.data == nullptr) return o;  // absent (no shared experts)
    o.w_gate = g.w_gate.Rows(i0, n);
    o.w_up = g.w_up.Rows(i0, n);
    o.w_down = g.w_down.Cols(i0, n);
    return o;
  };
  const MlaConfig& m = c.mla;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const int64_t nv = m.qk_nope_head_dim + m.v_head_dim;
  // A KDA mixer's heads: rows of the head-wise projections, slices of the
  // per-channel vectors (the convolutions' taps follow their channel).
  const int64_t lhd = c.linear.head_dim, K = c.linear.conv_kernel;
  const int64_t c0 = int64_t{t.linear_head0} * lhd, cn = int64_t{t.linear_heads} * lhd;
  auto slice = [](const std::vector<float>& v, int64_t begin, int64_t n) {
    return std::vector<float>(v.begin() + begin, v.begin() + begin + n);
  };
  for (size_t layer = 0; layer < full->layers.size(); ++layer) {
    const LayerWeights& l = full->layers[layer];
    LayerWeights o;
    o.attn_norm = l.attn_norm;
    o.ffn_norm = l.ffn_norm;
    o.sparse = l.sparse;
    // Every rank keeps the whole residual streams: the hyper-connections are
    // computed whole on each (small beside the sub-blocks they surround).
    o.hc_attn = l.hc_attn;
    o.hc_ffn = l.hc_ffn;
    if (c.linear.Linear(static_cast<int>(layer))) {
      const KdaWeights& k = l.kda;
      KdaWeights& q = o.kda;
      q.wq = k.wq.Rows(c0, cn);
      q.wk = k.wk.Rows(c0, cn);
      q.wv = k.wv.Rows(c0, cn);
      q.conv_q = slice(k.conv_q, c0 * K, cn * K);
      q.conv_k = slice(k.conv_k, c0 * K, cn * K);
      q.conv_v = slice(k.conv_v, c0 * K, cn * K);
      q.a_log = slice(k.a_log, t.linear_head0, t.linear_heads);
      q.dt_bias = slice(k.dt_bias, c0, cn);
      q.f_a = k.f_a;
      q.f_b = k.f_b.Rows(c0, cn);
      q.b = k.b.Rows(t.linear_head0, t.linear_heads);
      q.g_a = k.g_a;
      q.g_b = k.g_b.Rows(c0, cn);
      q.o_norm = k.o_norm;
      q.wo = k.wo.Cols(c0, cn);
    } else if (IsMla(c)) {
      // The latent and its norm are every head's: each rank computes them
      // whole (the down projections are small) and keeps its heads' rows of
      // the up projections.
      o.mla = l.mla;
      o.mla.wq_b = l.mla.wq_b.Rows(t.head0 * qk, t.heads * qk);
      o.mla.wkv_b = l.mla.wkv_b.Rows(t.head0 * nv, t.heads * nv);
      o.mla.wo = l.mla.wo.Cols(t.head0 * m.v_head_dim, t.heads * m.v_head_dim);
      o.indexer = l.indexer;
    } else {
      o.attn.wq = l.attn.wq.Rows(t.head0 * hd, t.heads * hd);
      o.attn.wk = l.attn.wk.Rows(t.kv_head0 * hd, t.kv_heads * hd);
      o.attn.wv = l.attn.wv.Rows(t.kv_head0 * hd, t.kv_heads * hd);
      o.attn.wo = l.attn.wo.Cols(t.head0 * hd, t.heads * hd);
    }
    if (l.sparse) {
      o.moe.router = l.moe.router;
      o.moe.correction_bias = l.moe.correction_bias;
      for (int x = t.expert0; x < t.expert0 + t.experts; ++x) {
        o.moe.experts.push_back(mlp(l.moe.experts[x], t.expert_inter0, t.expert_intermediate));
      }
      o.moe.shared = mlp(l.moe.shared, t.shared_inter0, t.shared_intermediate);
    } else {
      o.mlp = mlp(l.mlp, t.inter0, t.intermediate);
    }
    s->layers.push_back(std::move(o));
  }
  // The views point into memory `full` owns (mappings, converted buffers).
  s->keep_alive = std::move(full);
  return std::shared_ptr<const ModelWeights>(std::move(s));
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> FirstLayers(
    std::shared_ptr<const ModelWeights> full, int layers) {
  const ModelConfig& c = full->config;
  if (layers < 1 || layers >= c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("a self-drafter takes 1 to ", c.layers - 1,
                                                   " of the model's ", c.layers, " layers, not ",
                                                   layers));
  }
  if (full->shard.world > 1) {
    return absl::InvalidArgumentError("a self-drafter is cut from the whole model, not a shard");
  }
  if (std::find(c.linear.linear_layer.begin(), c.linear.linear_layer.end(), true) !=
      c.linear.linear_layer.end()) {
    // Its recurrent layers would need state slots of their own and
    // checkpoints to rewind rejected drafts.
    return absl::UnimplementedError(
        "a self-drafter of a model with linear-attention layers is not supported yet");
  }
  auto d = std::make_shared<ModelWeights>();
  d->config = c;
  d->config.layers = layers;
  // Per-layer choices follow their layers.
  if (d->config.moe.sparse_layer.size() > static_cast<size_t>(layers)) {
    d->config.moe.sparse_layer.resize(static_cast<size_t>(layers));
  }
  if (d->config.indexer.full_layer.size() > static_cast<size_t>(layers)) {
    d->config.indexer.full_layer.resize(static_cast<size_t>(layers));
  }
  d->shard = full->shard;
  d->embed = full->embed;
  d->layers.assign(full->layers.begin(), full->layers.begin() + layers);
  d->final_norm = full->final_norm;
  d->hc_head = full->hc_head;
  d->lm_head = full->lm_head;
  d->source = absl::StrCat(full->source, " (first ", layers, " layers)");
  d->keep_alive = std::move(full);
  return std::shared_ptr<const ModelWeights>(std::move(d));
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> MtpDrafter(
    std::shared_ptr<const ModelWeights> full) {
  if (full->mtp == nullptr) {
    return absl::InvalidArgumentError(
        "the model has no MTP layer (config.json's num_nextn_predict_layers is 0 or absent)");
  }
  if (full->shard.world > 1) {
    return absl::InvalidArgumentError("an MTP drafter is cut from the whole model, not a shard");
  }
  if (full->config.hyper.enabled()) {
    // What its hidden-state input is for a model whose residual is several
    // streams is not settled here; refused rather than guessed.
    return absl::UnimplementedError(
        "an MTP drafter of a model with hyper-connections (hc_mult > 1) is not supported yet");
  }
  auto d = std::make_shared<ModelWeights>();
  d->config = full->config;
  ModelConfig& c = d->config;
  c.layers = 1;
  c.moe.sparse_layer = {c.mtp_sparse};
  c.indexer.full_layer.clear();   // the MTP layer chooses its own positions
  c.linear.linear_layer.clear();  // and is an attention layer
  c.mtp_layers = 0;
  c.mtp_drafter = true;
  d->shard = full->shard;
  d->embed = full->embed;
  d->layers = {full->mtp->layer};
  d->final_norm = full->mtp->head_norm;
  d->lm_head = full->mtp->head;
  d->mtp = full->mtp;
  d->source = absl::StrCat(full->source, " (MTP layer)");
  d->keep_alive = std::move(full);
  return std::shared_ptr<const ModelWeights>(std::move(d));
}

}  // namespace ringlane::worker
