#include "worker/backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace ringlane::worker::cpu {

namespace {

// Latent heads attended together (AttendHeads) at most, and the floats of
// their copied queries at most: a decode step's few rows take 16 heads to a
// pass over the latents, a prefill chunk's hundreds of rows fewer.
constexpr int64_t kHeadsTogether = 16;
constexpr int64_t kTogetherQueryFloats = int64_t{1} << 20;
// Query rows of a sequence up to which attention converts the context a
// tile at a time for each row, rather than once into a float copy that all
// rows read (ReadsTiles).
constexpr int kTileSourceRows = 4;

}  // namespace

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
  qbuf_.resize(threads);
  sel_kt_.resize(threads);
  sel_v_.resize(threads);
  local_pos_.resize(threads);
  local_sel_.resize(threads);
  attend_args_.resize(threads);
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

bool CpuOps::ReadsTiles(int rows, int v_dim) const {
  return rows <= kTileSourceRows && v_dim > kNarrowValueDims && isa_ != Isa::kScalar;
}

PagedKv CpuOps::PagedContext(const SeqStep& seq, int64_t n, int layer) const {
  return {.cache = kv_, .block_ids = seq.block_ids, .n = n, .layer = layer, .isa = isa_};
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
    AlignedFloats& kt = ktbuf_[thread];
    AlignedFloats& vb = vbuf_[thread];
    AlignedFloats& sc = scores_[thread];
    const int64_t ldkt = SpreadStride(n_ctx);
    // Every row, this chunk's own included, reads K/V back from the cache in
    // the stored dtype, exactly as a later decode step will. A few rows (a
    // decode step, a verify row) read the blocks a tile at a time as the
    // kernel reaches them: a float copy of a long context is 4 bytes a value
    // written and read back for FP8's 1 read. Many rows (a prefill chunk)
    // share one copy, K straight into the transposed rows the scores are
    // taken over. The floats, hence the results, are the same either way.
    PagedKv paged = PagedContext(seq, n_ctx, layer);
    paged.head = g;
    const KvTileSource source{FillPagedKv, &paged};
    const bool tiles = ReadsTiles(rows, hd);
    if (!tiles) {
      if (vb.size() < static_cast<size_t>(n_ctx * hd)) vb.resize(n_ctx * hd);
      if (kt.size() < static_cast<size_t>(ldkt * hd)) kt.resize(ldkt * hd);
      GatherKvHead(*kv_, seq.block_ids, n_ctx, layer, 0, g, kt.data(), ldkt, /*transposed=*/true,
                   isa_);
      GatherKvHead(*kv_, seq.block_ids, n_ctx, layer, 1, g, vb.data(), hd, /*transposed=*/false,
                   isa_);
    }
    const int64_t row0 = rows_.seq_row0[s];
    // The query heads of this KV head together: one pass over its K and V.
    std::vector<AttendArgs>& args = attend_args_[thread];
    args.clear();
    for (int h = 0; h < heads.heads; ++h) {
      // Local query head h uses the KV head of its global index.
      if ((heads.head0 + h) / group - heads.kv_head0 != g) continue;
      AttendArgs a;
      a.q = q + row0 * ldq + int64_t{h} * hd;
      a.ldq = ldq;
      a.rows = rows;
      a.positions = rows_.positions + row0;
      a.kt = kt.data();
      a.ldkt = ldkt;
      a.v = vb.data();
      a.ldv = hd;
      a.head_dim = hd;
      a.out = out + row0 * ldq + int64_t{h} * hd;
      a.ldo = ldq;
      if (tiles) a.source = &source;
      args.push_back(a);
    }
    if (sc.size() < args.size() * n_ctx) sc.resize(args.size() * n_ctx);
    for (size_t i = 0; i < args.size(); ++i) args[i].scores = sc.data() + i * n_ctx;
    AttendHeads(args.data(), static_cast<int>(args.size()), isa_);
  });
}

