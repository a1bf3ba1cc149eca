#include "worker/server/step_loop.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/backend/factory.h"
#include "worker/collectives/communicator.h"
#include "worker/model/model.h"
#include "worker/model/synthetic.h"

namespace ringlane::worker {
namespace {

namespace v1 = ringlane::v1;

constexpr KvPoolSpec kPool{/*num_blocks=*/8, /*block_size=*/4, DType::kF32};

// A Backend that forwards to the CPU one except that Step fails as a broken
// collective would (Unavailable), to exercise the failure path.
class FailingStepBackend final : public Backend {
 public:
  explicit FailingStepBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "failing"; }
  const ModelConfig& config() const override { return inner_->config(); }
  std::vector<LayerCacheSpec> layer_caches() const override { return inner_->layer_caches(); }
  absl::Status AllocateKvPool(const KvPoolSpec& spec) override {
    return inner_->AllocateKvPool(spec);
  }
  const KvPoolSpec& kv_pool() const override { return inner_->kv_pool(); }
  absl::StatusOr<RoundOutput> Step(const RoundInput&) override {
    return absl::UnavailableError("peer gone");
  }
  int64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  absl::Status ExportKvBlock(int32_t block, std::vector<uint8_t>* out) const override {
    return inner_->ExportKvBlock(block, out);
  }
  absl::Status ImportKvBlock(int32_t block, absl::Span<const uint8_t> data) override {
    return inner_->ImportKvBlock(block, data);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

class StepLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/step_loop_test_", ::getpid(), "_model");
    std::filesystem::remove_all(dir);
    SyntheticModelOptions o;  // the "tiny" shape
    o.out_dir = dir;
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    model_ = new std::shared_ptr<const ModelWeights>(std::move(*w));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    loop_ = std::make_unique<StepLoop>(
        /*rank=*/0,
        [this](int64_t epoch, int64_t installed) -> absl::Status {
          // Holds the step thread inside its next admission while a test
          // lines up operations behind it.
          if (hold_next_.exchange(false)) {
            held_.Notify();
            release_.WaitForNotification();
          }
          if (installed == 0) return absl::UnavailableError("not formed");
          if (epoch != 0 && epoch != installed) return absl::UnavailableError("epoch ended");
          return absl::OkStatus();
        },
        [this](const absl::Status& st) {
          failures_.fetch_add(1);
          EXPECT_TRUE(absl::IsUnavailable(st)) << st;
        });
  }

  // The step thread calls back into this fixture, so it ends first.
  void TearDown() override { loop_.reset(); }

  // `self_draft`: the model is its own draft model too (its proposals are
  // its greedy continuations).
  absl::Status Install(int64_t epoch, bool failing = false, bool self_draft = false) {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(*model_, BackendOptions{}, nullptr);
    if (!b.ok()) return b.status();
    std::unique_ptr<Backend> backend = std::move(*b);
    if (failing) backend = std::make_unique<FailingStepBackend>(std::move(backend));
    std::unique_ptr<Backend> draft;
    if (self_draft) {
      absl::StatusOr<std::unique_ptr<Backend>> d =
          CreateBackend(*model_, BackendOptions{}, nullptr);
      if (!d.ok()) return d.status();
      draft = std::move(*d);
    }
    return loop_->Install(epoch,
                          std::make_unique<TimedCommunicator>(CreateSingleRankCommunicator()),
                          std::move(backend), kPool, std::move(draft));
  }

  // A new lane's prefill of `n` tokens into block 0, sampling its last one.
  static v1::RoundPlan Prefill(uint64_t round_id, int n) {
    v1::RoundPlan plan;
    plan.set_round_id(round_id);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(7);
    row->set_start_position(0);
    for (int i = 0; i < n; ++i) row->add_token_ids(10 + i);
    row->add_block_ids(0);
    row->set_sample_last(true);
    row->mutable_sampling()->set_temperature(0);
    row->mutable_sampling()->set_seed(1);
    return plan;
  }

