#include "worker/graph/llama.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_ops.h"
#include "worker/kv_cache.h"
#include "worker/model/shard.h"
#include "worker/testing/models.h"
#include "worker/thread_pool.h"

namespace ringlane::worker {
namespace {

// CpuOps with a count of each op the graph calls and a fake group: it claims
// `group_size` ranks, leaves the data of its collectives as they are (a group
// whose other ranks add zeros) and fails the all-reduce numbered `fail_at`.
class CountingOps final : public ComputeOps {
 public:
  CountingOps(ThreadPool* pool, KvCache* kv, int group_size, int fail_at = -1)
      : real_(pool, cpu::Isa::kScalar, nullptr), group_size_(group_size), fail_at_(fail_at) {
    real_.set_kv_cache(kv);
  }

  std::map<std::string, int> calls;

  float* Scratch(int slot, int64_t floats) override { return real_.Scratch(slot, floats); }
  void BeginRound(const RoundRows& rows) override {
    ++calls["BeginRound"];
    real_.BeginRound(rows);
  }
  void PrepareRope(absl::Span<const float> inv_freq) override { real_.PrepareRope(inv_freq); }
  void Rope(float* x, int64_t ld, int heads, int head_dim, RopeLayout layout) override {
    ++calls["Rope"];
    real_.Rope(x, ld, heads, head_dim, layout);
  }
  void Embed(const Matrix& table, int vocab0, int vocab, float* out) override {
    ++calls["Embed"];
    real_.Embed(table, vocab0, vocab, out);
  }
  void SelectRows(const float* x, int64_t dim, absl::Span<const int64_t> rows,
                  float* out) override {
    real_.SelectRows(x, dim, rows, out);
  }
  void RmsNorm(const float* x, absl::Span<const float> w, int dim, float eps, float* out,
               int rows) override {
    ++calls["RmsNorm"];
    real_.RmsNorm(x, w, dim, eps, out, rows);
  }
  void MatMul(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
              int64_t ldy) override {
    ++calls["MatMul"];
    real_.MatMul(w, x, ldx, rows, y, ldy);
  }
  void MatMulShared(absl::Span<const MatMulTarget> targets, const float* x, int64_t ldx,
                    int rows) override {
    ++calls["MatMulShared"];
    real_.MatMulShared(targets, x, ldx, rows);
  }
  void StorePagedKv(int layer, const float* k, const float* v, int64_t ld) override {
    ++calls["StorePagedKv"];
    real_.StorePagedKv(layer, k, v, ld);
  }
  void AttendPaged(int layer, const AttentionHeads& heads, const float* q, float* out,
                   int64_t ld) override {
    ++calls["AttendPaged"];
    real_.AttendPaged(layer, heads, q, out, ld);
  }
  void MatMulTransposed(const Matrix& w, const float* x, int64_t ldx, int rows, float* y,
                        int64_t ldy) override {
    ++calls["MatMulTransposed"];
    real_.MatMulTransposed(w, x, ldx, rows, y, ldy);
  }
  void StoreLatent(int layer, absl::Span<const LatentPart> parts) override {
    ++calls["StoreLatent"];
    real_.StoreLatent(layer, parts);
  }
  void AttendLatent(int layer, const LatentHeads& heads, const float* q_lat, const float* q_pe,
                    const LatentSelection* selection, float* out) override {
    ++calls["AttendLatent"];
    real_.AttendLatent(layer, heads, q_lat, q_pe, selection, out);
  }
  absl::Status IndexerSelect(int layer, const IndexerQuery& query, int dense_window, int topk,
                             int32_t* selected, int32_t* count) override {
    ++calls["IndexerSelect"];
    return real_.IndexerSelect(layer, query, dense_window, topk, selected, count);
  }
  int context_parallel() const override { return real_.context_parallel(); }
  int context_rank() const override { return real_.context_rank(); }
  void TransposeBlocks(const float* in, int64_t a, int64_t b, int64_t c, float* out) override {
    ++calls["TransposeBlocks"];
    real_.TransposeBlocks(in, a, b, c, out);
  }
  void MergeAttention(const float* parts, const float* lse, int world, int64_t rows, int heads,
                      int head0, int local_heads, int dim, float* out) override {
    ++calls["MergeAttention"];
    real_.MergeAttention(parts, lse, world, rows, heads, head0, local_heads, dim, out);
  }
  void LayerNorm(const float* x, absl::Span<const float> w, absl::Span<const float> b, int dim,
                 float eps, float* out, int rows) override {
    ++calls["LayerNorm"];
    real_.LayerNorm(x, w, b, dim, eps, out, rows);
  }
  void MoeRoute(const float* logits, int rows, const MoeConfig& moe, absl::Span<const float> bias,
                int32_t* experts, float* weights) override {
    ++calls["MoeRoute"];
    real_.MoeRoute(logits, rows, moe, bias, experts, weights);
  }
  void ScatterRows(const float* x, int64_t dim, absl::Span<const int64_t> rows,
                   float* out) override {
    real_.ScatterRows(x, dim, rows, out);
  }
  void WeightedRowSum(const float* y, const float* weights, int k, int64_t rows, int64_t dim,
                      float* out) override {
    ++calls["WeightedRowSum"];
    real_.WeightedRowSum(y, weights, k, rows, dim, out);
  }
  void KdaMix(int layer, const KdaInput& in, float* out) override {
    ++calls["KdaMix"];
    real_.KdaMix(layer, in, out);
  }
  void GatedRmsNorm(float* x, const float* gate, absl::Span<const float> w, int heads, int dim,
                    float eps, int rows) override {
    ++calls["GatedRmsNorm"];
    real_.GatedRmsNorm(x, gate, w, heads, dim, eps, rows);
  }
  void SiluMul(float* gate, const float* up, int64_t rows, int64_t cols, float limit) override {
    ++calls["SiluMul"];
    real_.SiluMul(gate, up, rows, cols, limit);
  }
  void Add(float* x, const float* y, int64_t n) override {
    ++calls["Add"];
    real_.Add(x, y, n);
  }
  void HyperExpand(const float* x, int mult, int64_t dim, int rows, float* streams) override {
    ++calls["HyperExpand"];
    real_.HyperExpand(x, mult, dim, rows, streams);
  }
  void HyperPre(const HyperArgs& a, const float* streams, const float* mixes, int64_t ld_mixes,
                int rows, float* y, float* coeffs) override {
    ++calls["HyperPre"];
    real_.HyperPre(a, streams, mixes, ld_mixes, rows, y, coeffs);
  }
  void HyperPost(const float* o, const float* coeffs, int mult, int64_t dim, int rows,
                 float* streams) override {
    ++calls["HyperPost"];
    real_.HyperPost(o, coeffs, mult, dim, rows, streams);
  }
  void Upload(const float* host, int64_t n, float* dst) override {
    ++calls["Upload"];
    real_.Upload(host, n, dst);
  }
  void Download(const float* src, int64_t n, float* host) override {
    ++calls["Download"];
    real_.Download(src, n, host);
  }
  int group_size() const override { return group_size_; }
  absl::Status AllReduceSum(float*, int64_t) override {
    if (calls["AllReduceSum"]++ == fail_at_) return absl::UnavailableError("peer gone");
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* in, int64_t count, float* out) override {
    ++calls["AllGather"];
    // Every rank's part is this one's.
    for (int r = 0; r < group_size_; ++r) std::copy_n(in, count, out + r * count);
    return absl::OkStatus();
  }