void CpuOps::MatMulTransposed(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
                              int64_t ldy) {
  const int64_t R = w.rows, C = w.cols;
  if (wt_.size() < static_cast<size_t>(R * C)) wt_.resize(R * C);
  float* wt = wt_.data();
  pool_->ParallelFor(R, [&](int64_t r, int) { DequantRow(w, r, wt + r * C, isa_); });
  // One row per task: y[m][c] accumulates w[i][c] * x[m][i] in increasing i,
  // a multiply and an add each (compiled once, so every ISA rounds alike).
  pool_->ParallelFor(rows, [&](int64_t m, int) {
    float* ym = y + m * ldy;
    const float* xm = x + m * ldx;
    std::fill(ym, ym + C, 0.0f);
    for (int64_t i = 0; i < R; ++i) {
      const float xi = xm[i];
      const float* wi = wt + i * C;
      for (int64_t c = 0; c < C; ++c) ym[c] = ym[c] + xi * wi[c];
    }
  });
}

void CpuOps::StoreLatent(int layer, absl::Span<const LatentPart> parts) {
  const int bs = kv_->spec().block_size;
  latent_row_.resize(kv_->head_dim());
  for (int64_t t = 0; t < rows_.rows; ++t) {
    const SeqStep& seq = rows_.round->seqs[rows_.row_seq[t]];
    const int64_t p = rows_.positions[t];
    float* dst = latent_row_.data();
    for (const LatentPart& part : parts) {
      if (part.p == nullptr) {
        std::fill_n(dst, part.dim, 0.0f);
      } else {
        std::copy_n(part.p + t * part.ld, part.dim, dst);
      }
      dst += part.dim;
    }
    // Context parallel: this rank keeps every world-th position, at its
    // local index among them.
    if (p % dcp_world_ != dcp_rank_) continue;
    const int64_t j = p / dcp_world_;
    kv_->Store(seq.block_ids[j / bs], static_cast<int>(j % bs), layer, 0, latent_row_.data());
  }
}

