// Table tests of the round planner and the result applier over a fake worker
// group, one row per case: admission, chunk sizing under the ITL target, the
// token budget, pipelined rounds and lanes that stop mid-pipeline,
// preemption, release, prefix hits, and verify rows whose drafts are partly
// rejected.
//
// The fake group (fake_worker_group.h) models what the workers keep, so a
// lane that reads a wrong block, a stale slot or a position never written,
// or that is re-admitted without its earlier output, produces different
// tokens; every case compares each choice's tokens with a solo run of the
// same model. After every round the ledger's view (positions, block counts)
// must equal the fake workers'.
#include "router/sched/planner.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/client/round_builder.h"
#include "router/client/worker_group.h"
#include "router/sched/applier.h"
#include "router/sched/fake_worker_group.h"

namespace ringlane::router {
namespace {

namespace v1 = ringlane::v1;

constexpr int32_t kVocab = kFakeVocab;
using FakeGroup = FakeWorkerGroup;

// Proposes the model's own continuation but gets every `wrong_every`-th
// draft wrong, so that verify rows accept some drafts and reject the rest.
// Every decode row drafts. With a row in flight it waits for the result,
// or, `pipelined`, drafts behind it: it continues the row's drafts, its
// first token a guess of the row's last sample (wrong as often).
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(int wrong_every, bool pipelined)
      : wrong_every_(wrong_every), pipelined_(pipelined) {}
  DraftDecision Plan(const Lane& lane, const DraftContext& ctx) override {
    DraftDecision d;
    if (ctx.max_drafts <= 0) return d;
    std::vector<int32_t> context;
    if (ctx.row_in_flight) {
      if (!pipelined_) {
        d.wait = true;
        return d;
      }
      context = lane.seq;
      context.insert(context.end(), ctx.assumed.begin(), ctx.assumed.end());
      EXPECT_EQ(static_cast<int64_t>(context.size()), lane.fed)
          << "lane " << lane.id << " seq " << lane.seq.size() << " assumed " << ctx.assumed.size()
          << " prompt " << lane.prompt_len << " in flight " << lane.rows_in_flight;
      d.tokens = Continue(lane, context, ctx.max_drafts + 1);
      d.tokens.erase(d.tokens.begin());
    } else {
      context.assign(lane.seq.begin(),
                     lane.seq.begin() + std::min<int64_t>(lane.fed + 1, lane.seq.size()));
      d.tokens = Continue(lane, context, ctx.max_drafts);
    }
    d.source = 0;
    return d;
  }
  // As a drafter with a draft model on the workers would.
  bool WantsPrefixTokens(const Lane&) override { return true; }

 private:
  // The fake model's continuation of `context` (the inputs of positions
  // 0..size-1), with the scripted mistakes.
  std::vector<int32_t> Continue(const Lane& lane, const std::vector<int32_t>& context, int count) {
    uint64_t h = 0;
    int64_t sum = 0;
    const int64_t prompt = static_cast<int64_t>(lane.req->p.prompt.size());
    for (size_t p = 0; p < context.size(); ++p) {
      h = FakeMix(h, context[p]);
      if (static_cast<int64_t>(p) >= prompt) sum += context[p];
    }
    std::vector<int32_t> drafts;
    for (int i = 0; i < count; ++i) {
      int32_t t = FakeNextToken(h, sum);
      if (++count_ % wrong_every_ == 0) t = t == 3 ? 4 : 3;
      drafts.push_back(t);
      sum += t;
      h = FakeMix(h, t);
    }
    return drafts;
  }

