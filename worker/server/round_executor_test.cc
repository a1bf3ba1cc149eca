#include "worker/server/round_executor.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/factory.h"
#include "worker/model/model.h"
#include "worker/model/synthetic.h"

namespace ringlane::worker {
namespace {

namespace v1 = ringlane::v1;
using ::testing::HasSubstr;

constexpr int kBlock = 4;
constexpr KvPoolSpec kPool{/*num_blocks=*/16, kBlock, DType::kF32};

struct Sampled {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

class RoundExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/round_executor_test_", ::getpid(), "_model");
    std::filesystem::remove_all(dir);
    SyntheticModelOptions o;  // "tiny": vocab 512, 512 positions
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
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(*model_, BackendOptions{}, nullptr);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
    ASSERT_TRUE(backend_->AllocateKvPool(kPool).ok());
    exec_ = std::make_unique<RoundExecutor>(backend_.get(), /*rank=*/0);
  }

  static v1::SamplingParams Params() {
    v1::SamplingParams s;
    s.set_temperature(0.8f);
    s.set_seed(9);
    s.set_top_k(50);
    s.set_top_p(0.95f);
    s.set_presence_penalty(0.9f);
    s.set_frequency_penalty(1.2f);
    s.set_top_logprobs(3);
    return s;
  }

  static void AddBlocks(v1::LaneStep* row, int first_block, int64_t end) {
    for (int64_t b = 0; b < (end + kBlock - 1) / kBlock; ++b) {
      row->add_block_ids(first_block + static_cast<int>(b));
    }
  }

  // Runs lane `lane` over `prompt` (one prefill row) and then `decodes`
  // decode rows, in blocks from `first_block` on; what it sampled.
  Sampled RunLane(uint64_t lane, const std::vector<int32_t>& prompt, int decodes, int first_block,
                  const std::vector<int32_t>& earlier_output) {
    Sampled out;
    int64_t pos = 0;
    for (int r = 0; r <= decodes; ++r) {
      v1::RoundPlan plan;
      plan.set_round_id(++round_id_);
      v1::LaneStep* row = plan.add_rows();
      row->set_lane_id(lane);
      row->set_start_position(pos);
      row->set_sample_last(true);
      if (r == 0) {
        row->mutable_token_ids()->Add(prompt.begin(), prompt.end());
        *row->mutable_sampling() = Params();
        row->set_choice_index(1);
        row->mutable_earlier_output_token_ids()->Add(earlier_output.begin(), earlier_output.end());
        pos += static_cast<int64_t>(prompt.size());
      } else {
        row->set_use_last_sampled(true);
        pos += 1;
      }
      AddBlocks(row, first_block, pos);
      absl::StatusOr<v1::RoundResult> res = exec_->Run(plan);
      EXPECT_TRUE(res.ok()) << res.status();
      if (!res.ok()) return out;
      EXPECT_EQ(res->error().code(), 0) << res->error().message();
      EXPECT_EQ(res->outputs_size(), 1);
      if (res->outputs_size() != 1) return out;
      for (const v1::SampledToken& t : res->outputs(0).tokens()) {
        out.ids.push_back(t.token_id());
        out.logprobs.push_back(t.logprob());
        for (const v1::TokenLogprob& a : t.top_logprobs()) {
          out.top_ids.push_back(a.token_id());
          out.top_logprobs.push_back(a.logprob());
        }
      }
    }
    return out;
  }

  // A plan with one new lane whose first row carries `earlier_output`
  // (and sampling unless `with_sampling` is false); its error.
  v1::Status RunFirstRow(uint64_t lane, const std::vector<int32_t>& earlier_output,
                         bool with_sampling = true) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id_);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(lane);
    row->set_start_position(0);
    row->add_token_ids(1);
    row->add_token_ids(2);
    row->set_sample_last(true);
    AddBlocks(row, 15, 2);
    if (with_sampling) *row->mutable_sampling() = Params();
    row->mutable_earlier_output_token_ids()->Add(earlier_output.begin(), earlier_output.end());
    absl::StatusOr<v1::RoundResult> res = exec_->Run(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? res->error() : v1::Status();
  }