  std::vector<uint8_t> Export(int32_t block) {
    std::vector<uint8_t> out;
    absl::Status st = loop_->ExportBlock(block, &out, [] { return false; });
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  // Holds the step thread in the admission of an export of block 1, run from
  // a thread of its own (joined by Release()).
  void Hold() {
    hold_next_ = true;
    holder_ = std::thread([this] { Export(1); });
    held_.WaitForNotification();
  }
  void Release() {
    release_.Notify();
    holder_.join();
  }
  // Waits until `n` operations are queued behind the held one.
  void AwaitQueued(size_t n) {
    while (loop_->QueueLengthForTesting() < n) absl::SleepFor(absl::Milliseconds(1));
  }

  static std::shared_ptr<const ModelWeights>* model_;
  std::unique_ptr<StepLoop> loop_;
  std::atomic<bool> hold_next_{false};
  absl::Notification held_;
  absl::Notification release_;
  std::thread holder_;
  std::atomic<int> failures_{0};
};

std::shared_ptr<const ModelWeights>* StepLoopTest::model_ = nullptr;

TEST_F(StepLoopTest, KvMovesRunInTheOrderEnqueuedWithRounds) {
  ASSERT_TRUE(Install(1).ok());
  const std::vector<uint8_t> empty = Export(0);
  ASSERT_FALSE(empty.empty());
  // A payload unlike anything a round writes.
  std::vector<uint8_t> imported(empty.size());
  for (size_t i = 0; i < imported.size(); ++i) imported[i] = static_cast<uint8_t>(i * 7 + 3);

  Hold();
  std::unique_ptr<RoundExecutor> exec;
  absl::StatusOr<StepLoop::RoundOutcome> round;
  std::thread rounds(
      [&] { round = loop_->RunRound(1, &exec, Prefill(1, 4), std::chrono::steady_clock::now()); });
  AwaitQueued(1);
  std::vector<uint8_t> after_round;
  std::thread exporter([&] { after_round = Export(0); });
  AwaitQueued(2);
  absl::Status imported_st;
  std::thread importer(
      [&] { imported_st = loop_->ImportBlock(0, imported, [] { return false; }); });
  AwaitQueued(3);
  std::vector<uint8_t> after_import;
  std::thread exporter2([&] { after_import = Export(0); });
  AwaitQueued(4);
  Release();
  for (std::thread* t : {&rounds, &exporter, &importer, &exporter2}) t->join();

  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_TRUE(round->failure.ok()) << round->failure;
  EXPECT_FALSE(round->result.has_error()) << round->result.error().message();
  ASSERT_EQ(round->result.outputs_size(), 1);
  // The round waited behind the held export, and says so.
  EXPECT_GT(round->result.queue_time_us(), 0);
  ASSERT_NE(exec, nullptr);
  EXPECT_EQ(exec->num_lanes(), 1u);
  // The first export ran after the round: it sees the round's K/V.
  EXPECT_NE(after_round, empty);
  // The import ran after the round (else the round would have overwritten it)
  // and before the last export.
  ASSERT_TRUE(imported_st.ok()) << imported_st;
  EXPECT_EQ(after_import, imported);
}

// An imported block's draft entries are of what the block held before: a
// lane that reuses the imported block gets the proposal of a lane that fed
// the same tokens itself, not one read from the old entries.
TEST_F(StepLoopTest, AnImportedBlockIsFedToTheDraftModelAgain) {
  ASSERT_TRUE(Install(1, /*failing=*/false, /*self_draft=*/true).ok());
  std::unique_ptr<RoundExecutor> exec;
  uint64_t round_id = 0;
  // A lane's first row: `tokens` after `prefix` (cached in the first
  // blocks of `blocks`), sampling and asking for `propose` drafts.
  auto first_row = [&](uint64_t lane, const std::vector<int32_t>& prefix,
                       const std::vector<int32_t>& tokens, std::vector<int32_t> blocks,
                       int propose) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(lane);
    row->set_start_position(static_cast<int64_t>(prefix.size()));
    row->mutable_prefix_token_ids()->Add(prefix.begin(), prefix.end());
    row->mutable_token_ids()->Add(tokens.begin(), tokens.end());
    row->mutable_block_ids()->Add(blocks.begin(), blocks.end());
    row->set_sample_last(true);
    row->set_propose_drafts(propose);
    row->mutable_sampling()->set_temperature(0);
    row->mutable_sampling()->set_seed(1);
    absl::StatusOr<StepLoop::RoundOutcome> r =
        loop_->RunRound(1, &exec, plan, std::chrono::steady_clock::now());
    EXPECT_TRUE(r.ok() && r->failure.ok() && !r->result.has_error());
    std::vector<int32_t> drafts;
    if (r.ok() && r->result.outputs_size() == 1) {
      drafts.assign(r->result.outputs(0).draft_token_ids().begin(),
                    r->result.outputs(0).draft_token_ids().end());
    }
    return drafts;
  };
  const std::vector<int32_t> x = {20, 21, 22, 23};
  const std::vector<int32_t> y = {30, 31, 32, 33};
  // x's KV in block 1 (never fed to the draft model), y's in block 0 with
  // a proposal (the draft's entries of block 0 are y's).
  first_row(1, {}, x, {1, 5}, 0);
  EXPECT_EQ(first_row(2, {}, y, {0, 6}, 3).size(), 3u);
  // Block 0 now holds x, as restored from a store.
  ASSERT_TRUE(loop_->ImportBlock(0, Export(1), [] { return false; }).ok());
  const std::vector<int32_t> reused = first_row(3, x, {40}, {0, 2}, 3);
  std::vector<int32_t> whole = x;
  whole.push_back(40);
  const std::vector<int32_t> fresh = first_row(4, {}, whole, {3, 4}, 3);
  ASSERT_EQ(fresh.size(), 3u);
  EXPECT_EQ(reused, fresh);
}

TEST_F(StepLoopTest, AbandonedQueuedExportNeverRuns) {
  ASSERT_TRUE(Install(1).ok());
  Hold();
  std::atomic<bool> cancel{false};
  std::vector<uint8_t> out;
  absl::Status st;
  std::thread exporter([&] { st = loop_->ExportBlock(0, &out, [&] { return cancel.load(); }); });
  AwaitQueued(1);
  cancel = true;
  exporter.join();  // returns while the step thread is still held
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  EXPECT_TRUE(out.empty());
  Release();
  EXPECT_EQ(Export(0).size(),
            static_cast<size_t>(*CpuKvBlockBytes((*model_)->config, (*model_)->shard, kPool)));
}

TEST_F(StepLoopTest, OperationsOfAnEndedEpochAreUnavailable) {
  std::unique_ptr<RoundExecutor> exec;
  const auto now = std::chrono::steady_clock::now();
  EXPECT_TRUE(absl::IsUnavailable(loop_->CurrentEpoch().status()));
  ASSERT_TRUE(Install(1).ok());
  EXPECT_EQ(*loop_->CurrentEpoch(), 1);
  ASSERT_TRUE(loop_->RunRound(1, &exec, Prefill(1, 3), now).ok());
  EXPECT_NE(Export(0), std::vector<uint8_t>(Export(0).size(), 0));

  loop_->Teardown();
  EXPECT_TRUE(absl::IsUnavailable(loop_->RunRound(1, &exec, Prefill(2, 3), now).status()));
  std::vector<uint8_t> out;
  EXPECT_TRUE(absl::IsUnavailable(loop_->ExportBlock(0, &out, [] { return false; })));

  // The next formation starts with an empty pool; epoch 1's stream is over.
  ASSERT_TRUE(Install(2).ok());
  EXPECT_EQ(*loop_->CurrentEpoch(), 2);
  EXPECT_TRUE(absl::IsUnavailable(loop_->RunRound(1, &exec, Prefill(3, 3), now).status()));
  const std::vector<uint8_t> fresh = Export(0);
  EXPECT_EQ(fresh, std::vector<uint8_t>(fresh.size(), 0));

  loop_->Stop();
  EXPECT_TRUE(absl::IsUnavailable(loop_->CurrentEpoch().status()));
  EXPECT_EQ(failures_.load(), 0);
}

TEST_F(StepLoopTest, FailedRoundIsReportedOnTheStepThread) {
  ASSERT_TRUE(Install(1, /*failing=*/true).ok());
  std::unique_ptr<RoundExecutor> exec;
  absl::StatusOr<StepLoop::RoundOutcome> r =
      loop_->RunRound(1, &exec, Prefill(1, 2), std::chrono::steady_clock::now());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsUnavailable(r->failure)) << r->failure;
  EXPECT_EQ(failures_.load(), 1);
}