  const int wrong_every_;
  const bool pipelined_;
  int64_t count_ = 0;
};

struct Request {
  int prompt_len = 8;
  int max_tokens = 8;
  int arrival_round = 0;
  // Prompts with the same family share their first `shared` tokens.
  int family = 0;
  int shared = 0;
  // A token that ends the choice early (-1: none); for lanes that stop
  // while their next row is already in flight.
  int32_t stop_token = -1;
};

struct Case {
  std::string name;
  std::vector<Request> requests;
  int num_blocks = 64;
  int block_size = 4;
  int budget = 64;
  int max_lanes = 8;
  int depth = 2;
  int max_drafts = 0;
  int wrong_every = 3;
  // With a drafter that drafts behind a lone lane's row in flight
  // (pipelined verify rows), some rows behind a rejected draft are voided.
  bool expect_voided = false;
  // The simulated round time: fixed + per token (microseconds), for the
  // cost model; itl target in ms (0 = none).
  double itl_target_ms = 0;
  int min_chunk = 4;
  // Expectations beyond "every choice equals its solo run".
  bool expect_preemption = false;
  bool expect_prefix_hit = false;
  bool expect_drafts_rejected = false;
  // Speculation takes fewer rounds than plain decode (not so where most
  // drafts fail: a speculative lane gives up pipelining).
  bool expect_fewer_rounds = false;
  // Largest tokens of any round whose decode rows share it with a prefill
  // chunk, once the cost model is ready (0: unchecked).
  int64_t max_mixed_round_tokens = 0;
  // Rounds in which the first request alone runs before the second arrives.
  int64_t max_rounds = 10000;
};

std::vector<int32_t> PromptOf(const Request& r, int index) {
  std::vector<int32_t> p;
  for (int i = 0; i < r.prompt_len; ++i) {
    const bool shared = i < r.shared;
    p.push_back(3 + static_cast<int32_t>((shared ? r.family * 7 + i * 5 : index * 11 + i * 3) %
                                         (kVocab - 3)));
  }
  return p;
}

// Finishes a choice at max_tokens or its stop token, as choice_output would.
class RecordingSink final : public ResultSink {
 public:
  explicit RecordingSink(std::map<RequestState*, int32_t> stops) : stops_(std::move(stops)) {}
  bool OnToken(Lane& lane, const v1::SampledToken& t) override {
    Choice& c = lane.req->choices[lane.choice];
    if (c.finished) return false;
    c.generated.push_back(t.token_id());
    const bool stop = stops_[lane.req.get()] == t.token_id();
    if (stop || static_cast<int>(c.generated.size()) >= lane.req->p.max_tokens) {
      c.finished = true;
      return true;
    }
    return false;
  }

