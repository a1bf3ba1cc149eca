// The draft model on rank 0 (draft_runner.h) through the round executor:
// with the target itself as its draft model, a proposal must be exactly the
// target's greedy continuation, whatever rows came before (accepted and
// rejected drafts, prefix reuse, block copies, lanes side by side); a
// proposal never changes a sampled token; bad proposal requests are
// INVALID_ARGUMENT.
#include "worker/server/draft_runner.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/factory.h"
#include "worker/model/model.h"
#include "worker/model/shard.h"
#include "worker/model/synthetic.h"
#include "worker/server/round_executor.h"

namespace ringlane::worker {
namespace {

namespace v1 = ringlane::v1;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kBlock = 4;
constexpr KvPoolSpec kPool{/*num_blocks=*/64, kBlock, DType::kF32};

std::shared_ptr<const ModelWeights> Synthetic(const std::string& name, int vocab, uint64_t seed) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/draft_runner_test_", ::getpid(), "_", name);
  std::filesystem::remove_all(dir);
  SyntheticModelOptions o;
  o.out_dir = dir;
  o.vocab = vocab;
  o.seed = seed;
  EXPECT_TRUE(WriteSyntheticModel(o).ok());
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::shared_ptr<const ModelWeights>(std::move(*w)) : nullptr;
}

std::unique_ptr<Backend> NewBackend(const std::shared_ptr<const ModelWeights>& m) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(m, BackendOptions{}, nullptr);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

v1::SamplingParams Greedy() {
  v1::SamplingParams s;
  s.set_temperature(0);
  s.set_seed(3);
  return s;
}

v1::SamplingParams Warm() {
  v1::SamplingParams s;
  s.set_temperature(0.8f);
  s.set_seed(11);
  s.set_top_p(0.9f);
  s.set_logprobs(true);
  return s;
}

void AddBlocks(v1::LaneStep* row, int first_block, int64_t end) {
  for (int64_t b = 0; b < (end + kBlock - 1) / kBlock; ++b) {
    row->add_block_ids(first_block + static_cast<int>(b));
  }
}

// Row `r` of a greedy lane in blocks 0..: its prompt first, then one sampled
// token a round; `pos` is where the row starts and moves past it.
v1::LaneStep* AddGreedyRow(v1::RoundPlan* plan, uint64_t lane, const std::vector<int32_t>& prompt,
                           int r, int64_t* pos) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane);
  row->set_start_position(*pos);
  row->set_sample_last(true);
  if (r == 0) {
    row->mutable_token_ids()->Add(prompt.begin(), prompt.end());
    *row->mutable_sampling() = Greedy();
    *pos += static_cast<int64_t>(prompt.size());
  } else {
    row->set_use_last_sampled(true);
    *pos += 1;
  }
  AddBlocks(row, 0, *pos);
  return row;
}

// A new greedy lane's first row: `prompt` from position 0 in blocks 0..,
// sampling its last token and asking for `propose` drafts.
v1::LaneStep* AddFirstRow(v1::RoundPlan* plan, uint64_t lane, const std::vector<int32_t>& prompt,
                          int propose) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane);
  row->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(propose);
  AddBlocks(row, 0, static_cast<int64_t>(prompt.size()));
  return row;
}

// A new greedy lane's first row over `seq`, whose first 8 positions it
// takes from blocks 0-1 (their tokens as prefix_token_ids) and the rest
// writes into `own_block`, asking for 4 drafts.
v1::LaneStep* AddReuseRow(v1::RoundPlan* plan, uint64_t lane, const std::vector<int32_t>& seq,
                          int32_t own_block) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane);
  row->set_start_position(8);
  row->mutable_token_ids()->Add(seq.begin() + 8, seq.end());
  row->mutable_prefix_token_ids()->Add(seq.begin(), seq.begin() + 8);
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(4);
  for (int32_t b : {0, 1, own_block}) row->add_block_ids(b);
  return row;
}

class DraftRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = new std::shared_ptr<const ModelWeights>(Synthetic("target", 512, 1));
  }
  static void TearDownTestSuite() {
    delete target_;
    target_ = nullptr;
  }

  void SetUp() override {
    backend_ = NewBackend(*target_);
    ASSERT_NE(backend_, nullptr);
    ASSERT_TRUE(backend_->AllocateKvPool(kPool).ok());
    absl::StatusOr<std::unique_ptr<DraftRunner>> d =
        DraftRunner::Create(NewBackend(*target_), kPool, 512, 512);
    ASSERT_TRUE(d.ok()) << d.status();
    draft_ = std::move(*d);
    exec_ = std::make_unique<RoundExecutor>(backend_.get(), /*rank=*/0, nullptr, draft_.get());

    // The reference: the same model decoding greedily, no drafts anywhere.
    ref_backend_ = NewBackend(*target_);
    ASSERT_TRUE(ref_backend_->AllocateKvPool(kPool).ok());
    ref_ = std::make_unique<RoundExecutor>(ref_backend_.get(), 0);
  }

  // Greedy continuation of `prompt` by plain decode: `n` tokens.
  std::vector<int32_t> GreedyTokens(const std::vector<int32_t>& prompt, int n) {
    std::vector<int32_t> out;
    int64_t pos = 0;
    const uint64_t lane = ++ref_lane_;
    for (int r = 0; r < n; ++r) {
      v1::RoundPlan plan;
      plan.set_round_id(++ref_round_);
      v1::LaneStep* row = AddGreedyRow(&plan, lane, prompt, r, &pos);
      row->set_release_lane(r + 1 == n);
      absl::StatusOr<v1::RoundResult> res = ref_->Run(plan);
      EXPECT_TRUE(res.ok() && res->error().code() == 0 && res->outputs_size() == 1);
      if (!res.ok() || res->outputs_size() != 1) return out;
      out.push_back(res->outputs(0).tokens(0).token_id());
    }
    return out;
  }

  v1::RoundResult Run(const v1::RoundPlan& plan) {
    absl::StatusOr<v1::RoundResult> res = exec_->Run(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : v1::RoundResult();
  }

  static std::vector<int32_t> Ids(const v1::LaneOutput& o) {
    std::vector<int32_t> ids;
    for (const auto& t : o.tokens()) ids.push_back(t.token_id());
    return ids;
  }
  static std::vector<int32_t> Drafts(const v1::LaneOutput& o) {
    return {o.draft_token_ids().begin(), o.draft_token_ids().end()};
  }

  static std::shared_ptr<const ModelWeights>* target_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DraftRunner> draft_;
  std::unique_ptr<RoundExecutor> exec_;
  std::unique_ptr<Backend> ref_backend_;
  std::unique_ptr<RoundExecutor> ref_;
  uint64_t ref_lane_ = 1000;
  uint64_t ref_round_ = 0;
};

std::shared_ptr<const ModelWeights>* DraftRunnerTest::target_ = nullptr;

TEST_F(DraftRunnerTest, SelfDraftProposesTheGreedyContinuationThroughAcceptAndReject) {
  const std::vector<int32_t> prompt = {1, 17, 99, 230, 5, 77, 301};  // 7: ends mid-block
  const std::vector<int32_t> greedy = GreedyTokens(prompt, 14);
  ASSERT_EQ(greedy.size(), 14u);

  // Prefill, asking for 5 drafts after the first sample.
  v1::RoundPlan plan;
  plan.set_round_id(1);
  v1::LaneStep* row = plan.add_rows();
  row->set_lane_id(7);
  row->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(5);
  AddBlocks(row, 0, 7);
  v1::RoundResult r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  ASSERT_EQ(r.outputs_size(), 1);
  EXPECT_EQ(Ids(r.outputs(0)), std::vector<int32_t>{greedy[0]});
  EXPECT_THAT(Drafts(r.outputs(0)), ElementsAreArray(greedy.begin() + 1, greedy.begin() + 6));

  // Verify all five: every one accepted, the bonus sample follows, and the
  // next proposal continues from it.
  plan.Clear();
  plan.set_round_id(2);
  row = plan.add_rows();
  row->set_lane_id(7);
  row->set_start_position(7);
  row->set_use_last_sampled(true);
  row->mutable_token_ids()->Add(greedy.begin() + 1, greedy.begin() + 6);
  for (int k = 0; k <= 5; ++k) row->add_verify_offsets(k);
  row->set_propose_drafts(3);
  AddBlocks(row, 0, 13);
  r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  EXPECT_EQ(r.outputs(0).accepted_draft_count(), 5);
  EXPECT_THAT(Ids(r.outputs(0)), ElementsAreArray(greedy.begin() + 1, greedy.begin() + 7));
  EXPECT_THAT(Drafts(r.outputs(0)), ElementsAreArray(greedy.begin() + 7, greedy.begin() + 10));

  // Verify three drafts of which the second is wrong: one accepted; the
  // proposal must follow the kept tokens, not the rejected one.
  std::vector<int32_t> wrong = {greedy[7], (greedy[8] + 1) % 512, greedy[9]};
  plan.Clear();
  plan.set_round_id(3);
  row = plan.add_rows();
  row->set_lane_id(7);
  row->set_start_position(13);
  row->set_use_last_sampled(true);
  row->mutable_token_ids()->Add(wrong.begin(), wrong.end());
  for (int k = 0; k <= 3; ++k) row->add_verify_offsets(k);
  row->set_propose_drafts(4);
  AddBlocks(row, 0, 17);
  r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  EXPECT_EQ(r.outputs(0).accepted_draft_count(), 1);
  EXPECT_THAT(Ids(r.outputs(0)), ElementsAreArray(greedy.begin() + 7, greedy.begin() + 9));
  EXPECT_THAT(Drafts(r.outputs(0)), ElementsAreArray(greedy.begin() + 9, greedy.begin() + 13));
  EXPECT_GT(draft_->passes(), 0);
}