TEST_F(StepLoopTest, RejectedPlanIsAnAnswerNotAFailure) {
  ASSERT_TRUE(Install(1).ok());
  std::unique_ptr<RoundExecutor> exec;
  v1::RoundPlan plan = Prefill(1, 2);
  plan.mutable_rows(0)->clear_sampling();  // an unknown lane without parameters
  absl::StatusOr<StepLoop::RoundOutcome> r =
      loop_->RunRound(1, &exec, plan, std::chrono::steady_clock::now());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->failure.ok());
  EXPECT_EQ(r->result.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(failures_.load(), 0);
}

TEST(BackendFactoryTest, BlockBytesComeFromTheBackendWithoutAPool) {
  ModelConfig cfg;
  cfg.layers = 2;
  cfg.head_dim = 8;
  TpShard shard;
  shard.kv_heads = 4;
  for (DType d : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
    const KvPoolSpec spec{1, 16, d};
    absl::StatusOr<int64_t> bytes = KvBlockBytes(kCpuBackend, cfg, shard, spec);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<std::unique_ptr<KvCache>> kv = KvCache::Create(2, 4, 8, spec);
    ASSERT_TRUE(kv.ok());
    EXPECT_EQ(*bytes, (*kv)->block_bytes());
  }
  EXPECT_TRUE(absl::IsUnimplemented(
      KvBlockBytes(kCudaBackend, cfg, shard, KvPoolSpec{1, 16, DType::kF32}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      KvBlockBytes("tpu", cfg, shard, KvPoolSpec{1, 16, DType::kF32}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      KvBlockBytes(kCpuBackend, cfg, shard, KvPoolSpec{1, 16, DType::kF16}).status()));
  BackendOptions cuda;
  cuda.kind = kCudaBackend;
  EXPECT_TRUE(absl::IsUnimplemented(CreateBackend(nullptr, cuda, nullptr).status()));
}

}  // namespace
}  // namespace ringlane::worker