void CpuOps::AttendLatent(int layer, const LatentHeads& lh, const float* q_lat, const float* q_pe,
                          const LatentSelection* selection, float* out) {
  // Attention reads the latent and the rope key of each cached row (W
  // columns, not the indexer's key); the values are the latents (C).
  const int C = lh.latent_dim, R = lh.rope_dim, W = C + R;
  const int64_t nseq = static_cast<int64_t>(rows_.round->seqs.size());
  // Heads in as many chunks as there are threads: a lone decoding sequence
  // still uses every thread; each chunk reads the sequence's latents once.
  const int chunks = std::min<int>(lh.heads, static_cast<int>(pool_->num_threads()));
  pool_->ParallelFor(nseq * chunks, [&](int64_t task, int thread) {
    const int s = static_cast<int>(task / chunks);
    const int chunk = static_cast<int>(task % chunks);
    const int h0 = chunk * lh.heads / chunks, h1 = (chunk + 1) * lh.heads / chunks;
    const SeqStep& seq = rows_.round->seqs[s];
    const int rows = static_cast<int>(seq.tokens.size());
    const int64_t row0 = rows_.seq_row0[s];
    auto sparse = [&](int r) { return selection != nullptr && selection->count[row0 + r] > 0; };
    // Dense rows read the context up to their own position; sparse rows
    // (past the window, so after every dense row) only what they chose.
    // Context parallel: the rank's own positions only, by local index; a
    // row sees the local ones up to its position (LocalCount).
    std::vector<int64_t>& local_pos = local_pos_[thread];
    local_pos.resize(static_cast<size_t>(rows));
    int64_t n_dense = 0;
    for (int r = 0; r < rows; ++r) {
      local_pos[r] = LocalCount(rows_.positions[row0 + r]) - 1;
      if (!sparse(r)) n_dense = local_pos[r] + 1;
    }
    AlignedFloats& kb = kbuf_[thread];
    AlignedFloats& kt = ktbuf_[thread];
    AlignedFloats& sc = scores_[thread];
    AlignedFloats& qb = qbuf_[thread];
    const int64_t n_scores = std::max<int64_t>(n_dense, selection ? selection->topk : 0);
    const int64_t ldkt = SpreadStride(n_dense);
    int n_dense_rows = 0;
    while (n_dense_rows < rows && !sparse(n_dense_rows)) ++n_dense_rows;
    // A few dense rows (decode) read the latents a tile at a time, as
    // AttendPaged's do; more share one copy of the context.
    PagedKv paged = PagedContext(seq, n_dense, layer);
    paged.cols = W;
    const KvTileSource source{FillPagedKv, &paged};
    const bool tiles = ReadsTiles(n_dense_rows, C);
    if (!tiles) {
      if (kb.size() < static_cast<size_t>(n_dense * W)) kb.resize(n_dense * W);
      if (kt.size() < static_cast<size_t>(ldkt * W)) kt.resize(ldkt * W);
      // Read back in the stored dtype, this round's rows too, as decode will.
      GatherLatentRows(*kv_, seq.block_ids, 0, nullptr, n_dense, layer, 0, W, kb.data(), W, isa_);
      Transpose(kb.data(), n_dense, W, W, kt.data(), ldkt, isa_);
    }
    // Heads go through the kernel together (one pass over the latents for
    // several heads), each with its own queries and scores: as many as keep
    // those queries within kTogetherQueryFloats (a prefill chunk's rows
    // leave room for fewer heads than a decode step's).
    const int together = static_cast<int>(std::clamp<int64_t>(
        kTogetherQueryFloats / std::max<int64_t>(1, int64_t{rows} * W), 1, kHeadsTogether));
    if (sc.size() < static_cast<size_t>(n_scores) * together) sc.resize(n_scores * together);
    if (qb.size() < static_cast<size_t>(rows) * W * together) {
      qb.resize(static_cast<size_t>(rows) * W * together);
    }
    const int64_t ld_lat = int64_t{lh.heads} * C;
    AlignedFloats& skt = sel_kt_[thread];
    AlignedFloats& sv = sel_v_[thread];
    // Head h's query of row r: the absorbed latent part, then the rope part.
    auto query = [&](int r, int h, float* dst) {
      const int64_t t = row0 + r;
      std::copy_n(q_lat + t * ld_lat + int64_t{h} * C, C, dst);
      std::copy_n(q_pe + t * lh.pe_ld + h * lh.pe_stride, R, dst + C);
    };
    std::vector<AttendArgs>& args = attend_args_[thread];
    // Heads [h0, h1) of the chunk, `together` at a time, over one context
    // (its keys transposed and its values): `n_rows` rows from round row
    // t0, each head's queries written to qh by `fill(h, qh)` (its own, as are
    // its scores). The log-sum-exps, for context parallel, are
    // [rows][heads].
    auto attend = [&](int n_rows, const int64_t* positions, const float* keys, int64_t ld_keys,
                      const float* values, const KvTileSource* tile_source, int64_t t0, auto fill) {
      const AttendArgs shared{.ldq = W,
                              .rows = n_rows,
                              .positions = positions,
                              .kt = keys,
                              .ldkt = ld_keys,
                              .v = values,
                              .ldv = W,
                              .head_dim = W,
                              .ldo = ld_lat,
                              .v_dim = C,
                              .scale = lh.scale,
                              .ld_lse = lh.heads,
                              .source = tile_source};
      for (int hp = h0; hp < h1; hp += together) {
        args.clear();
        for (int h = hp; h < std::min(h1, hp + together); ++h) {
          float* qh = qb.data() + static_cast<size_t>(h - hp) * rows * W;
          fill(h, qh);
          AttendArgs& a = args.emplace_back(shared);
          a.q = qh;
          a.scores = sc.data() + static_cast<size_t>(h - hp) * n_scores;
          a.out = out + t0 * ld_lat + int64_t{h} * C;
          a.lse = lh.lse != nullptr ? lh.lse + t0 * lh.heads + h : nullptr;
        }
        AttendHeads(args.data(), static_cast<int>(args.size()), isa_);
      }
    };
    // A row computes the same whatever rows run beside it: the dense rows of
    // a sequence (a prefix of them, as positions increase) go together per
    // head; each sparse row reads its chosen positions once for all heads.
    if (n_dense_rows > 0) {
      attend(n_dense_rows, local_pos.data(), kt.data(), ldkt, kb.data(), tiles ? &source : nullptr,
             row0, [&](int h, float* qh) {
               for (int r = 0; r < n_dense_rows; ++r) query(r, h, qh + int64_t{r} * W);
             });
    }
    for (int r = n_dense_rows; r < rows; ++r) {
      const int64_t t = row0 + r;
      // The chosen positions, in increasing order, as a context of their
      // own (context parallel: those this rank holds, by local index).
      absl::Span<const int32_t> chosen(selection->selected + t * selection->topk,
                                       selection->count[t]);
      std::vector<int32_t>& mine = local_sel_[thread];
      if (dcp_world_ > 1) {
        mine.clear();
        for (int32_t p : chosen) {
          if (p % dcp_world_ == dcp_rank_) mine.push_back(p / dcp_world_);
        }
        chosen = mine;
      }
      const int n_sel = static_cast<int>(chosen.size());
      if (n_sel == 0) {
        for (int h = h0; h < h1; ++h) {
          std::fill_n(out + t * ld_lat + int64_t{h} * C, C, 0.0f);
          if (lh.lse != nullptr) lh.lse[t * lh.heads + h] = -INFINITY;
        }
        continue;
      }
      sv.resize(static_cast<size_t>(n_sel) * W);
      const int64_t ld_sel = SpreadStride(n_sel);
      skt.resize(static_cast<size_t>(ld_sel) * W);
      GatherLatentRows(*kv_, seq.block_ids, 0, chosen.data(), n_sel, layer, 0, W, sv.data(), W,
                       isa_);
      Transpose(sv.data(), n_sel, W, W, skt.data(), ld_sel, isa_);
      const int64_t last = n_sel - 1;
      attend(1, &last, skt.data(), ld_sel, sv.data(), nullptr, t,
             [&](int h, float* qh) { query(r, h, qh); });
    }
  });
}

