#include "worker/model/shard.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::worker {
namespace {

// Rows [r0, r0 + n) of m.
Matrix RowSlice(const Matrix& m, int64_t r0, int64_t n) {
  Matrix v = m;
  v.data = m.Row(r0);
  v.rows = n;
  v.row_offset = m.row_offset + r0;
  return v;
}

// Columns [c0, c0 + n) of m.
Matrix ColSlice(const Matrix& m, int64_t c0, int64_t n) {
  Matrix v = m;
  v.data = static_cast<const uint8_t*>(m.data) + c0 * static_cast<int64_t>(DTypeSize(m.dtype));
  v.cols = n;
  v.col_offset = m.col_offset + c0;
  return v;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ModelWeights>> ShardModel(
    std::shared_ptr<const ModelWeights> full, int rank, int world) {
  const ModelConfig& c = full->config;
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside a group of ", world));
  }
  if (world == 1) return full;
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

  const int64_t hd = c.head_dim;
  s->embed = RowSlice(full->embed, t.vocab0, t.vocab);
  s->lm_head = RowSlice(full->lm_head, t.vocab0, t.vocab);
  s->final_norm = full->final_norm;
  for (const LayerWeights& l : full->layers) {
    LayerWeights o;
    o.attn_norm = l.attn_norm;
    o.ffn_norm = l.ffn_norm;
    o.attn.wq = RowSlice(l.attn.wq, t.head0 * hd, t.heads * hd);
    o.attn.wk = RowSlice(l.attn.wk, t.kv_head0 * hd, t.kv_heads * hd);
    o.attn.wv = RowSlice(l.attn.wv, t.kv_head0 * hd, t.kv_heads * hd);
    o.attn.wo = ColSlice(l.attn.wo, t.head0 * hd, t.heads * hd);
    o.mlp.w_gate = RowSlice(l.mlp.w_gate, t.inter0, t.intermediate);
    o.mlp.w_up = RowSlice(l.mlp.w_up, t.inter0, t.intermediate);
    o.mlp.w_down = ColSlice(l.mlp.w_down, t.inter0, t.intermediate);
    s->layers.push_back(std::move(o));
  }
  // The views point into memory `full` owns (mappings, converted buffers).
  s->keep_alive = std::move(full);
  return std::shared_ptr<const ModelWeights>(std::move(s));
}

}  // namespace ringlane::worker