TEST_F(DraftRunnerTest, LanesSideBySideAndAPrefixReusedFromAnotherLane) {
  const std::vector<int32_t> a = {3, 4, 5, 6, 7, 8, 9, 10};  // two whole blocks
  const std::vector<int32_t> b = {3, 4, 5, 6, 7, 8, 9, 10, 400, 401};
  const std::vector<int32_t> c = {200, 11, 12};
  const std::vector<int32_t> ga = GreedyTokens(a, 5);
  const std::vector<int32_t> gb = GreedyTokens(b, 5);
  const std::vector<int32_t> gc = GreedyTokens(c, 5);

  // Lane 1 prefills a in blocks 0-1 (and its first decode position in 2).
  v1::RoundPlan plan;
  plan.set_round_id(1);
  v1::LaneStep* row = AddFirstRow(&plan, 1, a, 4);
  ASSERT_EQ(Run(plan).error().code(), 0);

  // Lane 2 reuses blocks 0-1 (a's first 8 tokens are b's) and feeds only
  // its last two tokens, beside lane 3's whole prompt: both proposals are
  // their greedy continuations.
  plan.Clear();
  plan.set_round_id(2);
  row = plan.add_rows();
  row->set_lane_id(2);
  row->set_start_position(8);
  row->mutable_token_ids()->Add(b.begin() + 8, b.end());
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(4);
  row->add_block_ids(0);
  row->add_block_ids(1);
  row->add_block_ids(10);
  row = plan.add_rows();
  row->set_lane_id(3);
  row->mutable_token_ids()->Add(c.begin(), c.end());
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(4);
  AddBlocks(row, 20, 3);
  v1::RoundResult r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  ASSERT_EQ(r.outputs_size(), 2);
  EXPECT_EQ(Ids(r.outputs(0)), std::vector<int32_t>{gb[0]});
  EXPECT_THAT(Drafts(r.outputs(0)), ElementsAreArray(gb.begin() + 1, gb.end()));
  EXPECT_EQ(Ids(r.outputs(1)), std::vector<int32_t>{gc[0]});
  EXPECT_THAT(Drafts(r.outputs(1)), ElementsAreArray(gc.begin() + 1, gc.end()));
  (void)ga;
}