absl::Status CpuOps::IndexerSelect(int layer, const IndexerQuery& iq, int dense_window, int topk,
                                   int32_t* selected, int32_t* count) {
  // Context parallel: each rank scores the keys it holds and proposes its
  // own top-k as (score, position) candidates; the ranks' candidates are
  // gathered and every rank merges them in the same order. The global top-k
  // is in the union of the local ones, and a key's score is the same on
  // whichever rank holds it, so the choice equals the whole context's.
  const bool cp = dcp_world_ > 1;
  if (cp) candidates_.assign(static_cast<size_t>(rows_.rows) * topk * 2, 0.0f);
  auto no_candidates = [&](int64_t t) {
    for (int i = 0; i < topk; ++i) {
      candidates_[(t * topk + i) * 2] = -INFINITY;
      candidates_[(t * topk + i) * 2 + 1] = -1.0f;
    }
  };
  if (cp) {
    for (int64_t t = 0; t < rows_.rows; ++t) no_candidates(t);
  }
  const int I = iq.head_dim;
  // Pooled keys: P positions' keys and gate scores per pool, every pool's
  // from its own positions only, so a pool's key is the same whichever
  // query or round computes it.
  const int P = iq.kpool;
  const bool pooled = P > 1;
  if (pooled && cp) {
    return absl::UnimplementedError(
        "the pooled indexer (index_kpool) under decode context parallel");
  }
  const int G = pooled ? 2 * I : I;  // floats gathered per position
  // Keys are split over the threads, sequence by sequence: a single decoding
  // stream at long context is one row scoring every key, and each key's
  // score is its own (IndexerScores), so the split never changes a bit.
  constexpr int64_t kKeysPerTask = 1024;
  for (size_t s = 0; s < rows_.round->seqs.size(); ++s) {
    const SeqStep& seq = rows_.round->seqs[s];
    const int rows = static_cast<int>(seq.tokens.size());
    const int64_t n_ctx = LocalCount(seq.start_position + rows - 1);
    const int64_t row0 = rows_.seq_row0[s];
    bool any = false;
    for (int r = 0; r < rows; ++r) {
      count[row0 + r] = 0;
      any = any || rows_.positions[row0 + r] + 1 > dense_window;
    }
    if (!any) continue;
    // The keys transposed once per sequence: the scores of consecutive
    // positions are then computed side by side.
    // Pooled: the scored keys are the complete pools' (a pool of positions
    // [jP, jP + P) is complete once its last position is cached).
    const int64_t n_keys = pooled ? n_ctx / P : n_ctx;
    index_keys_.resize(n_ctx * G);
    index_kt_.resize(n_keys * I);
    index_scores_.resize(n_keys);
    const int64_t tasks = (n_ctx + kKeysPerTask - 1) / kKeysPerTask;
    pool_->ParallelFor(tasks, [&](int64_t task, int) {
      const int64_t j0 = task * kKeysPerTask, j1 = std::min(n_ctx, j0 + kKeysPerTask);
      GatherLatentRows(*kv_, seq.block_ids, j0, nullptr, j1 - j0, layer, iq.key_offset, G,
                       index_keys_.data() + j0 * G, G, isa_);
      if (pooled) return;
      Transpose(index_keys_.data() + j0 * I, j1 - j0, I, I, index_kt_.data() + j0, n_ctx, isa_);
    });
    if (pooled) {
      // pk_j[d] = sum_m softmax_m(gate_{jP+m}[d] + ape[m][d]) k_{jP+m}[d].
      pool_->ParallelFor((n_keys + kKeysPerTask - 1) / kKeysPerTask, [&](int64_t task, int) {
        const int64_t p0 = task * kKeysPerTask, p1 = std::min(n_keys, p0 + kKeysPerTask);
        for (int64_t j = p0; j < p1; ++j) {
          const float* row = index_keys_.data() + j * P * G;
          for (int d = 0; d < I; ++d) {
            double mx = -INFINITY;
            for (int m = 0; m < P; ++m) {
              mx = std::max(mx, double{row[m * G + I + d]} + iq.ape[m * I + d]);
            }
            double sum = 0.0, acc = 0.0;
            for (int m = 0; m < P; ++m) {
              const double e = std::exp(double{row[m * G + I + d]} + iq.ape[m * I + d] - mx);
              sum += e;
              acc += e * row[m * G + d];
            }
            index_kt_[d * n_keys + j] = static_cast<float>(acc / sum);
          }
        }
      });
    }
    std::vector<float> w(iq.heads);
    std::vector<int32_t> order;
    for (int r = 0; r < rows; ++r) {
      const int64_t t = row0 + r;
      if (rows_.positions[t] + 1 <= dense_window) continue;
      const int64_t position = rows_.positions[t];
      // Keys of this rank it may see; pooled: its complete pools.
      const int64_t n = pooled ? (position + 1) / P : LocalCount(position);
      // This row's query and the cached keys alone decide: the choice never
      // depends on the row's round-mates.
      for (int h = 0; h < iq.heads; ++h) w[h] = iq.weight_scale * iq.w[t * iq.ldw + h];
      pool_->ParallelFor((n + kKeysPerTask - 1) / kKeysPerTask, [&](int64_t task, int thread) {
        const int64_t j0 = task * kKeysPerTask, len = std::min(n - j0, kKeysPerTask);
        AlignedFloats& dot = vbuf_[thread];
        if (dot.size() < static_cast<size_t>(len)) dot.resize(len);
        IndexerScores({iq.q + t * iq.ldq, w.data(), iq.heads, I, index_kt_.data() + j0, n_keys, len,
                       dot.data(), index_scores_.data() + j0},
                      isa_);
      });
      const float* sc = index_scores_.data();
      const int k = static_cast<int>(std::min<int64_t>(pooled ? iq.pools : topk, n));
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      // Local index order is position order, so ties go to the lower
      // position here as in the merge.
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
      });
      if (cp) {
        for (int i = 0; i < k; ++i) {
          candidates_[(t * topk + i) * 2] = sc[order[i]];
          candidates_[(t * topk + i) * 2 + 1] =
              static_cast<float>(int64_t{order[i]} * dcp_world_ + dcp_rank_);
        }
        continue;
      }
      std::sort(order.begin(), order.begin() + k);
      if (pooled) {
        // The chosen pools' positions, then the tail past the last
        // complete pool (always attended), in increasing position.
        int32_t* out = selected + t * topk;
        int c = 0;
        for (int i = 0; i < k; ++i) {
          for (int m = 0; m < P; ++m) out[c++] = static_cast<int32_t>(order[i] * P + m);
        }
        for (int64_t q = n * P; q <= position; ++q) out[c++] = static_cast<int32_t>(q);
        count[t] = c;
        continue;
      }
      std::copy_n(order.begin(), k, selected + t * topk);
      count[t] = k;
    }
  }
  if (!cp) return absl::OkStatus();
  const int64_t per_rank = rows_.rows * topk * 2;
  all_candidates_.resize(static_cast<size_t>(per_rank) * dcp_world_);
  if (absl::Status st = AllGather(candidates_.data(), per_rank, all_candidates_.data()); !st.ok()) {
    return st;
  }
  struct Candidate {
    float score;
    int32_t position;
  };
  std::vector<Candidate> merged;
  for (int64_t t = 0; t < rows_.rows; ++t) {
    const int64_t n = rows_.positions[t] + 1;
    if (n <= dense_window) continue;
    merged.clear();
    for (int w = 0; w < dcp_world_; ++w) {
      const float* c = all_candidates_.data() + w * per_rank + t * topk * 2;
      for (int i = 0; i < topk; ++i) {
        if (c[2 * i + 1] >= 0) merged.push_back({c[2 * i], static_cast<int32_t>(c[2 * i + 1])});
      }
    }
    const int k = static_cast<int>(std::min<int64_t>(topk, n));
    std::partial_sort(merged.begin(), merged.begin() + k, merged.end(),
                      [](const Candidate& a, const Candidate& b) {
                        return a.score > b.score || (a.score == b.score && a.position < b.position);
                      });
    for (int i = 0; i < k; ++i) selected[t * topk + i] = merged[i].position;
    std::sort(selected + t * topk, selected + t * topk + k);
    count[t] = k;
  }
  return absl::OkStatus();
}

