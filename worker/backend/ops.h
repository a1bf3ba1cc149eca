// The operations a compute backend provides to a model graph
// (worker/graph/): one forward pass is written once over these, and each
// backend implements them with its own kernels (backend/cpu/cpu_ops.h).
//
// An op works on whole rounds: every call covers all rows of the round (or
// all selected rows), so the virtual dispatch costs one call per op and layer,
// never one per row. Activations are float buffers in the backend's memory,
// handed out by Scratch(); on the CPU that is host memory, and the graph reads
// its logits from there directly. Weights are the model's Matrix views in
// their stored dtype.
//
// Results must not depend on which other rows share a round (batch
// invariance); each implementation documents how it keeps that.
//
// Driven by the backend's step thread only; not thread-safe.
#ifndef RINGLANE_WORKER_BACKEND_OPS_H_
#define RINGLANE_WORKER_BACKEND_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/model/model.h"
#include "worker/round.h"

namespace ringlane::worker {

// The rows of one round as every op of that round sees them: the new tokens
// of all sequences, back to back in sequence order. The arrays belong to the
// graph and stay valid until the round ends.
struct RoundRows {
  const RoundInput* round = nullptr;
  int64_t rows = 0;
  const int32_t* tokens = nullptr;     // [rows]
  const int64_t* positions = nullptr;  // [rows] absolute position of each row
  const int* row_seq = nullptr;        // [rows] index of the row's sequence
  const int64_t* seq_row0 = nullptr;   // [seqs] first row of each sequence
};

// One output of a matmul that shares its input with others (Q/K/V, gate/up).
struct MatMulTarget {
  const Matrix* w;
  float* y;  // [rows][ldy]
  int64_t ldy;
};

// Which query and KV heads this rank attends with. Local query head h uses
// local KV head (head0 + h) / group - kv_head0.
struct AttentionHeads {
  int heads = 0;     // local query heads
  int kv_heads = 0;  // local KV heads
  int head_dim = 0;
  int head0 = 0;     // global index of local query head 0
  int kv_head0 = 0;  // global index of local KV head 0
  int group = 1;     // query heads per KV head in the whole model
};

// Absorbed multi-head latent attention over a latent cache (StoreLatent):
// row t's local head h scores context position j as
//   scale * (q_lat[t][h] . c_j + q_pe(t, h) . pe_j)
// and its output is the probability-weighted sum of the latents c_j.
struct LatentHeads {
  int heads = 0;       // local heads
  int latent_dim = 0;  // kv_lora_rank
  int rope_dim = 0;
  float scale = 0.0f;
  // q_pe(t, h) is rope_dim floats at q_pe + t * pe_ld + h * pe_stride.
  int64_t pe_ld = 0;
  int64_t pe_stride = 0;
  // Decode context parallel (context_parallel() > 1): `heads` is every head
  // of the model, the attention covers this rank's positions only, and each
  // (row t, head h)'s log-sum-exp goes to lse[t * heads + h] (-inf where the
  // rank holds none of the row's positions, with a zero output) for
  // MergeAttention.
  float* lse = nullptr;
};

// One part of a latent cache row: `dim` floats of round row t at p + t * ld,
// or zeros when p is null.
struct LatentPart {
  const float* p = nullptr;
  int64_t ld = 0;
  int dim = 0;
};

// The DSA indexer's query side in one layer: row t's `heads` query heads of
// head_dim floats at q + t * ldq + h * head_dim and their weights at
// w + t * ldw + h. The keys are head_dim floats at key_offset of each cached
// latent row (StoreLatent).
struct IndexerQuery {
  const float* q = nullptr;
  int64_t ldq = 0;
  const float* w = nullptr;
  int64_t ldw = 0;
  int heads = 0;
  int head_dim = 0;
  int key_offset = 0;
  float weight_scale = 1.0f;  // multiplies every w
  // Pooled (IndexerConfig::kpool > 1): the cached rows hold each position's
  // gate scores right after its key (head_dim floats), `ape` is the
  // [kpool][head_dim] offsets, and `pools` complete pools are chosen.
  int kpool = 1;
  const float* ape = nullptr;
  int pools = 0;
};

// Which positions each row attends to (IndexerSelect's output): row t with
// count[t] > 0 attends to selected[t * topk .. + count[t]], in increasing
// position; count[t] == 0: to its whole causal context.
struct LatentSelection {
  const int32_t* selected = nullptr;
  const int32_t* count = nullptr;
  int topk = 0;
};

// A linear-attention (KDA) layer's per-row inputs for KdaMix, rows of the
// round in order: the q, k and v projections before their convolutions
// ([rows][heads * head_dim] each, row stride ld), the gate's low-rank output
// f_b(f_a(x)) before dt_bias (same shape, stride ld_gate) and b_proj(x)
// before its sigmoid ([rows][heads], stride ld_beta).
struct KdaInput {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ld = 0;
  const float* gate = nullptr;
  int64_t ld_gate = 0;
  const float* beta = nullptr;
  int64_t ld_beta = 0;
  const KdaWeights* w = nullptr;
  const LinearAttentionConfig* config = nullptr;
};

// One hyper-connection's split of its mixes (HyperConfig, HyperWeights):
// `scale` and `base` are the tensor's; `head` is the output head's (its
// mixes are `mult` stream weights only).
struct HyperArgs {
  int mult = 1;
  int64_t dim = 0;  // the hidden size: each stream's width
  int sinkhorn_iters = 20;
  float eps = 1e-6f;
  absl::Span<const float> scale;
  absl::Span<const float> base;
  bool head = false;
  // The head of a checkpoint without hc_head tensors (GLM-5.3-Flash's): the
  // plain mean of the streams; `mixes`, `scale` and `base` are not read.
  bool mean = false;
};

class ComputeOps {
 public:
  virtual ~ComputeOps() = default;