  static std::shared_ptr<const ModelWeights>* model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<RoundExecutor> exec_;
  uint64_t round_id_ = 0;
};

std::shared_ptr<const ModelWeights>* RoundExecutorTest::model_ = nullptr;

// The worker side of a preemption: a choice that generated 6 tokens, then
// restarted as a new lane over prompt + those tokens, samples what the
// uninterrupted lane sampled next, logprobs and alternatives included; the
// same restart without earlier_output_token_ids does not.
TEST_F(RoundExecutorTest, ReadmittedLaneContinuesThePenalties) {
  const std::vector<int32_t> prompt = {1, 17, 33, 90, 4, 250};
  const Sampled solo = RunLane(1, prompt, /*decodes=*/11, /*first_block=*/0, {});
  ASSERT_EQ(solo.ids.size(), 12u);
  // Tokens 0..5 came before the preemption; the re-admitted lane's prefill
  // samples token 6 and its decode rows tokens 7..11.
  const std::vector<int32_t> before(solo.ids.begin(), solo.ids.begin() + 6);
  std::vector<int32_t> readmit_prompt = prompt;
  readmit_prompt.insert(readmit_prompt.end(), before.begin(), before.end());
  const Sampled again = RunLane(2, readmit_prompt, 5, 5, before);
  const Sampled reset = RunLane(3, readmit_prompt, 5, 10, {});

  const auto tail = [](const auto& v, size_t from) {
    return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + from, v.end());
  };
  EXPECT_EQ(again.ids, tail(solo.ids, 6));
  EXPECT_EQ(again.logprobs, tail(solo.logprobs, 6));
  EXPECT_EQ(again.top_ids, tail(solo.top_ids, 18));
  EXPECT_EQ(again.top_logprobs, tail(solo.top_logprobs, 18));
  EXPECT_NE(reset.logprobs, tail(solo.logprobs, 6)) << "the penalties never mattered";
}

// Pipelined verify rows: a row planned behind a verify row, assuming its
// drafts accepted, is void where one was rejected (nothing fed, sampled or
// observed for penalties) and runs where all were; the lane's tokens and
// logprobs stay those of plain decode.
TEST_F(RoundExecutorTest, AnAssumeAcceptedRowIsVoidBehindARejectedDraft) {
  const std::vector<int32_t> prompt = {1, 17, 33, 90, 4, 250};
  const Sampled solo = RunLane(1, prompt, /*decodes=*/7, /*first_block=*/0, {});
  ASSERT_EQ(solo.ids.size(), 8u);
  const std::vector<int32_t>& g = solo.ids;
  const int64_t p = static_cast<int64_t>(prompt.size());
  Sampled got;
  auto run = [&](std::vector<v1::LaneStep> rows, bool ok = true) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id_);
    for (v1::LaneStep& r : rows) *plan.add_rows() = std::move(r);
    absl::StatusOr<v1::RoundResult> res = exec_->Run(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    if (!res.ok()) return v1::RoundResult();
    EXPECT_EQ(res->error().code() == 0, ok) << res->error().message();
    for (const v1::LaneOutput& o : res->outputs()) {
      for (const v1::SampledToken& t : o.tokens()) {
        got.ids.push_back(t.token_id());
        got.logprobs.push_back(t.logprob());
      }
    }
    return *res;
  };
  // start, drafts, whether it assumes the rows before accepted whole.
  auto decode = [&](int64_t start, std::vector<int32_t> drafts, bool assume) {
    v1::LaneStep r;
    r.set_lane_id(2);
    r.set_start_position(start);
    r.set_use_last_sampled(true);
    r.mutable_token_ids()->Add(drafts.begin(), drafts.end());
    if (drafts.empty()) {
      r.set_sample_last(true);
    } else {
      for (int k = 0; k <= static_cast<int>(drafts.size()); ++k) r.add_verify_offsets(k);
    }
    r.set_assume_accepted(assume);
    AddBlocks(&r, 8, start + 1 + static_cast<int64_t>(drafts.size()));
    return r;
  };
  v1::LaneStep first;
  first.set_lane_id(2);
  first.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  first.set_sample_last(true);
  *first.mutable_sampling() = Params();
  first.set_choice_index(1);
  AddBlocks(&first, 8, p);
  run({first});  // g0, fed at p
  // g1 accepted, a wrong second draft: g1 and g2, next position p + 2.
  const int32_t wrong = g[2] == 7 ? 8 : 7;
  v1::RoundResult r = run({decode(p, {g[1], wrong}, false)});
  ASSERT_EQ(r.outputs_size(), 1);
  EXPECT_EQ(r.outputs(0).accepted_draft_count(), 1);
  // Planned as if both were accepted: void.
  r = run({decode(p + 3, {}, true)});
  EXPECT_EQ(r.outputs_size(), 0);
  EXPECT_EQ(exec_->last_voided(), 1);
  EXPECT_EQ(exec_->last_fed(), 0);
  run({decode(p + 2, {}, false)});            // g3
  run({decode(p + 3, {g[4], g[5]}, false)});  // g4, g5 accepted, bonus g6
  // Behind a row whose drafts were all accepted: it runs (g7).
  r = run({decode(p + 6, {}, true)});
  EXPECT_EQ(r.outputs_size(), 1);
  EXPECT_EQ(exec_->last_voided(), 0);
  EXPECT_EQ(got.ids, solo.ids);
  EXPECT_EQ(got.logprobs, solo.logprobs);
  // Only behind use_last_sampled.
  v1::LaneStep bad = decode(p + 7, {}, true);
  bad.set_use_last_sampled(false);
  bad.add_token_ids(3);
  r = run({bad}, /*ok=*/false);
  EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.error().message(), HasSubstr("assume_accepted"));
}