void CpuOps::TransposeBlocks(const float* in, int64_t a, int64_t b, int64_t c, float* out) {
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) std::memcpy(out + (j * a + i) * c, in + (i * b + j) * c, c * 4);
}

void CpuOps::MergeAttention(const float* parts, const float* lse, int world, int64_t rows,
                            int heads, int head0, int local_heads, int dim, float* out) {
  const int64_t part = rows * heads;
  for (int64_t t = 0; t < rows; ++t) {
    for (int hl = 0; hl < local_heads; ++hl) {
      const int64_t th = t * heads + head0 + hl;
      float mx = -INFINITY;
      for (int w = 0; w < world; ++w) mx = std::fmax(mx, lse[w * part + th]);
      float* o = out + (t * local_heads + hl) * dim;
      std::fill_n(o, dim, 0.0f);
      float sum = 0.0f;
      // In rank order, each part weighed by its share of the softmax mass.
      for (int w = 0; w < world; ++w) {
        const float l = lse[w * part + th];
        if (l == -INFINITY) continue;
        const float e = std::exp(l - mx);
        sum += e;
        const float* p = parts + (w * part + th) * dim;
        for (int d = 0; d < dim; ++d) o[d] = std::fma(e, p[d], o[d]);
      }
      const float inv = 1.0f / sum;
      for (int d = 0; d < dim; ++d) o[d] *= inv;
    }
  }
}

