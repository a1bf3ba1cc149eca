#include "worker/graph/llama.h"

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
  kPicked,  // RoundIndex::Head's five slots
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

  const int64_t T = index_.Begin(round, ops);

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
  if (absl::Status st = index_.Head(*model_, round, x, kPicked, ops, &out); !st.ok()) return st;
  return out;
}

}  // namespace ringlane::worker