TEST_F(RoundExecutorTest, BadEarlierOutputIsInvalidArgumentAndChangesNothing) {
  const int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  const int vocab = backend_->config().vocab;
  const int context = backend_->config().max_position;
  struct Case {
    std::vector<int32_t> tokens;
    bool with_sampling;
    const char* why;
  };
  const std::vector<Case> cases = {
      {{3, vocab}, true, "outside the vocabulary"},
      {{-1}, true, "outside the vocabulary"},
      {std::vector<int32_t>(static_cast<size_t>(context), 5), true, "the context holds"},
      {{3}, false, "without sampling parameters"},
  };
  for (const Case& c : cases) {
    const v1::Status st = RunFirstRow(40, c.tokens, c.with_sampling);
    EXPECT_EQ(st.code(), kInvalid) << c.why;
    EXPECT_THAT(st.message(), HasSubstr(c.why));
    EXPECT_EQ(exec_->num_lanes(), 0u);
  }
  // The largest valid list is accepted.
  const v1::Status ok = RunFirstRow(41, std::vector<int32_t>(static_cast<size_t>(context - 1), 5));
  EXPECT_EQ(ok.code(), 0) << ok.message();
  EXPECT_EQ(exec_->num_lanes(), 1u);
  // Parameters (and so earlier output) only come with a lane's first row.
  const v1::Status again = RunFirstRow(41, {3}, /*with_sampling=*/false);
  EXPECT_EQ(again.code(), kInvalid);
}