TEST_F(DraftRunnerTest, ALaneThatAsksForNoProposalsCostsNoPassesAndIsCaughtUpWhenItAsks) {
  // The router stops asking while drafting does not pay (a compute-bound
  // worker with several lanes): the draft model must not run for those
  // rows, and the lane's next proposal must still be its greedy
  // continuation, the skipped tokens fed first.
  const std::vector<int32_t> prompt = {1, 17, 99, 230, 5, 77, 301};
  const std::vector<int32_t> greedy = GreedyTokens(prompt, 10);
  ASSERT_EQ(greedy.size(), 10u);
  int64_t pos = 0;
  for (int r = 0; r < 6; ++r) {
    v1::RoundPlan plan;
    plan.set_round_id(r + 1);
    v1::LaneStep* row = AddGreedyRow(&plan, 9, prompt, r, &pos);
    if (r == 5) row->set_propose_drafts(4);
    const v1::RoundResult res = Run(plan);
    ASSERT_EQ(res.error().code(), 0) << res.error().message();
    ASSERT_EQ(res.outputs_size(), 1);
    EXPECT_EQ(Ids(res.outputs(0)), std::vector<int32_t>{greedy[r]}) << "round " << r;
    if (r < 5) {
      EXPECT_EQ(draft_->passes(), 0) << "round " << r;
      EXPECT_EQ(res.outputs(0).draft_token_ids_size(), 0);
    } else {
      EXPECT_THAT(Drafts(res.outputs(0)), ElementsAreArray(greedy.begin() + 6, greedy.end()));
    }
  }
  // One pass feeding the eleven positions and proposing the first draft,
  // three for the others.
  EXPECT_EQ(draft_->passes(), 4);
}

TEST_F(DraftRunnerTest, ProposalsNeverChangeWhatIsSampled) {
  // The same seeded, warm lane with and without proposals: same tokens and
  // logprobs, bit for bit.
  const std::vector<int32_t> prompt = {9, 8, 7, 6, 5};
  auto run = [&](RoundExecutor* exec, int propose) {
    std::vector<std::pair<int32_t, float>> out;
    int64_t pos = 0;
    for (int r = 0; r < 12; ++r) {
      v1::RoundPlan plan;
      plan.set_round_id(r + 1);
      v1::LaneStep* row = plan.add_rows();
      row->set_lane_id(5);
      row->set_start_position(pos);
      row->set_sample_last(true);
      row->set_propose_drafts(propose);
      if (r == 0) {
        row->mutable_token_ids()->Add(prompt.begin(), prompt.end());
        *row->mutable_sampling() = Warm();
        pos += 5;
      } else {
        row->set_use_last_sampled(true);
        pos += 1;
      }
      AddBlocks(row, 30, pos);
      absl::StatusOr<v1::RoundResult> res = exec->Run(plan);
      EXPECT_TRUE(res.ok() && res->error().code() == 0 && res->outputs_size() == 1);
      if (!res.ok() || res->outputs_size() != 1) return out;
      out.emplace_back(res->outputs(0).tokens(0).token_id(), res->outputs(0).tokens(0).logprob());
      EXPECT_EQ(res->outputs(0).draft_token_ids_size(), exec == exec_.get() ? propose : 0);
    }
    return out;
  };
  EXPECT_EQ(run(exec_.get(), 6), run(ref_.get(), 6));
}

// A prefix the draft model never saw. Lane 1 prefills `a` into blocks 0-1
// and is released without asking for a proposal, so its tokens were never
// fed to the draft model; lane 2 reuses those blocks. With the first row's
// prefix tokens its proposal is its greedy continuation, and every entry
// the runner trusts afterwards is one it wrote.
TEST_F(DraftRunnerTest, APrefixTheDraftModelNeverSawIsFedFromTheFirstRowsPrefixTokens) {
  const std::vector<int32_t> a = {3, 4, 5, 6, 7, 8, 9, 10};  // two whole blocks
  const std::vector<int32_t> b = {3, 4, 5, 6, 7, 8, 9, 10, 400, 401};
  const std::vector<int32_t> gb = GreedyTokens(b, 5);

  v1::RoundPlan plan;
  plan.set_round_id(1);
  AddFirstRow(&plan, 1, a, 0)->set_release_lane(true);
  ASSERT_EQ(Run(plan).error().code(), 0);
  EXPECT_EQ(draft_->passes(), 0);
  EXPECT_EQ(draft_->valid_positions(0), 0);

  plan.Clear();
  plan.set_round_id(2);
  AddReuseRow(&plan, 2, b, 10);
  v1::RoundResult r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  ASSERT_EQ(r.outputs_size(), 1);
  EXPECT_EQ(Ids(r.outputs(0)), std::vector<int32_t>{gb[0]});
  EXPECT_THAT(Drafts(r.outputs(0)), ElementsAreArray(gb.begin() + 1, gb.end()));
  // Blocks 0-1 whole, and in block 10 the row's two tokens and its sample
  // (the proposal's own positions after it are not the target's).
  EXPECT_EQ(draft_->valid_positions(0), kBlock);
  EXPECT_EQ(draft_->valid_positions(1), kBlock);
  EXPECT_EQ(draft_->valid_positions(10), 3);
  EXPECT_EQ(draft_->prefix_tokens(), 0);
  EXPECT_EQ(draft_->last_prefix_fed(), 8);
}