void CpuOps::LayerNorm(const float* x, absl::Span<const float> w, absl::Span<const float> b,
                       int dim, float eps, float* out, int rows) {
  for (int t = 0; t < rows; ++t) {
    const float* xr = x + int64_t{t} * dim;
    float* o = out + int64_t{t} * dim;
    float mean = 0.0f;
    for (int j = 0; j < dim; ++j) mean += xr[j];
    mean /= static_cast<float>(dim);
    float var = 0.0f;
    for (int j = 0; j < dim; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int j = 0; j < dim; ++j) o[j] = (xr[j] - mean) * inv * w[j] + b[j];
  }
}

void CpuOps::MoeRoute(const float* logits, int rows, const MoeConfig& moe,
                      absl::Span<const float> bias, int32_t* experts, float* weights) {
  const int E = moe.n_routed, k = moe.experts_per_token;
  const int group_size = E / moe.n_group;
  std::vector<float> scores(E), choice(E), group_score(moe.n_group);
  std::vector<int> order(E), groups(moe.n_group);
  // Best first, ties to the lower index: a total order, so the choice is a
  // function of this row's logits alone.
  auto by = [](const std::vector<float>& v) {
    return [&v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  for (int t = 0; t < rows; ++t) {
    const float* lg = logits + int64_t{t} * E;
    if (moe.sigmoid_scoring) {
      for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-lg[e]));
    } else {
      float mx = -INFINITY, sum = 0.0f;
      for (int e = 0; e < E; ++e) mx = std::fmax(mx, lg[e]);
      for (int e = 0; e < E; ++e) sum += (scores[e] = std::exp(lg[e] - mx));
      for (int e = 0; e < E; ++e) scores[e] /= sum;
    }
    for (int e = 0; e < E; ++e) choice[e] = bias.empty() ? scores[e] : scores[e] + bias[e];
    if (moe.n_group > 1) {
      // noaux_tc ranks a group by its two best biased scores, the greedy
      // methods by its best one; the groups left out cannot be chosen.
      for (int g = 0; g < moe.n_group; ++g) {
        const float* v = choice.data() + g * group_size;
        float best = -INFINITY, second = -INFINITY;
        for (int i = 0; i < group_size; ++i) {
          if (v[i] > best) {
            second = best;
            best = v[i];
          } else if (v[i] > second) {
            second = v[i];
          }
        }
        group_score[g] = moe.correction_bias ? best + second : best;
      }
      std::iota(groups.begin(), groups.end(), 0);
      std::partial_sort(groups.begin(), groups.begin() + moe.topk_group, groups.end(),
                        by(group_score));
      std::vector<bool> kept(moe.n_group, false);
      for (int i = 0; i < moe.topk_group; ++i) kept[groups[i]] = true;
      for (int e = 0; e < E; ++e) {
        if (!kept[e / group_size]) choice[e] = -INFINITY;
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), by(choice));
    float sum = 0.0f;
    for (int s = 0; s < k; ++s) {
      experts[int64_t{t} * k + s] = order[s];
      weights[int64_t{t} * k + s] = scores[order[s]];
      sum += scores[order[s]];
    }
    for (int s = 0; s < k; ++s) {
      float& w = weights[int64_t{t} * k + s];
      if (moe.norm_topk_prob) w = w / (sum + 1e-20f);
      w = w * moe.routed_scaling;
    }
  }
}