 private:
  cpu::CpuOps real_;
  const int group_size_;
  const int fail_at_;
};

RoundInput TwoSequences() {
  RoundInput in;
  SeqStep a;
  a.tokens = {1, 20, 30, 40, 50};
  a.block_ids = {0, 1};
  a.logit_offsets = {4};
  SeqStep b;
  b.tokens = {1, 7};
  b.block_ids = {2};
  b.logit_offsets = {0, 1};
  in.seqs = {a, b};
  return in;
}

TEST(LlamaGraph, EveryLayerKeepsPagedKvOfTheRanksHeads) {
  auto full = BundledStories();
  auto shard = ShardModel(full, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (const auto& m : {full, *shard}) {
    const std::vector<LayerCacheSpec> caches = LlamaGraph(m).LayerCaches();
    ASSERT_EQ(static_cast<int>(caches.size()), m->config.layers);
    for (const LayerCacheSpec& c : caches) {
      EXPECT_EQ(c.kind, CacheKind::kPagedKv);
      EXPECT_EQ(c.kv_heads, m->shard.kv_heads);
      EXPECT_EQ(c.head_dim, m->config.head_dim);
    }
  }
}

// The graph over CpuOps is the CPU backend's forward pass, bit for bit, one
// call per op and layer whatever the number of rows.
TEST(LlamaGraph, OverCpuOpsMatchesTheBackendWithOneCallPerOp) {
  auto model = BundledStories();
  const ModelConfig& c = model->config;
  const KvPoolSpec spec{4, 4, DType::kF32};
  auto kv = KvCache::Create(c.layers, c.kv_heads, c.head_dim, spec);
  ASSERT_TRUE(kv.ok()) << kv.status();
  ThreadPool pool(2);
  CountingOps ops(&pool, kv->get(), 1);
  LlamaGraph graph(model);
  auto got = graph.Forward(TwoSequences(), &ops);
  ASSERT_TRUE(got.ok()) << got.status();

  CpuBackendOptions o;
  o.force_scalar = true;
  absl::StatusOr<std::unique_ptr<Backend>> made = CreateCpuBackend(model, o);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Backend>& backend = *made;
  ASSERT_TRUE(backend->AllocateKvPool(spec).ok());
  auto want = backend->Step(TwoSequences());
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->logits.size(), 2u);
  EXPECT_EQ(got->logits, want->logits);

  const int L = c.layers;
  EXPECT_EQ(ops.calls["BeginRound"], 1);
  EXPECT_EQ(ops.calls["Embed"], 1);
  EXPECT_EQ(ops.calls["RmsNorm"], 2 * L + 1);
  EXPECT_EQ(ops.calls["MatMulShared"], 2 * L);
  EXPECT_EQ(ops.calls["MatMul"], 2 * L + 1);
  EXPECT_EQ(ops.calls["Rope"], 2 * L);
  EXPECT_EQ(ops.calls["StorePagedKv"], L);
  EXPECT_EQ(ops.calls["AttendPaged"], L);
  EXPECT_EQ(ops.calls["SiluMul"], L);
  EXPECT_EQ(ops.calls["Add"], 2 * L);
  EXPECT_EQ(ops.calls["AllReduceSum"], 0);
  EXPECT_EQ(ops.calls["AllGather"], 0);
}

// A shard meets its group after the embedding, after each row-parallel
// projection and at the head; a failed collective ends the round with the
// communicator's error.
TEST(LlamaGraph, ShardReducesAtEachRowParallelLayerAndStopsOnFailure) {
  auto shard = ShardModel(BundledStories(), 0, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const ModelConfig& c = (*shard)->config;
  auto kv = KvCache::Create(c.layers, (*shard)->shard.kv_heads, c.head_dim, {4, 4, DType::kF32});
  ASSERT_TRUE(kv.ok()) << kv.status();
  ThreadPool pool(1);
  LlamaGraph graph(*shard);

  CountingOps ok_ops(&pool, kv->get(), 2);
  auto out = graph.Forward(TwoSequences(), &ok_ops);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(ok_ops.calls["AllReduceSum"], 1 + 2 * c.layers);
  EXPECT_EQ(ok_ops.calls["AllGather"], 1);
  ASSERT_EQ(out->logits.size(), 2u);
  EXPECT_EQ(out->logits[1].size(), 2u * c.vocab);

  CountingOps failing(&pool, kv->get(), 2, /*fail_at=*/2);
  EXPECT_EQ(graph.Forward(TwoSequences(), &failing).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(failing.calls["AllReduceSum"], 3);
  EXPECT_EQ(failing.calls["AllGather"], 0);
}

}  // namespace
}  // namespace ringlane::worker