// Blocks whose draft entries were right go stale when the target writes
// other tokens into them (the router gave the blocks to another lane) and
// when they are imported (restored from the kvstore or another rank): a
// lane that then reuses them is fed its prefix again.
TEST_F(DraftRunnerTest, BlocksWrittenOverOrImportedAreFedAgain) {
  const std::vector<int32_t> a = {3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<int32_t> c = {200, 11, 12, 13, 14, 15, 16, 17};
  std::vector<int32_t> d = c;
  d.insert(d.end(), {402, 403});
  const std::vector<int32_t> gd = GreedyTokens(d, 5);
  uint64_t round = 0;
  // A lane over blocks 0-1 (and its sample's block 2) that asks for a
  // proposal or not, then is released.
  auto prefill = [&](uint64_t lane, const std::vector<int32_t>& prompt, int propose) {
    v1::RoundPlan plan;
    plan.set_round_id(++round);
    AddFirstRow(&plan, lane, prompt, propose);
    ASSERT_EQ(Run(plan).error().code(), 0);
    plan.Clear();
    plan.set_round_id(++round);
    plan.add_rows()->set_lane_id(lane);
    plan.mutable_rows(0)->set_release_lane(true);
    ASSERT_EQ(Run(plan).error().code(), 0);
  };
  // `d` from its cached first 8 positions: its proposal.
  auto reuse = [&](uint64_t lane) {
    v1::RoundPlan plan;
    plan.set_round_id(++round);
    AddReuseRow(&plan, lane, d, 11);
    v1::RoundResult r = Run(plan);
    EXPECT_EQ(r.error().code(), 0) << r.error().message();
    return r.outputs_size() == 1 ? Drafts(r.outputs(0)) : std::vector<int32_t>{};
  };

  // Written over: `a` with a proposal (the draft entries are a's), then `c`
  // without one (the target's blocks hold c, the draft's still a).
  prefill(1, a, 4);
  EXPECT_EQ(draft_->valid_positions(0), kBlock);
  prefill(2, c, 0);
  EXPECT_EQ(draft_->valid_positions(0), 0);
  EXPECT_EQ(draft_->valid_positions(1), 0);
  EXPECT_THAT(reuse(3), ElementsAreArray(gd.begin() + 1, gd.end()));

  // Imported: `a` with a proposal again, then c's blocks from a rank that
  // computed them (the reference's pool, where GreedyTokens left d's first
  // 8 positions in blocks 0-1) copied over the target's.
  prefill(4, a, 4);
  EXPECT_EQ(draft_->valid_positions(1), kBlock);
  for (int32_t block : {0, 1}) {
    std::vector<uint8_t> kv;
    ASSERT_TRUE(ref_backend_->ExportKvBlock(block, &kv).ok());
    ASSERT_TRUE(backend_->ImportKvBlock(block, kv).ok());
    draft_->Invalidate(block);  // as StepLoop::ImportBlock does
  }
  EXPECT_EQ(draft_->valid_positions(0), 0);
  EXPECT_THAT(reuse(5), ElementsAreArray(gd.begin() + 1, gd.end()));
}

TEST_F(DraftRunnerTest, BadProposalRequestsAreInvalidArgument) {
  for (int bad : {-1, 65}) {
    v1::RoundPlan plan;
    plan.set_round_id(1);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(1);
    row->add_token_ids(1);
    row->set_sample_last(true);
    *row->mutable_sampling() = Greedy();
    row->set_propose_drafts(bad);
    row->add_block_ids(0);
    v1::RoundResult r = Run(plan);
    EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(r.error().message(), HasSubstr("propose_drafts"));
  }
  // Prefix tokens that do not match the row, or on a lane's later row.
  struct Bad {
    int64_t start;
    std::vector<int32_t> prefix;
    const char* why;
  };
  for (const Bad& bad : {Bad{2, {1}, "prefix_token_ids: 1 tokens for start_position 2"},
                         Bad{2, {1, 2, 3}, "prefix_token_ids: 3 tokens"},
                         Bad{2, {1, 512}, "prefix_token_ids[1] = 512 is outside"},
                         Bad{2, {-1, 2}, "prefix_token_ids[0] = -1"}}) {
    v1::RoundPlan plan;
    plan.set_round_id(1);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(3);
    row->set_start_position(bad.start);
    row->add_token_ids(1);
    row->mutable_prefix_token_ids()->Add(bad.prefix.begin(), bad.prefix.end());
    row->set_sample_last(true);
    *row->mutable_sampling() = Greedy();
    row->add_block_ids(0);
    v1::RoundResult r = Run(plan);
    EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << bad.why;
    EXPECT_THAT(r.error().message(), HasSubstr(bad.why));
  }
  {
    v1::RoundPlan plan;
    plan.set_round_id(1);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(4);
    row->add_token_ids(1);
    row->set_sample_last(true);
    *row->mutable_sampling() = Greedy();
    row->add_block_ids(0);
    ASSERT_EQ(Run(plan).error().code(), 0);
    plan.set_round_id(2);
    row->clear_sampling();
    row->clear_token_ids();
    row->set_start_position(1);
    row->set_use_last_sampled(true);
    row->add_prefix_token_ids(1);
    v1::RoundResult r = Run(plan);
    EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(r.error().message(), HasSubstr("prefix_token_ids without sampling"));
  }
  // More than a worker proposes is answered with what it can.
  v1::RoundPlan plan;
  plan.set_round_id(2);
  v1::LaneStep* row = plan.add_rows();
  row->set_lane_id(2);
  row->add_token_ids(1);
  row->set_sample_last(true);
  *row->mutable_sampling() = Greedy();
  row->set_propose_drafts(64);
  row->add_block_ids(0);
  v1::RoundResult r = Run(plan);
  ASSERT_EQ(r.error().code(), 0) << r.error().message();
  EXPECT_EQ(r.outputs(0).draft_token_ids_size(), kMaxProposedDrafts);
}

// The benchmark's perfect drafter: layers from silent_from on add nothing,
// so the model's first silent_from layers (FirstLayers) give its logits bit
// for bit, and those of an ordinary model differ.
TEST(DraftRunnerCreate, ASilentTailMakesTheFirstLayersExact) {
  auto logits = [](std::shared_ptr<const ModelWeights> m) {
    auto b = NewBackend(m);
    EXPECT_TRUE(b->AllocateKvPool(kPool).ok());
    RoundInput in;
    in.seqs.push_back(SeqStep{.start_position = 0,
                              .tokens = {5, 77, 300, 12, 9},
                              .block_ids = {0, 1},
                              .logit_offsets = {0, 1, 2, 3, 4}});
    auto out = b->Step(in);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->logits[0] : std::vector<float>{};
  };
  for (int silent : {1, 0}) {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/draft_runner_test_", ::getpid(), "_silent", silent);
    std::filesystem::remove_all(dir);
    SyntheticModelOptions o;
    o.out_dir = dir;
    o.layers = 3;
    o.silent_from = silent;
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    auto w = LoadModel(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    std::shared_ptr<const ModelWeights> full(std::move(*w));
    auto first = FirstLayers(full, 1);
    ASSERT_TRUE(first.ok()) << first.status();
    if (silent == 1) {
      EXPECT_EQ(logits(full), logits(*first));
    } else {
      EXPECT_NE(logits(full), logits(*first));
    }
  }
}

TEST(DraftRunnerCreate, RefusesAnotherVocabularyOrAShorterContext) {
  auto target = Synthetic("create_target", 512, 1);
  auto other = Synthetic("create_other", 256, 2);
  absl::StatusOr<std::unique_ptr<DraftRunner>> d =
      DraftRunner::Create(NewBackend(other), kPool, 512, 512);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("vocabulary"));
  d = DraftRunner::Create(NewBackend(target), kPool, 512, 4096);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("context"));
  d = DraftRunner::Create(NewBackend(target), kPool, 512, 512);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT((*d)->scratch_blocks(), 0);
}

}  // namespace
}  // namespace ringlane::worker