// Grammar masks: a row's allowed_tokens must fit the vocabulary and the
// row's sampled positions; a good one constrains the sample.
TEST_F(RoundExecutorTest, AllowedTokensAreValidatedAndApplied) {
  const int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  const int vocab = backend_->config().vocab;
  const size_t bytes = (static_cast<size_t>(vocab) + 7) / 8;
  auto run = [&](uint64_t lane, const std::vector<std::string>& masks,
                 std::map<int32_t, float> bias = {}) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id_);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(lane);
    row->add_token_ids(1);
    row->add_token_ids(2);
    row->set_sample_last(true);
    AddBlocks(row, 14, 2);
    *row->mutable_sampling() = Params();
    for (const auto& [t, b] : bias) (*row->mutable_sampling()->mutable_logit_bias())[t] = b;
    for (const std::string& m : masks) row->add_allowed_tokens(m);
    absl::StatusOr<v1::RoundResult> res = exec_->Run(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : v1::RoundResult();
  };
  std::string only_7(bytes, '\0');
  only_7[0] = 1 << 7;
  std::string past_end(bytes, '\0');
  past_end[0] = 1;
  if (vocab % 8 != 0) past_end.back() = static_cast<char>(0x80);
  const struct {
    std::vector<std::string> masks;
    std::map<int32_t, float> bias;
    const char* why;
  } cases[] = {
      {{only_7, only_7}, {}, "2 allowed_tokens masks for 1 sampled positions"},
      {{std::string(bytes - 1, '\xff')}, {}, "the vocabulary needs"},
      {{std::string(bytes, '\0')}, {}, "allows no token"},
      {{}, {{vocab, 1.0f}}, "logit_bias: token"},
  };
  for (const auto& c : cases) {
    const v1::RoundResult r = run(50, c.masks, c.bias);
    EXPECT_EQ(r.error().code(), kInvalid) << c.why;
    EXPECT_THAT(r.error().message(), HasSubstr(c.why));
    EXPECT_EQ(exec_->num_lanes(), 0u);
  }
  if (vocab % 8 != 0) {
    EXPECT_THAT(run(50, {past_end}).error().message(), HasSubstr("past the vocabulary"));
  }
  const v1::RoundResult ok = run(51, {only_7});
  ASSERT_EQ(ok.error().code(), 0) << ok.error().message();
  ASSERT_EQ(ok.outputs_size(), 1);
  EXPECT_EQ(ok.outputs(0).tokens(0).token_id(), 7);
}

// Copy-on-write of a partly reused block: a lane that takes positions
// [0, 5) of another lane's prompt, block 0 shared and block 1 copied onto a
// block of its own, feeds only the last prompt token and samples exactly what
// the first lane sampled, logprobs included, although the copy also carries
// rows the first lane wrote after position 5. A bad copy rejects the whole
// plan and writes nothing.
TEST_F(RoundExecutorTest, ACopiedBlockResumesMidBlock) {
  const std::vector<int32_t> prompt = {1, 17, 33, 90, 4, 250};
  const Sampled solo = RunLane(1, prompt, /*decodes=*/3, /*first_block=*/0, {});
  ASSERT_EQ(solo.ids.size(), 4u);

  std::vector<uint8_t> before;
  ASSERT_TRUE(backend_->ExportKvBlock(8, &before).ok());
  const int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  auto plan_for = [&](uint64_t lane, std::vector<std::pair<int, int>> copies) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id_);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(lane);
    row->set_start_position(5);
    row->add_token_ids(prompt[5]);
    row->add_block_ids(0);
    row->add_block_ids(8);
    row->set_sample_last(true);
    *row->mutable_sampling() = Params();
    row->set_choice_index(1);
    for (auto [src, dst] : copies) {
      v1::KvBlockCopy* c = plan.add_block_copies();
      c->set_src_block_id(src);
      c->set_dst_block_id(dst);
    }
    return plan;
  };
  const struct {
    std::vector<std::pair<int, int>> copies;
    const char* why;
  } bad[] = {
      {{{1, 8}, {8, 8}}, "copied onto itself"},
      {{{1, 8}, {16, 9}}, "outside pool"},
      {{{-1, 8}}, "outside pool"},
  };
  for (const auto& c : bad) {
    absl::StatusOr<v1::RoundResult> r = exec_->Run(plan_for(60, c.copies));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->error().code(), kInvalid) << c.why;
    EXPECT_THAT(r->error().message(), HasSubstr(c.why));
    EXPECT_EQ(exec_->num_lanes(), 1u) << "only the first lane";
    std::vector<uint8_t> now;
    ASSERT_TRUE(backend_->ExportKvBlock(8, &now).ok());
    EXPECT_EQ(now, before) << c.why << ": a rejected plan copied a block";
  }

  absl::StatusOr<v1::RoundResult> r = exec_->Run(plan_for(61, {{1, 8}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->error().code(), 0) << r->error().message();
  ASSERT_EQ(r->outputs_size(), 1);
  ASSERT_EQ(r->outputs(0).tokens_size(), 1);
  EXPECT_EQ(r->outputs(0).tokens(0).token_id(), solo.ids[0]);
  EXPECT_EQ(r->outputs(0).tokens(0).logprob(), solo.logprobs[0]);
  // Decoding on from there continues the first lane's text bit for bit.
  for (int k = 1; k < 4; ++k) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id_);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(61);
    row->set_start_position(5 + k);
    row->set_use_last_sampled(true);
    row->add_block_ids(0);
    row->add_block_ids(8);
    if (5 + k >= 2 * kBlock) row->add_block_ids(9);
    row->set_sample_last(true);
    absl::StatusOr<v1::RoundResult> d = exec_->Run(plan);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->error().code(), 0) << d->error().message();
    ASSERT_EQ(d->outputs_size(), 1);
    EXPECT_EQ(d->outputs(0).tokens(0).token_id(), solo.ids[k]) << k;
    EXPECT_EQ(d->outputs(0).tokens(0).logprob(), solo.logprobs[k]) << k;
  }
}

