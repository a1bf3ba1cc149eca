// The CPU implementation of ComputeOps: the kernels of kernels.h on the
// backend's thread pool, the paged KV pool of kv_cache.h, and the group's
// Communicator. Each op is the same sequence of kernel calls, in the same
// order and with the same float expressions, as the forward pass had before
// it was split from the backend; the build's -ffp-contract=off keeps those
// expressions rounding alike wherever they are compiled.
//
// Owned by CpuBackend and driven by its step thread; not thread-safe. Ops
// fan out over the pool internally and return when every task is done.
#ifndef RINGLANE_WORKER_BACKEND_CPU_CPU_OPS_H_
#define RINGLANE_WORKER_BACKEND_CPU_CPU_OPS_H_

#include <cstdint>
#include <vector>

#include "worker/aligned.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/backend/ops.h"
#include "worker/collectives/communicator.h"
#include "worker/kv_cache.h"
#include "worker/thread_pool.h"

namespace ringlane::worker::cpu {

class CpuOps final : public ComputeOps {
 public:
  // `pool` and `comm` are borrowed and must outlive this; `comm` is null when
  // the model is not sharded.
  CpuOps(ThreadPool* pool, Isa isa, Communicator* comm) : pool_(pool), isa_(isa), comm_(comm) {}

  // The pool the attention ops read and write (borrowed; null until the
  // backend allocates one).
  void set_kv_cache(KvCache* kv) { kv_ = kv; }
  // The recurrent states KdaMix reads and writes (borrowed; null until the
  // backend allocates them): slot s's state of layer l at data + s *
  // slot_floats + layer_offset[l] (-1 for a layer without one).
  void set_state_pool(float* data, int64_t slot_floats, std::vector<int64_t> layer_offset,
                      float* checkpoints) {
    state_ = data;
    state_slot_floats_ = slot_floats;
    state_offset_ = std::move(layer_offset);
    checkpoints_ = checkpoints;
  }
  // Decode context parallel over the group (ComputeOps::context_parallel).
  void set_context_parallel(int rank, int world) {
    dcp_rank_ = rank;
    dcp_world_ = world;
  }

  float* Scratch(int slot, int64_t floats) override;
  void BeginRound(const RoundRows& rows) override;
  void PrepareRope(absl::Span<const float> inv_freq) override;
  void Rope(float* x, int64_t ld, int heads, int head_dim, RopeLayout layout) override;
  void Embed(const Matrix& table, int vocab0, int vocab, float* out) override;
  void SelectRows(const float* x, int64_t dim, absl::Span<const int64_t> rows, float* out) override;
  void RmsNorm(const float* x, absl::Span<const float> w, int dim, float eps, float* out,
               int rows) override;
  void MatMul(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
              int64_t ldy) override;
  void MatMulShared(absl::Span<const MatMulTarget> targets, const float* x, int64_t ldx,
                    int rows) override;
  void StorePagedKv(int layer, const float* k, const float* v, int64_t ld) override;
  void AttendPaged(int layer, const AttentionHeads& heads, const float* q, float* out,
                   int64_t ld) override;
  void MatMulTransposed(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
                        int64_t ldy) override;
  void StoreLatent(int layer, absl::Span<const LatentPart> parts) override;
  void AttendLatent(int layer, const LatentHeads& heads, const float* q_lat, const float* q_pe,
                    const LatentSelection* selection, float* out) override;
  absl::Status IndexerSelect(int layer, const IndexerQuery& query, int dense_window, int topk,
                             int32_t* selected, int32_t* count) override;
  void LayerNorm(const float* x, absl::Span<const float> w, absl::Span<const float> b, int dim,
                 float eps, float* out, int rows) override;
  void MoeRoute(const float* logits, int rows, const MoeConfig& moe,
                absl::Span<const float> correction_bias, int32_t* experts, float* weights) override;
  void ScatterRows(const float* x, int64_t dim, absl::Span<const int64_t> rows,
                   float* out) override;
  void WeightedRowSum(const float* y, const float* weights, int k, int64_t rows, int64_t dim,
                      float* out) override;
  void KdaMix(int layer, const KdaInput& in, float* out) override;
  void GatedRmsNorm(float* x, const float* gate, absl::Span<const float> w, int heads, int dim,
                    float eps, int rows) override;
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t cols,
               float limit = 0.0f) override;
  void Add(float* x, const float* y, int64_t n) override;
  void HyperExpand(const float* x, int mult, int64_t dim, int rows, float* streams) override;
  void HyperPre(const HyperArgs& a, const float* streams, const float* mixes, int64_t ld_mixes,
                int rows, float* y, float* coeffs) override;
  void HyperPost(const float* o, const float* coeffs, int mult, int64_t dim, int rows,
                 float* streams) override;
  int context_parallel() const override { return dcp_world_; }
  int context_rank() const override { return dcp_rank_; }
  void TransposeBlocks(const float* in, int64_t a, int64_t b, int64_t c, float* out) override;
  void MergeAttention(const float* parts, const float* lse, int world, int64_t rows, int heads,
                      int head0, int local_heads, int dim, float* out) override;
  void Upload(const float* host, int64_t n, float* dst) override;
  void Download(const float* src, int64_t n, float* host) override;
  int group_size() const override { return comm_ == nullptr ? 1 : comm_->world_size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* in, int64_t count, float* out) override;