  // A buffer of at least `floats` floats for `slot` (a small number the graph
  // picks). The same slot returns the same memory, contents kept, while it is
  // large enough, so a graph keeps its buffers between rounds without
  // reallocating; a larger request may move that slot's buffer, never another's.
  virtual float* Scratch(int slot, int64_t floats) = 0;

  // Starts a round: the rows every later op of the round refers to.
  virtual void BeginRound(const RoundRows& rows) = 0;

  // RoPE angles position * inv_freq[i] of the round's rows, kept for Rope().
  virtual void PrepareRope(absl::Span<const float> inv_freq) = 0;
  // Rotates `heads` heads of `head_dim` in each of the round's rows of x
  // (row stride ld) by the angles of PrepareRope.
  virtual void Rope(float* x, int64_t ld, int heads, int head_dim, RopeLayout layout) = 0;

  // out[t] = the embedding row of token t of the round. Vocabulary-parallel:
  // `table` holds token ids [vocab0, vocab0 + vocab); other ids give zeros,
  // so the sum over the group is the whole row.
  virtual void Embed(const Matrix& table, int vocab0, int vocab, float* out) = 0;

  // out[r] = x[rows[r]] for r < rows.size(), rows of `dim` floats.
  virtual void SelectRows(const float* x, int64_t dim, absl::Span<const int64_t> rows,
                          float* out) = 0;

  // out[t] = w * x[t] / rms(x[t]) over `dim` floats, for rows t < rows.
  virtual void RmsNorm(const float* x, absl::Span<const float> w, int dim, float eps, float* out,
                       int rows) = 0;

  // y[m] = w x[m] for m < rows, in w's stored dtype with its scales.
  virtual void MatMul(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
                      int64_t ldy) = 0;
  // Several matrices applied to the same x, as one op.
  virtual void MatMulShared(absl::Span<const MatMulTarget> targets, const float* x, int64_t ldx,
                            int rows) = 0;

  // Writes K and V of the round's rows (k, v: [rows][ld], the local KV heads
  // side by side) into their slots of `layer` in the paged cache.
  virtual void StorePagedKv(int layer, const float* k, const float* v, int64_t ld) = 0;
  // Causal attention of every row's query heads over its sequence's context in
  // the paged cache of `layer`, this round's rows included (store them first).
  // q and out: [rows][ld].
  virtual void AttendPaged(int layer, const AttentionHeads& heads, const float* q, float* out,
                           int64_t ld) = 0;

  // y[m] = w^T x[m] for m < rows (x rows of w.rows floats, y rows of w.cols):
  // each output sums over w's rows in increasing order, whatever `rows` is.
  virtual void MatMulTransposed(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
                                int64_t ldy) = 0;

  // Writes each row's cache row of `layer` in a latent cache: the parts side
  // by side (the latent, its RoPE key, the indexer's key), into its slot.
  virtual void StoreLatent(int layer, absl::Span<const LatentPart> parts) = 0;
  // Causal latent attention (LatentHeads) of every row over its sequence's
  // context in the latent cache of `layer`, this round's rows included, or
  // over the positions `selection` picks for it (null: all). q_lat and out:
  // [rows][heads][latent_dim].
  virtual void AttendLatent(int layer, const LatentHeads& heads, const float* q_lat,
                            const float* q_pe, const LatentSelection* selection, float* out) = 0;
  // The DSA indexer: each row with more than dense_window positions in its
  // context (itself included) gets the topk positions j with the highest
  // score sum_h weight_scale * w_h * relu(q_h . k_j), ties to the lower
  // position, in increasing order in selected[t * topk ..], and count[t] =
  // topk; other rows count[t] = 0. Keys are read from the cache of `layer`.
  virtual absl::Status IndexerSelect(int layer, const IndexerQuery& query, int dense_window,
                                     int topk, int32_t* selected, int32_t* count) = 0;
  // out[t] = (x[t] - mean) / sqrt(var + eps) * w + b over `dim` floats.
  virtual void LayerNorm(const float* x, absl::Span<const float> w, absl::Span<const float> b,
                         int dim, float eps, float* out, int rows) = 0;