// glm5_next keeps a recurrent state per lane in a slot of the backend's: a
// lane takes one in its first row and gives it back when released; a round
// that needs more than are free, or a row that does not continue where its
// lane's state stands (a prefix hit, a rejected draft), is refused and
// changes nothing; a lane that reuses a released slot starts from zero.
TEST(RecurrentStateSlots, LanesTakeAndReturnSlotsAndRowsMustContinueTheState) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/round_executor_test_", ::getpid(), "_glm5_next");
  std::filesystem::remove_all(dir);
  absl::StatusOr<SyntheticModelOptions> o = SyntheticPreset("glm5-next-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = dir;
  ASSERT_TRUE(WriteSyntheticModel(*o).ok());
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  std::shared_ptr<const ModelWeights> model(std::move(*w));
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(model, BackendOptions{}, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  // Without slots the pool cannot hold this model's state.
  EXPECT_THAT(std::string((*b)->AllocateKvPool(kPool).message()), HasSubstr("state slots"));
  KvPoolSpec pool = kPool;
  pool.state_slots = 1;
  pool.state_checkpoints = 2;
  ASSERT_TRUE((*b)->AllocateKvPool(pool).ok());
  RoundExecutor exec(b->get(), /*rank=*/0);
  uint64_t round_id = 0;
  const std::vector<int32_t> prompt = {1, 17, 33, 49, 65, 81};
  auto prefill = [&](v1::RoundPlan* plan, uint64_t lane, int first_block, int64_t start,
                     absl::Span<const int32_t> tokens) {
    v1::LaneStep* row = plan->add_rows();
    row->set_lane_id(lane);
    row->set_start_position(start);
    row->mutable_token_ids()->Add(tokens.begin(), tokens.end());
    const int64_t end = start + static_cast<int64_t>(tokens.size());
    for (int64_t k = 0; k < (end + kBlock - 1) / kBlock; ++k) {
      row->add_block_ids(first_block + static_cast<int>(k));
    }
    if (start == 0) {
      row->mutable_sampling()->set_temperature(0);
      row->mutable_sampling()->set_seed(1);
    }
    row->set_sample_last(true);
    return row;
  };
  auto run = [&](v1::RoundPlan& plan) {
    plan.set_round_id(++round_id);
    absl::StatusOr<v1::RoundResult> r = exec.Run(plan);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  };
  // The prompt in one row, the reference; it saves its state after 4
  // positions into checkpoint 1.
  v1::RoundPlan solo;
  v1::StateCheckpoint* save = prefill(&solo, 1, 0, 0, prompt)->add_state_checkpoints();
  save->set_position(4);
  save->set_slot(1);
  v1::RoundResult first = run(solo);
  ASSERT_EQ(first.error().code(), 0) << first.error().message();
  const int32_t token = first.outputs(0).tokens(0).token_id();

  // Lane 1 holds the one slot: a second lane is refused.
  v1::RoundPlan two;
  prefill(&two, 2, 4, 0, absl::MakeConstSpan(prompt).subspan(0, 4));
  v1::RoundResult two_r = run(two);
  ASSERT_EQ(two_r.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
      << two_r.error().message();
  v1::RoundPlan release;
  v1::LaneStep* rel = release.add_rows();
  rel->set_lane_id(1);
  rel->set_release_lane(true);
  ASSERT_EQ(run(release).error().code(), 0);
  // Lane 2: its prompt in two rows, landing in the slot lane 1 left dirty.
  v1::RoundPlan a;
  prefill(&a, 2, 4, 0, absl::MakeConstSpan(prompt).subspan(0, 4))->set_sample_last(false);
  ASSERT_EQ(run(a).error().code(), 0);
  // A row that does not continue lane 2's state (a prefix hit) is refused.
  v1::RoundPlan skip;
  prefill(&skip, 2, 4, 5, absl::MakeConstSpan(prompt).subspan(5));
  v1::RoundResult skip_r = run(skip);
  EXPECT_EQ(skip_r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(skip_r.error().message(), HasSubstr("recurrent state stands at position 4"));
  v1::RoundPlan negative;
  prefill(&negative, 2, 4, 4, absl::MakeConstSpan(prompt).subspan(4))->set_linear_chunked_until(-1);
  v1::RoundResult negative_r = run(negative);
  EXPECT_EQ(negative_r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(negative_r.error().message(), HasSubstr("linear_chunked_until"));
  v1::RoundPlan rest;
  prefill(&rest, 2, 4, 4, absl::MakeConstSpan(prompt).subspan(4));
  v1::RoundResult rest_r = run(rest);
  ASSERT_EQ(rest_r.error().code(), 0) << rest_r.error().message();
  EXPECT_EQ(rest_r.outputs(0).tokens(0).token_id(), token);
  EXPECT_EQ(rest_r.outputs(0).tokens(0).logprob(), first.outputs(0).tokens(0).logprob());
  // Lane 2 releases in the round where lane 3 starts: the slot passes on.
  v1::RoundPlan one;
  v1::LaneStep* rel2 = one.add_rows();
  rel2->set_lane_id(2);
  rel2->set_release_lane(true);
  prefill(&one, 3, 8, 0, prompt);
  v1::RoundResult one_r = run(one);
  ASSERT_EQ(one_r.error().code(), 0) << one_r.error().message();
  ASSERT_EQ(one_r.outputs_size(), 1);
  EXPECT_EQ(one_r.outputs(0).tokens(0).token_id(), token);
  EXPECT_EQ(one_r.outputs(0).tokens(0).logprob(), first.outputs(0).tokens(0).logprob());
  v1::RoundPlan release3;
  release3.add_rows()->set_lane_id(3);
  release3.mutable_rows(0)->set_release_lane(true);
  ASSERT_EQ(run(release3).error().code(), 0);

  // A new lane resumes from checkpoint 1 at position 4 (lane 1's blocks
  // hold the KV of positions 0..3): lane 1's token and logprob. Resuming
  // where the checkpoint does not stand, or a checkpoint that does not
  // exist, is refused.
  auto resume = [&](int64_t at, int32_t slot) {
    v1::RoundPlan plan;
    v1::LaneStep* row =
        prefill(&plan, 4, 0, at, absl::MakeConstSpan(prompt).subspan(static_cast<size_t>(at)));
    row->mutable_sampling()->set_temperature(0);
    row->mutable_sampling()->set_seed(1);
    row->set_resume_checkpoint(slot);
    return run(plan);
  };
  v1::RoundResult wrong = resume(3, 1);
  EXPECT_EQ(wrong.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(wrong.error().message(), HasSubstr("holds 4 positions, the row starts at 3"));
  EXPECT_EQ(resume(4, 0).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << "checkpoint 0 was never written";
  EXPECT_EQ(resume(4, 2).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  v1::RoundResult resumed = resume(4, 1);
  ASSERT_EQ(resumed.error().code(), 0) << resumed.error().message();
  EXPECT_EQ(resumed.outputs(0).tokens(0).token_id(), token);
  EXPECT_EQ(resumed.outputs(0).tokens(0).logprob(), first.outputs(0).tokens(0).logprob());
}

}  // namespace
}  // namespace ringlane::worker