 private:
  // A tile source's context over the first n positions of a sequence's
  // blocks of `layer` (AttendPaged sets the head, AttendLatent the columns).
  PagedKv PagedContext(const SeqStep& seq, int64_t n, int layer) const;
  // Whether `rows` query rows of a sequence, with values of v_dim floats,
  // read their context through tiles (AttendArgs::source) rather than one
  // float copy: a few rows on a vector path, values wider than the narrow
  // ones AttendHeads would copy whole anyway.
  bool ReadsTiles(int rows, int v_dim) const;

  ThreadPool* const pool_;
  const Isa isa_;
  Communicator* const comm_;
  KvCache* kv_ = nullptr;
  float* state_ = nullptr;
  float* checkpoints_ = nullptr;  // [checkpoints][slot_floats], laid out as a slot
  int64_t state_slot_floats_ = 0;
  std::vector<int64_t> state_offset_;
  int dcp_rank_ = 0;
  int dcp_world_ = 1;
  // A context-parallel rank's local count of positions [0, p]: those with
  // q % world == rank.
  int64_t LocalCount(int64_t p) const {
    return p < dcp_rank_ ? 0 : (p - dcp_rank_) / dcp_world_ + 1;
  }
  std::vector<float> candidates_, all_candidates_;  // IndexerSelect's merge

  RoundRows rows_;                // the current round
  std::vector<float> cos_, sin_;  // [rows][half]: RoPE angles of the round's rows
  int rope_half_ = 0;             // half of the head size the angles were made for
  std::vector<AlignedFloats> scratch_;
  // Per pool thread: K, K transposed and V of one sequence's context, and the
  // attention scores of one row for each head attended together.
  std::vector<AlignedFloats> kbuf_, ktbuf_, vbuf_, scores_;
  // Per pool thread: the queries of the latent heads attended together,
  // [heads][rows][latent + rope], and a sparse row's selected keys
  // (transposed) and values.
  std::vector<AlignedFloats> qbuf_, sel_kt_, sel_v_;
  std::vector<std::vector<int64_t>> local_pos_;  // context parallel, per thread
  std::vector<std::vector<int32_t>> local_sel_;
  // Per pool thread: the heads attended together over one context.
  std::vector<std::vector<AttendArgs>> attend_args_;
  // MatMulTransposed's weights converted to float, [w.rows][w.cols].
  AlignedFloats wt_;
  std::vector<float> latent_row_;  // StoreLatent's row: latent, then rope key
  // IndexerSelect's keys of one sequence, [n][index dim] and transposed, and
  // one row's scores.
  std::vector<float> index_keys_, index_kt_, index_scores_;
  // HyperPost's copy of one row's streams before they are rewritten.
  std::vector<float> hyper_old_;
  // KdaMix's per-thread q, k, v, decay and delta of one head.
  std::vector<std::vector<float>> kda_buf_;
};

}  // namespace ringlane::worker::cpu

#endif  // RINGLANE_WORKER_BACKEND_CPU_CPU_OPS_H_