  // MoE routing of each row from its router logits ([rows][n_routed]) as
  // `moe` says (scores, correction bias for the choice, group-limited top-k,
  // normalisation, scaling): experts[t * k + s] and weights[t * k + s] for its
  // k = experts_per_token choices, best first (ties to the lower expert).
  virtual void MoeRoute(const float* logits, int rows, const MoeConfig& moe,
                        absl::Span<const float> correction_bias, int32_t* experts,
                        float* weights) = 0;
  // out[rows[r]] = x[r] for r < rows.size(), rows of `dim` floats.
  virtual void ScatterRows(const float* x, int64_t dim, absl::Span<const int64_t> rows,
                           float* out) = 0;
  // out[t] = sum over s < k, in increasing s, of weights[t * k + s] * y[t * k + s],
  // rows of `dim` floats, for t < rows; a slot of weight 0 is not read (an
  // expert-parallel rank leaves other ranks' choices unwritten).
  virtual void WeightedRowSum(const float* y, const float* weights, int k, int64_t rows,
                              int64_t dim, float* out) = 0;

  // Kimi Delta Attention over each sequence's recurrent state in `layer`
  // (SeqStep::state_slot; reset at start_position 0): per row in position
  // order, the causal convolutions and SiLU, L2-normalised q and k, the
  // per-channel decay and the gated delta rule per head; out[t] ([rows][heads *
  // head_dim]) is each head's S_t^T q_t / sqrt(head_dim). The state then holds
  // the sequence's last row. Every row is computed by the same recurrence,
  // so a token's output does not depend on how its prompt was split into
  // rounds or what else shares them.
  virtual void KdaMix(int layer, const KdaInput& in, float* out) = 0;
  // x[t][h] = rmsnorm(x[t][h]) * w * sigmoid(gate[t][h]) for each of `heads`
  // heads of `dim` floats in rows t < rows (KDA's gated output norm).
  virtual void GatedRmsNorm(float* x, const float* gate, absl::Span<const float> w, int heads,
                            int dim, float eps, int rows) = 0;

  // gate = silu(gate) * up, elementwise over [rows][cols]; with limit > 0
  // the clamped SwiGLU silu(min(gate, limit)) * clamp(up, -limit, limit).
  virtual void SiluMul(float* gate, const float* up, int64_t rows, int64_t cols,
                       float limit = 0.0f) = 0;
  // x = x + y over n floats (the residual stream).
  virtual void Add(float* x, const float* y, int64_t n) = 0;
  // Hyper-connections: a row's `mult` streams ([rows][mult * dim], stream h
  // at h * dim) start as copies of its x row ([rows][dim]).
  virtual void HyperExpand(const float* x, int mult, int64_t dim, int rows, float* streams) = 0;
  // From each row's mixes ([rows][ld_mixes]: the projection of its RMS-normed
  // streams) the stream weights pre = sigmoid(mix * scale[0] + base) + eps
  // and y = sum_h pre_h * stream_h ([rows][dim]); unless `head`, also the
  // output weights post = 2 sigmoid(...) and the mixing matrix (a row-wise
  // softmax + eps, then column and row normalisations, Sinkhorn) into coeffs
  // ([rows][mult + mult * mult]: post, then comb[a][b] row-major).
  virtual void HyperPre(const HyperArgs& a, const float* streams, const float* mixes,
                        int64_t ld_mixes, int rows, float* y, float* coeffs) = 0;
  // streams[b] = post_b * o + sum_a comb[a][b] * streams[a] for each row
  // (o: [rows][dim], the sub-block's output).
  virtual void HyperPost(const float* o, const float* coeffs, int mult, int64_t dim, int rows,
                         float* streams) = 0;
  // Decode context parallel: the group's ranks each keep the latent rows of
  // positions p with p % context_parallel() == context_rank(), so the KV
  // pool holds context_parallel() times the positions; StoreLatent,
  // AttendLatent and IndexerSelect work on those (IndexerSelect merging the
  // ranks' choices into the one the whole context gives). 1: off.
  virtual int context_parallel() const = 0;
  virtual int context_rank() const = 0;
  // out[b][a][c] = in[a][b][c] (an all-gather's [rank][row] into [row][rank]).
  virtual void TransposeBlocks(const float* in, int64_t a, int64_t b, int64_t c, float* out) = 0;
  // Combines attention computed over the ranks' parts of a context:
  // parts [world][rows][heads][dim] with their log-sum-exps
  // [world][rows][heads], into out [rows][local_heads][dim] for heads
  // head0 .. head0 + local_heads - 1, summing in rank order.
  virtual void MergeAttention(const float* parts, const float* lse, int world, int64_t rows,
                              int heads, int head0, int local_heads, int dim, float* out) = 0;
  // Host memory into a buffer of the backend's, and back (MTP hidden
  // states in and out of a round).
  virtual void Upload(const float* host, int64_t n, float* dst) = 0;
  virtual void Download(const float* src, int64_t n, float* host) = 0;

  // The tensor-parallel group: its size (1 without one), the all-reduce that
  // sums a row-parallel layer's partial outputs, and the all-gather of the
  // vocabulary-parallel head (out[r * count + i] = rank r's in[i]). Both
  // return the communicator's error (Unavailable: the group is unusable).
  virtual int group_size() const = 0;
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  virtual absl::Status AllGather(const float* in, int64_t count, float* out) = 0;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_BACKEND_OPS_H_