void CpuOps::ScatterRows(const float* x, int64_t dim, absl::Span<const int64_t> rows, float* out) {
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(out + rows[r] * dim, x + r * dim, dim * sizeof(float));
  }
}

void CpuOps::WeightedRowSum(const float* y, const float* weights, int k, int64_t rows, int64_t dim,
                            float* out) {
  pool_->ParallelFor(rows, [&](int64_t t, int) {
    float* o = out + t * dim;
    std::fill(o, o + dim, 0.0f);
    for (int s = 0; s < k; ++s) {
      const float w = weights[t * k + s];
      if (w == 0.0f) continue;
      const float* ys = y + (t * k + s) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = o[d] + w * ys[d];
    }
  });
}

void CpuOps::SiluMul(float* gate, const float* up, int64_t rows, int64_t cols, float limit) {
  // Tasks of 16 rows: the split only decides which thread computes an
  // element, never its value.
  const int64_t T = rows, I = cols;
  const int64_t row_tasks = (T + 15) / 16;
  pool_->ParallelFor(row_tasks, [&](int64_t task, int) {
    const int64_t end = std::min(T, task * 16 + 16) * I;
    if (limit > 0.0f) {
      for (int64_t i = task * 16 * I; i < end; ++i) {
        const float g = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * u;
      }
      return;
    }
    for (int64_t i = task * 16 * I; i < end; ++i) {
      const float g = gate[i];
      gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
    }
  });
}

void CpuOps::Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
}

void CpuOps::Upload(const float* host, int64_t n, float* dst) {
  std::memcpy(dst, host, static_cast<size_t>(n) * sizeof(float));
}

void CpuOps::Download(const float* src, int64_t n, float* host) {
  std::memcpy(host, src, static_cast<size_t>(n) * sizeof(float));
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