 private:
  std::map<RequestState*, int32_t> stops_;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;
  int64_t drafts_seen = 0;
  int64_t drafts_accepted = 0;
  int64_t rounds = 0;
  int64_t prefix_rows = 0;
  int64_t rows_voided = 0;
};

Outcome RunCase(const Case& c, bool with_drafts, bool pipelined_drafts = false) {
  Outcome outcome;
  FakeGroup group(c.num_blocks, c.block_size);
  auto kv = KvBlockManager::Create({.num_blocks = c.num_blocks,
                                    .identity = {.model_id = "fake",
                                                 .kv_dtype = "f32",
                                                 .block_size_tokens = c.block_size,
                                                 .tp_world_size = 1}});
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return outcome;
  RoundCostModel cost;
  ScriptedDrafter drafter(c.wrong_every, pipelined_drafts);
  PlannerOptions opt{.round_token_budget = c.budget,
                     .itl_target_ms = c.itl_target_ms,
                     .min_prefill_chunk = c.min_chunk,
                     .max_lanes = c.max_lanes,
                     .max_drafts = with_drafts ? c.max_drafts : 0};
  SchedState state;
  std::vector<std::shared_ptr<RequestState>> reqs;
  std::map<RequestState*, int32_t> stops;
  for (size_t i = 0; i < c.requests.size(); ++i) {
    auto r = std::make_shared<RequestState>();
    r->queue = std::make_shared<ResponseQueue>();
    r->p.prompt = PromptOf(c.requests[i], static_cast<int>(i));
    r->p.max_tokens = c.requests[i].max_tokens;
    r->p.sampling.set_temperature(0);
    r->p.sampling.set_seed(1);
    r->choices.resize(1);
    r->choices_left = 1;
    stops[r.get()] = c.requests[i].stop_token;
    reqs.push_back(r);
  }
  RecordingSink sink(stops);
  std::deque<PlannedRound> in_flight;
  int64_t round = 0;
  size_t next_arrival = 0;
  auto all_done = [&] {
    return next_arrival == reqs.size() && state.lanes.empty() && state.waiting.empty() &&
           state.pending_release.empty() && in_flight.empty();
  };
  while (!all_done() && round < c.max_rounds) {
    for (; next_arrival < reqs.size() && c.requests[next_arrival].arrival_round <= round;
         ++next_arrival) {
      state.waiting.push_back({reqs[next_arrival], 0});
    }
    ++round;
    if (in_flight.size() < static_cast<size_t>(c.depth)) {
      PlannedRound planned;
      PlanRound(state, **kv, cost, opt, with_drafts ? &drafter : nullptr, &planned);
      outcome.preemptions += planned.preemptions;
      outcome.cached_tokens += planned.admitted_cached_tokens;
      if (planned.plan.rows_size() > 0) {
        int64_t tokens = 0;
        bool decode = false, prefill = false;
        for (const v1::LaneStep& row : planned.plan.rows()) {
          tokens += RowTokens(row);
          decode |= row.use_last_sampled();
          prefill |= !row.use_last_sampled() && row.token_ids_size() > 0;
        }
        EXPECT_LE(tokens, c.budget) << "round " << planned.plan.round_id();
        if (c.max_mixed_round_tokens > 0 && decode && prefill && cost.ready()) {
          EXPECT_LE(tokens, c.max_mixed_round_tokens) << "round " << planned.plan.round_id();
        }
        EXPECT_TRUE(group.Send(planned.plan).ok());
        in_flight.push_back(std::move(planned));
        ++outcome.rounds;
        if (in_flight.size() < static_cast<size_t>(c.depth)) continue;
      }
    }
    if (in_flight.empty()) continue;
    absl::StatusOr<v1::RoundResult> result = group.Receive();
    EXPECT_TRUE(result.ok());
    if (!result.ok()) break;
    std::vector<PlannedRound*> later;
    for (size_t i = 1; i < in_flight.size(); ++i) later.push_back(&in_flight[i]);
    const AppliedRound a = ApplyRoundResult(in_flight.front(), *result, state, **kv, sink, later);
    in_flight.pop_front();
    // A round costs 2 ms plus 0.5 ms per token.
    cost.Observe(a.tokens, 2000 + 500.0 * static_cast<double>(a.tokens), a.attended);
    // The ledger and the workers agree on every lane with nothing in flight.
    for (const auto& lane : state.lanes) {
      if (lane->gone || lane->rows_in_flight > 0) continue;
      if (group.positions(lane->id) < 0) continue;  // admitted, not yet fed
      EXPECT_EQ(lane->fed, group.positions(lane->id)) << c.name << " lane " << lane->id;
      const int64_t want = std::max(lane->fed, lane->prompt_len);
      EXPECT_EQ(static_cast<int64_t>((*kv)->BlockTable(lane->id)->size()),
                (want + c.block_size - 1) / c.block_size)
          << c.name << " lane " << lane->id;
    }
    for (const std::string& e : group.errors()) ADD_FAILURE() << c.name << ": " << e;
    if (!group.errors().empty()) break;
  }
  EXPECT_TRUE(all_done()) << c.name << ": not finished after " << round << " steps";
  for (auto& r : reqs) {
    EXPECT_FALSE(r->failed) << c.name;
    outcome.tokens.push_back(r->choices[0].generated);
  }
  outcome.drafts_seen = group.drafts_seen();
  outcome.drafts_accepted = group.drafts_accepted();
  outcome.rows_voided = group.rows_voided();
  outcome.prefix_rows = group.prefix_rows();
  // Every block is back: free or cached.
  const KvBlockStats st = (*kv)->stats();
  EXPECT_EQ(st.free_blocks + st.evictable_blocks, c.num_blocks) << c.name;
  return outcome;
}

std::vector<Case> Cases() {
  return {
      {.name = "one lane prefill then decode", .requests = {{.prompt_len = 10, .max_tokens = 6}}},
      {.name = "admission in arrival order, staggered",
       .requests = {{.prompt_len = 9, .max_tokens = 7},
                    {.prompt_len = 5, .max_tokens = 9, .arrival_round = 3},
                    {.prompt_len = 13, .max_tokens = 4, .arrival_round = 5}}},
      {.name = "max_lanes holds back the rest",
       .requests = {{.prompt_len = 6, .max_tokens = 5},
                    {.prompt_len = 6, .max_tokens = 5},
                    {.prompt_len = 6, .max_tokens = 5},
                    {.prompt_len = 6, .max_tokens = 5}},
       .max_lanes = 2},
      {.name = "token budget chunks a long prompt",
       .requests = {{.prompt_len = 70, .max_tokens = 3}, {.prompt_len = 5, .max_tokens = 8}},
       .num_blocks = 128,
       .budget = 16},
      {.name = "chunk sizing under the ITL target",
       .requests = {{.prompt_len = 6, .max_tokens = 60},
                    {.prompt_len = 200, .max_tokens = 2, .arrival_round = 8}},
       .num_blocks = 128,
       .budget = 256,
       .itl_target_ms = 20,
       .min_chunk = 4,
       // 2 ms + 0.5 ms per token under 20 ms: at most 36 tokens.
       .max_mixed_round_tokens = 36},
      {.name = "pipeline depth 1",
       .requests = {{.prompt_len = 7, .max_tokens = 6}, {.prompt_len = 5, .max_tokens = 6}},
       .depth = 1},
      {.name = "lanes stop mid-pipeline",
       .requests = {{.prompt_len = 7, .max_tokens = 40, .stop_token = 10},
                    {.prompt_len = 9, .max_tokens = 40, .stop_token = 20},
                    {.prompt_len = 4, .max_tokens = 3}}},
      {.name = "preemption when the pool runs out",
       .requests = {{.prompt_len = 8, .max_tokens = 20},
                    {.prompt_len = 8, .max_tokens = 20},
                    {.prompt_len = 8, .max_tokens = 20}},
       .num_blocks = 14,
       .expect_preemption = true},
      {.name = "prefix hit of an identical resend",
       .requests =
           {{.prompt_len = 17, .max_tokens = 4, .family = 1, .shared = 17},
            {.prompt_len = 17, .max_tokens = 4, .arrival_round = 12, .family = 1, .shared = 17}},
       .expect_prefix_hit = true},
      {.name = "shared prefix, different tails",
       .requests =
           {{.prompt_len = 20, .max_tokens = 5, .family = 2, .shared = 12},
            {.prompt_len = 20, .max_tokens = 5, .arrival_round = 10, .family = 2, .shared = 12}},
       .expect_prefix_hit = true},
      {.name = "prefix hit with drafts",
       .requests =
           {{.prompt_len = 17, .max_tokens = 6, .family = 3, .shared = 13},
            {.prompt_len = 17, .max_tokens = 6, .arrival_round = 12, .family = 3, .shared = 13}},
       .max_drafts = 3,
       .expect_prefix_hit = true},
      {.name = "verify rows, drafts partly rejected",
       .requests = {{.prompt_len = 6, .max_tokens = 30},
                    {.prompt_len = 9, .max_tokens = 25, .arrival_round = 2}},
       .max_drafts = 4,
       .wrong_every = 3,
       .expect_voided = true,
       .expect_drafts_rejected = true,
       .expect_fewer_rounds = true},
      {.name = "verify rows with pipelined prefill beside them",
       .requests = {{.prompt_len = 5, .max_tokens = 20},
                    {.prompt_len = 40, .max_tokens = 12, .arrival_round = 4},
                    {.prompt_len = 7, .max_tokens = 16, .arrival_round = 6, .stop_token = 30}},
       .budget = 24,
       .max_drafts = 3,
       .wrong_every = 2,
       .expect_drafts_rejected = true},
      {.name = "pipelined verify rows, three rounds in flight",
       .requests = {{.prompt_len = 6, .max_tokens = 30},
                    {.prompt_len = 9, .max_tokens = 25, .arrival_round = 2}},
       .depth = 3,
       .max_drafts = 4,
       .wrong_every = 3,
       .expect_voided = true,
       .expect_drafts_rejected = true},
      {.name = "verify rows under preemption",
       .requests = {{.prompt_len = 8, .max_tokens = 24},
                    {.prompt_len = 8, .max_tokens = 24},
                    {.prompt_len = 8, .max_tokens = 24}},
       .num_blocks = 16,
       .max_drafts = 5,
       .wrong_every = 4,
       .expect_voided = true,
       .expect_preemption = true,
       .expect_drafts_rejected = true},
  };
}

class PlannerTableTest : public ::testing::TestWithParam<Case> {};

TEST_P(PlannerTableTest, EveryChoiceEqualsItsSoloRunAndTheLedgerMatchesTheWorkers) {
  const Case& c = GetParam();
  const Outcome plain = RunCase(c, /*with_drafts=*/false);
  ASSERT_EQ(plain.tokens.size(), c.requests.size());
  for (size_t i = 0; i < c.requests.size(); ++i) {
    std::vector<int32_t> want =
        FakeReference(PromptOf(c.requests[i], static_cast<int>(i)), c.requests[i].max_tokens);
    if (c.requests[i].stop_token >= 0) {
      auto it = std::find(want.begin(), want.end(), c.requests[i].stop_token);
      if (it != want.end()) want.erase(it + 1, want.end());
    }
    EXPECT_EQ(plain.tokens[i], want) << c.name << " request " << i;
  }
  if (c.expect_preemption) {
    EXPECT_GT(plain.preemptions, 0) << c.name;
  }
  if (c.expect_prefix_hit) {
    EXPECT_GT(plain.cached_tokens, 0) << c.name;
  }
  // Speculation on gives the same tokens, in fewer rounds, with a drafter
  // that waits for a row in flight and with one that drafts behind it.
  for (const bool pipelined : {false, true}) {
    if (c.max_drafts == 0) break;
    const Outcome spec = RunCase(c, /*with_drafts=*/true, pipelined);
    const std::string what = absl::StrCat(c.name, pipelined ? ", pipelined drafts" : "");
    EXPECT_EQ(spec.tokens, plain.tokens) << what;
    EXPECT_GT(spec.drafts_accepted, 0) << what;
    if (c.expect_drafts_rejected) {
      EXPECT_LT(spec.drafts_accepted, spec.drafts_seen) << what;
    }
    if (c.expect_fewer_rounds) {
      EXPECT_LT(spec.rounds, plain.rounds) << what;
    }
    if (c.expect_voided && pipelined) {
      EXPECT_GT(spec.rows_voided, 0) << what;
    }
    // A lane that starts on cached blocks tells the draft model their
    // tokens (the fake checks them against the pool's prefix hashes).
    if (c.expect_prefix_hit) {
      EXPECT_GT(spec.prefix_rows, 0) << what;
    }
  }
  // Without speculation no row carries them.
  EXPECT_EQ(plain.prefix_rows, 0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, PlannerTableTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n;
                           for (char ch : info.param.name) n += std::isalnum(ch) ? ch : '_';
                           return n;
                         });

// A plan the workers rejected fails the requests of the lanes it fed.
TEST(ApplierTest, RejectedRoundFailsItsLanes) {
  auto kv = KvBlockManager::Create(
      {.num_blocks = 8,
       .identity = {
           .model_id = "fake", .kv_dtype = "f32", .block_size_tokens = 4, .tp_world_size = 1}});
  ASSERT_TRUE(kv.ok());
  SchedState state;
  auto r = std::make_shared<RequestState>();
  r->queue = std::make_shared<ResponseQueue>();
  r->p.prompt = {5, 6, 7};
  r->p.max_tokens = 4;
  r->choices.resize(1);
  r->choices_left = 1;
  state.waiting.push_back({r, 0});
  RoundCostModel cost;
  PlannedRound planned;
  PlanRound(state, **kv, cost, {.round_token_budget = 16}, nullptr, &planned);
  ASSERT_EQ(planned.plan.rows_size(), 1);
  v1::RoundResult result;
  result.set_round_id(planned.plan.round_id());
  result.mutable_error()->set_code(3);
  result.mutable_error()->set_message("bad plan");
  RecordingSink sink({});
  ApplyRoundResult(planned, result, state, **kv, sink, {});
  EXPECT_TRUE(r->failed);
  std::vector<v1::GenerateResponse> msgs;
  absl::Status st;
  EXPECT_TRUE(r->queue->Take(absl::ZeroDuration(), &msgs, &st));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace ringlane::router
