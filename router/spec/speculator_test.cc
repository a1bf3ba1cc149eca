// The draft sources and the speculator's decisions, over a scripted "model"
// whose next token the test knows: what each source proposes, how deep the
// adaptive depth goes alone and under load, that a source which is always
// wrong stops drafting (probes aside), per-request opt-out and limits, and
// that per-lane state goes with its lane. Exactness is not tested here: it
// does not depend on drafts (tests/speculative_e2e_test.cc checks it on real
// workers).
#include "router/spec/speculator.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/sched/lane.h"
#include "router/spec/draft_sources.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;

DraftSourceOptions SourceOptions() {
  DraftSourceOptions o;
  o.vocab_size = 512;
  return o;
}

TEST(DraftSourcesTest, NgramCopiesTheLatestEarlierOccurrenceAndContinuesAPeriod) {
  auto ngram = MakeDraftSource("ngram", SourceOptions(), nullptr);
  ASSERT_NE(ngram, nullptr);
  const std::vector<int32_t> copy = {1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3};
  EXPECT_THAT(ngram->Propose(1, copy, 4).tokens, ElementsAre(4, 5, 6, 9));
  const std::vector<int32_t> period = {7, 8, 7, 8, 7};
  EXPECT_THAT(ngram->Propose(2, period, 5).tokens, ElementsAre(8, 7, 8, 7, 8));
  const std::vector<int32_t> fresh = {1, 2, 3, 4, 5};
  EXPECT_TRUE(ngram->Propose(3, fresh, 4).tokens.empty());
  EXPECT_EQ(ngram->lanes(), 3u);
  ngram->Forget(1);
  EXPECT_EQ(ngram->lanes(), 2u);
}

TEST(DraftSourcesTest, SuffixProposesAnEarlierOutputAfterTheSamePrompt) {
  auto cache = std::make_shared<SuffixCache>(24, 1000);
  auto suffix = MakeDraftSource("suffix", SourceOptions(), cache);
  std::vector<int32_t> first = {10, 11, 12, 13, 40, 41, 42, 43, 44, 45};
  suffix->Finished(first, 4);
  // A resend of the prompt: the global cache knows what followed it, as deep
  // as the match is long (factor 2 on a 4-token match, within the limit).
  const std::vector<int32_t> resend = {10, 11, 12, 13};
  Proposal p = suffix->Propose(7, resend, 16);
  EXPECT_EQ(p.match_length, 4);
  EXPECT_THAT(p.tokens, ElementsAre(40, 41, 42, 43, 44, 45));
  // The cache forgets the oldest output past its size.
  for (int i = 0; i < 200; ++i) suffix->Finished({1, 2, 3, 4, 5, 6, 7, 8, 9}, 4);
  EXPECT_LE(cache->tokens(), 1000);
  EXPECT_TRUE(suffix->Propose(8, resend, 16).tokens.empty());
}

TEST(DraftSourcesTest, RandomIsDeterministic) {
  auto a = MakeDraftSource("random", SourceOptions(), nullptr);
  auto b = MakeDraftSource("random", SourceOptions(), nullptr);
  const std::vector<int32_t> seq = {1, 2, 3};
  EXPECT_EQ(a->Propose(1, seq, 6).tokens, b->Propose(1, seq, 6).tokens);
  EXPECT_EQ(a->Propose(1, seq, 6).tokens.size(), 6u);
  EXPECT_EQ(MakeDraftSource("nope", SourceOptions(), nullptr), nullptr);
}

// A lane of a "model" that repeats `period` forever, after a prompt that
// already shows it: ngram drafts are always right, random ones never.
struct ScriptedLane {
  explicit ScriptedLane(LaneId id, std::vector<int32_t> period_tokens) : period(period_tokens) {
    lane.id = id;
    lane.req = std::make_shared<RequestState>();
    for (int i = 0; i < 3; ++i) lane.seq.insert(lane.seq.end(), period.begin(), period.end());
    lane.req->p.prompt = lane.seq;
    lane.prompt_len = static_cast<int64_t>(lane.seq.size());
    lane.fed = lane.prompt_len;
  }
  int32_t Next() const {
    const size_t pos = lane.seq.size();
    // A token never seen before, at pseudo-random positions: no source can
    // learn where it comes.
    if (noise_every > 0 && (pos * 2654435761u >> 7) % noise_every == 0) {
      return static_cast<int32_t>(1000 + pos);
    }
    return period[pos % period.size()];
  }
  // Verifies `drafts` as the workers would; appends what the row emits.
  int Verify(const std::vector<int32_t>& drafts) {
    int accepted = 0;
    while (accepted < static_cast<int>(drafts.size()) && drafts[accepted] == Next()) {
      lane.seq.push_back(drafts[accepted++]);
    }
    lane.seq.push_back(Next());
    return accepted;
  }
  std::vector<int32_t> period;
  // About one position in noise_every holds a fresh token instead (0 =
  // never): the period's drafts fail there.
  size_t noise_every = 0;
  Lane lane;
};

// `gate`: the measured gate (draft_gate.h), which starts closed until it
// has seen plain rounds of the size; the tests of the depth rule go without.
std::unique_ptr<Speculator> Make(std::vector<std::string> sources, int max_drafts = 8,
                                 bool adaptive = true, bool gate = false) {
  SpeculatorOptions o;
  o.sources = std::move(sources);
  o.max_drafts = max_drafts;
  o.adaptive = adaptive;
  o.gate = gate;
  o.source_options = SourceOptions();
  auto s = Speculator::Create(o, std::make_shared<SuffixCache>(24, 4096));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// A cost model fitted to rounds of fixed + per_token * tokens.
RoundCostModel CostOf(double fixed_us, double per_token_us) {
  RoundCostModel m;
  for (int i = 0; i < 200; ++i) {
    const int64_t tokens = 1 + i % 40;
    m.Observe(tokens, fixed_us + per_token_us * static_cast<double>(tokens));
  }
  return m;
}

// A cost model that has measured rounds of 1..sizes tokens costing
// cost(tokens) each.
template <class Cost>
RoundCostModel MeasuredCosts(Cost cost, int64_t sizes) {
  RoundCostModel m;
  for (int64_t i = 0; i < 400 * sizes / 12; ++i) {
    const int64_t tokens = 1 + i % sizes;
    m.Observe(tokens, cost(tokens));
  }
  return m;
}

// Round costs of a CPU worker: 1000 us for one token, `cheap` more per token
// up to `knee` tokens (the weights are read once), `dear` more per token
// past it.
auto KneeCost(int64_t knee, double cheap, double dear) {
  return [=](int64_t tokens) {
    const double t = static_cast<double>(tokens), k = static_cast<double>(knee);
    return tokens <= knee ? 1000.0 + cheap * (t - 1) : 1000.0 + cheap * (k - 1) + dear * (t - k);
  };
}

// Runs `rows` decode rows of one lane; returns the drafts per row.
std::vector<int> RunRows(Speculator& spec, ScriptedLane& l, const DraftContext& ctx, int rows) {
  std::vector<int> depths;
  for (int i = 0; i < rows; ++i) {
    spec.BeginRound(ctx.decoding_lanes);
    DraftDecision d = spec.Plan(l.lane, ctx);
    spec.EndRound();
    EXPECT_FALSE(d.wait);
    depths.push_back(static_cast<int>(d.tokens.size()));
    const int accepted = l.Verify(d.tokens);
    if (!d.tokens.empty()) {
      spec.OnVerified(l.lane.id, d.source, static_cast<int>(d.tokens.size()), accepted);
    }
  }
  return depths;
}

TEST(SpeculatorTest, DraftsDeepAloneAndShallowerUnderLoad) {
  const RoundCostModel cost = CostOf(10000, 100);  // a token is 1% of a round
  DraftContext alone{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  auto spec = Make({"ngram"});
  ScriptedLane l(1, {5, 6, 7, 8, 9, 10, 11});
  std::vector<int> depths = RunRows(*spec, l, alone, 20);
  EXPECT_EQ(depths.back(), 8);  // always right: as deep as allowed

  // Drafts right about three times in four, a token 10% of a round: deep
  // alone, none when 30 lanes share the round.
  const RoundCostModel dear = CostOf(10000, 1000);
  DraftContext one{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &dear};
  DraftContext crowded = one;
  crowded.decoding_lanes = 30;
  auto alone_spec = Make({"ngram"});
  auto crowded_spec = Make({"ngram"});
  ScriptedLane a(2, {5, 6, 7, 8, 9}), c(2, {5, 6, 7, 8, 9});
  a.noise_every = c.noise_every = 4;
  const std::vector<int> d1 = RunRows(*alone_spec, a, one, 40);
  const std::vector<int> d30 = RunRows(*crowded_spec, c, crowded, 40);
  int deep = 0, shallow = 0;
  for (int i = 20; i < 40; ++i) {
    deep += d1[i];
    shallow += d30[i];
  }
  EXPECT_GT(deep, 2 * shallow) << deep << " vs " << shallow;
  // Alone, three in four right: expected tokens per unit of round time peak
  // at 3 to 5 drafts (not the 8 allowed), on the rows that have a match.
  EXPECT_GT(deep, 12);
}

// Rounds whose cost is not linear in their size, as a CPU worker's are: up
// to 5 tokens cost little more than one (the weights are read once), past
// that each costs 45% of a round. An always-right lane alone drafts 4 (5
// positions), where a linear fit of the same rounds would draft 8; with a
// linear table it drafts 8.
TEST(SpeculatorTest, DepthFollowsTheMeasuredCostOfEachRoundSize) {
  const RoundCostModel measured = MeasuredCosts(KneeCost(5, 180, 450), 12);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &measured};
  auto spec = Make({"ngram"});
  ScriptedLane l(1, {5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(RunRows(*spec, l, ctx, 20).back(), 4);

  const RoundCostModel linear = CostOf(1000, 180);
  ctx.cost = &linear;
  auto spec2 = Make({"ngram"});
  ScriptedLane l2(2, {5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(RunRows(*spec2, l2, ctx, 20).back(), 8);
}

// Five always-right lanes in one round whose positions are cheap up to 12
// and dear past that (each a whole round's worth). A lane planned alone would
// draft 7 (12 positions with the other 4 lanes' rows); planned as if the
// others drafted nothing, all five did, a round of 40 positions that costs
// 25x a 5-token round for 8x its tokens. Counting the drafts planned before
// it, only the first lane drafts.
TEST(SpeculatorTest, LaterLanesOfARoundCountTheDraftsBeforeThem) {
  const RoundCostModel measured = MeasuredCosts(KneeCost(12, 50, 1000), 48);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 5, .row_in_flight = false, .cost = &measured};
  auto made = Make({"ngram"});
  ASSERT_NE(made, nullptr);
  Speculator* spec = made.get();
  std::vector<ScriptedLane> lanes;
  for (int i = 0; i < 5; ++i) lanes.emplace_back(i + 1, std::vector<int32_t>{5, 6, 7, 8, 9, 10});
  std::vector<int> last(5);
  for (int round = 0; round < 20; ++round) {
    spec->BeginRound(5);
    for (int i = 0; i < 5; ++i) {
      DraftDecision d = spec->Plan(lanes[i].lane, ctx);
      last[i] = static_cast<int>(d.tokens.size());
      const int accepted = lanes[i].Verify(d.tokens);
      if (!d.tokens.empty()) {
        spec->OnVerified(lanes[i].lane.id, d.source, static_cast<int>(d.tokens.size()), accepted);
      }
    }
    spec->EndRound();
  }
  EXPECT_EQ(last[0], 7);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(last[i], 0) << "lane " << i;
}

TEST(SpeculatorTest, AnAlwaysWrongSourceStopsDrafting) {
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  auto spec = Make({"random"});
  ScriptedLane l(1, {5, 6, 7});
  const std::vector<int> depths = RunRows(*spec, l, ctx, 4000);
  int drafting_rows = 0;
  for (size_t i = 1000; i < depths.size(); ++i) drafting_rows += depths[i] > 0;
  // Probes only: the interval doubles to 1024 rows.
  EXPECT_LE(drafting_rows, 4);
  EXPECT_LT(spec->SourceAcceptance(0), 0.15);
  // Pipelined (a row in flight at every decision), it keeps the pipeline
  // but for its probes.
  DraftContext in_flight = ctx;
  in_flight.row_in_flight = true;
  int waits = 0;
  for (int i = 0; i < 2000; ++i) {
    spec->BeginRound(1);
    const bool wait = spec->Plan(l.lane, in_flight).wait;
    spec->EndRound();
    if (wait) {
      ++waits;
      RunRows(*spec, l, ctx, 1);  // the row after the result drafts
    } else {
      l.Verify({});
    }
  }
  EXPECT_LE(waits, 3);
}

TEST(SpeculatorTest, WaitsForTheRowInFlightOnlyWhenDraftingPays) {
  const RoundCostModel cost = CostOf(10000, 100);
  auto spec = Make({"ngram"});
  ScriptedLane l(1, {5, 6, 7, 8, 9});
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = true, .cost = &cost};
  spec->BeginRound(1);
  DraftDecision d = spec->Plan(l.lane, ctx);
  EXPECT_TRUE(d.wait);
  EXPECT_TRUE(d.tokens.empty());
}

// Once its drafts are known to be right, a lane drafts behind its row in
// flight instead of waiting: the drafts continue the row's own (assumed
// accepted), past a guess of the row's last sample.
TEST(SpeculatorTest, ARightSourceDraftsBehindTheRowInFlight) {
  const RoundCostModel cost = CostOf(10000, 100);
  auto spec = Make({"ngram"});
  ScriptedLane l(1, {5, 6, 7, 8, 9});
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  RunRows(*spec, l, ctx, 30);  // always right
  // The row in flight follows seq with drafts d1 d2 (the period); its last
  // sample is the period's next token, then the drafts go on from there.
  std::vector<int32_t> assumed;
  for (size_t pos = l.lane.seq.size(); assumed.size() < 2; ++pos) {
    assumed.push_back(l.period[pos % l.period.size()]);
  }
  const size_t after = l.lane.seq.size() + assumed.size() + 1;
  ctx.row_in_flight = true;
  ctx.assumed = assumed;
  spec->BeginRound(1);
  DraftDecision d = spec->Plan(l.lane, ctx);
  spec->EndRound();
  EXPECT_FALSE(d.wait);
  ASSERT_GE(d.tokens.size(), 4u);
  for (size_t j = 0; j < d.tokens.size(); ++j) {
    EXPECT_EQ(d.tokens[j], l.period[(after + j) % l.period.size()]) << "draft " << j;
  }
  // The workers' draft model cannot draft before the row's result.
  auto model = Make({"model"});
  ScriptedLane m(2, {5, 6, 7});
  model->BeginRound(1);
  d = model->Plan(m.lane, ctx);
  EXPECT_TRUE(d.tokens.empty());
}

// Acceptance that comes in runs: a lane whose rows after a fully accepted
// one are nearly always right drafts behind its row in flight, though its
// drafts overall fail often (a guessed sample and a void row per rejection
// would not pay at the overall rate).
TEST(SpeculatorTest, RunsOfAcceptanceLetALoneLaneDraftBehindItsRow) {
  const RoundCostModel cost = CostOf(10000, 100);
  auto spec = Make({"ngram"});
  ScriptedLane l(1, {5, 6, 7, 8, 9, 10, 11});
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  // Runs of six rows whose drafts are all right, then four whose drafts
  // all fail, booked by hand (OnVerified); the lane has just come back to
  // a right one.
  spec->BeginRound(1);
  ASSERT_FALSE(spec->Plan(l.lane, ctx).tokens.empty());
  spec->EndRound();
  for (int run = 0; run < 8; ++run) {
    for (int i = 0; i < 6; ++i) spec->OnVerified(l.lane.id, 0, 2, 2);
    for (int i = 0; i < 4; ++i) spec->OnVerified(l.lane.id, 0, 2, 0);
  }
  spec->OnVerified(l.lane.id, 0, 2, 2);
  std::vector<int32_t> assumed = {l.period[l.lane.seq.size() % l.period.size()]};
  ctx.row_in_flight = true;
  ctx.assumed = assumed;
  spec->BeginRound(1);
  const DraftDecision d = spec->Plan(l.lane, ctx);
  spec->EndRound();
  EXPECT_FALSE(d.wait);
  EXPECT_GE(d.tokens.size(), 2u);
}

TEST(DraftSourcesTest, AnAssumedTailIsMatchedButNeverIndexed) {
  for (const char* name : {"ngram", "suffix"}) {
    auto src = MakeDraftSource(name, SourceOptions(), nullptr);
    const std::vector<int32_t> seq = {1, 2, 3, 4, 9, 9, 1, 2};
    // Context 1 2 | 3 4: continues as the first occurrence did.
    EXPECT_THAT(src->ProposeAfter(1, seq, std::vector<int32_t>{3, 4}, 2).tokens, ElementsAre(9, 9))
        << name;
    // The tail 7 7 was never kept: after the known seq alone, 1 2 -> 3 4.
    EXPECT_THAT(src->ProposeAfter(1, seq, std::vector<int32_t>{7, 7}, 2).tokens,
                ::testing::IsEmpty())
        << name;
    EXPECT_THAT(src->Propose(1, seq, 2).tokens, ElementsAre(3, 4)) << name;
  }
}

TEST(SpeculatorTest, PerRequestOptOutAndLimit) {
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  auto spec = Make({"ngram"}, 8, /*adaptive=*/false);
  spec->BeginRound(1);
  ScriptedLane off(1, {5, 6, 7});
  off.lane.req->p.speculative = false;
  EXPECT_TRUE(spec->Plan(off.lane, ctx).tokens.empty());
  ScriptedLane capped(2, {5, 6, 7});
  capped.lane.req->p.max_drafts = 3;
  EXPECT_EQ(spec->Plan(capped.lane, ctx).tokens.size(), 3u);
  ScriptedLane zero(3, {5, 6, 7});
  zero.lane.req->p.max_drafts = 0;
  EXPECT_TRUE(spec->Plan(zero.lane, ctx).tokens.empty());
  // The planner's own cap (budget, max_tokens) wins too.
  spec->BeginRound(1);
  ctx.max_drafts = 2;
  EXPECT_EQ(spec->Plan(capped.lane, ctx).tokens.size(), 2u);
}

TEST(SpeculatorTest, SweepDropsStateOfLanesThatAreGone) {
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  auto spec = Make({"ngram", "suffix"});
  SchedState state;
  std::vector<std::unique_ptr<ScriptedLane>> lanes;
  for (LaneId id = 1; id <= 4; ++id) {
    lanes.push_back(std::make_unique<ScriptedLane>(id, std::vector<int32_t>{5, 6, 7}));
    spec->BeginRound(1);
    spec->Plan(lanes.back()->lane, ctx);
    auto copy = std::make_unique<Lane>();
    copy->id = id;
    copy->gone = id % 2 == 0;
    state.lanes.push_back(std::move(copy));
  }
  EXPECT_EQ(spec->lanes(), 4u);
  spec->Sweep(state);
  EXPECT_EQ(spec->lanes(), 2u);
}

TEST(DraftSourcesTest, ModelProposalsCountOnlyForTheSequenceTheyFollow) {
  auto model = MakeDraftSource("model", SourceOptions(), nullptr);
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->worker_proposed());
  std::vector<int32_t> seq = {1, 2, 3};
  // Nothing proposed yet: placeholders, as deep as asked.
  Proposal p = model->Propose(1, seq, 5);
  EXPECT_TRUE(p.pending);
  EXPECT_EQ(p.tokens.size(), 5u);
  const std::vector<int32_t> drafts = {4, 5, 6};
  model->OnProposed(1, 3, drafts);
  p = model->Propose(1, seq, 5);
  EXPECT_FALSE(p.pending);
  EXPECT_THAT(p.tokens, ElementsAre(4, 5, 6));
  EXPECT_THAT(model->Propose(1, seq, 2).tokens, ElementsAre(4, 5));
  // The sequence moved on (a pipelined row): pending, about as deep as the
  // last proposal.
  seq.push_back(4);
  p = model->Propose(1, seq, 8);
  EXPECT_TRUE(p.pending);
  EXPECT_EQ(p.tokens.size(), 3u);
  model->Forget(1);
  EXPECT_EQ(model->lanes(), 0u);
}

// The planner's and workers' protocol for the model source, unpipelined:
// Plan, ProposeDepth for the row, the row's result, then the proposal that
// came with it. `right`: proposals continue the lane's period; otherwise
// they are never right. Returns the drafts carried and the tokens asked.
std::pair<std::vector<int>, std::vector<int>> RunModelRows(Speculator& spec, ScriptedLane& l,
                                                           const DraftContext& ctx, int rows,
                                                           bool right) {
  std::vector<int> carried, asked;
  for (int i = 0; i < rows; ++i) {
    spec.BeginRound(ctx.decoding_lanes);
    DraftDecision d = spec.Plan(l.lane, ctx);
    const int depth = spec.ProposeDepth(l.lane, ctx.max_drafts);
    spec.EndRound();
    carried.push_back(static_cast<int>(d.tokens.size()));
    asked.push_back(depth);
    const int accepted = l.Verify(d.tokens);
    if (!d.tokens.empty()) {
      spec.OnVerified(l.lane.id, d.source, static_cast<int>(d.tokens.size()), accepted);
    }
    std::vector<int32_t> proposal;
    for (int j = 0; j < depth; ++j) {
      const size_t pos = l.lane.seq.size() + static_cast<size_t>(j);
      proposal.push_back(right ? l.period[pos % l.period.size()] : 2000 + j);
    }
    spec.OnProposed(l.lane.id, static_cast<int64_t>(l.lane.seq.size()), proposal);
  }
  return {carried, asked};
}

TEST(SpeculatorTest, ModelDraftsDeepWhenRightAndIsAskedForAlmostNothingWhenWrong) {
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  auto good = Make({"model"});
  ScriptedLane g(1, {5, 6, 7, 8, 9, 10, 11});
  auto [carried, asked] = RunModelRows(*good, g, ctx, 40, /*right=*/true);
  EXPECT_EQ(carried.back(), 8);
  EXPECT_EQ(asked.back(), 8);

  auto bad = Make({"model"});
  ScriptedLane b(2, {5, 6, 7});
  auto [bad_carried, bad_asked] = RunModelRows(*bad, b, ctx, 4000, /*right=*/false);
  int drafting = 0, tokens_asked = 0;
  for (size_t i = 1000; i < bad_asked.size(); ++i) {
    drafting += bad_carried[i] > 0;
    tokens_asked += bad_asked[i];
  }
  // Probes only (the interval doubles to 1024 rows), each asking for two
  // tokens the row before it and three on its own row (plus two before a
  // probe past the end): asks come only around probes.
  EXPECT_LE(drafting, 4);
  EXPECT_LE(tokens_asked, 5 * drafting + 2);
  EXPECT_GT(tokens_asked, 0);
  // Opted out: never asked.
  ScriptedLane off(3, {5, 6, 7});
  off.lane.req->p.speculative = false;
  EXPECT_EQ(bad->ProposeDepth(off.lane, 8), 0);
  // Without the model source nothing is ever asked.
  auto ngram = Make({"ngram"});
  EXPECT_EQ(ngram->ProposeDepth(g.lane, 8), 0);
}

TEST(SpeculatorTest, ADraftModelIsChargedForItsProposals) {
  // Always right; a target token costs 1% of a round. A draft model that is
  // cheap to run drafts as deep as allowed, alone and with five lanes.
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext alone{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = false, .cost = &cost};
  DraftContext five = alone;
  five.decoding_lanes = 5;
  auto cheap = Make({"model"});
  cheap->ObserveDraftCost(8 * 50, 8);
  EXPECT_DOUBLE_EQ(cheap->DraftUsPerToken(), 50);
  ScriptedLane c1(1, {5, 6, 7, 8, 9, 10, 11}), c5(2, {5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(RunModelRows(*cheap, c1, alone, 40, /*right=*/true).first.back(), 8);
  EXPECT_EQ(RunModelRows(*cheap, c5, five, 40, /*right=*/true).first.back(), 8);

  // A proposed token costing 40% of a round pays alone (less than the
  // round's cost per token), not with five lanes sharing the round (there a
  // token costs a fifth of it): only probes, two drafts each.
  auto mid = Make({"model"});
  mid->ObserveDraftCost(8 * 4000, 8);
  ScriptedLane m1(3, {5, 6, 7, 8, 9, 10, 11}), m5(4, {5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(RunModelRows(*mid, m1, alone, 40, /*right=*/true).first.back(), 8);
  const std::vector<int> mid_five = RunModelRows(*mid, m5, five, 200, /*right=*/true).first;
  int probes = 0;
  for (size_t i = 100; i < mid_five.size(); ++i) {
    EXPECT_LE(mid_five[i], 2) << "row " << i;
    probes += mid_five[i] > 0;
  }
  EXPECT_LE(probes, 100 / 8 + 1);

  // As dear as two rounds: only the probes draft, two tokens each.
  auto dear = Make({"model"});
  dear->ObserveDraftCost(8 * 20000, 8);
  ScriptedLane d1(5, {5, 6, 7, 8, 9, 10, 11});
  const std::vector<int> carried = RunModelRows(*dear, d1, alone, 200, /*right=*/true).first;
  int drafting = 0;
  for (size_t i = 100; i < carried.size(); ++i) {
    EXPECT_LE(carried[i], 2) << "row " << i;
    drafting += carried[i] > 0;
  }
  EXPECT_LE(drafting, 100 / 8 + 1);
}

// One round through the speculator as the planner and group loop drive it:
// BeginRound, Plan and ProposeDepth for `l`, EndRound, the workers' verify
// (and, for a model source, an always-right proposal), and the result giving
// `drafting_tokens` or `plain_tokens` in 1000 us. Returns the drafts carried
// and whether the gate allowed drafting.
struct Gated {
  int drafts = 0;
  int asked = 0;
  bool allowed = false;
};
Gated GatedRound(Speculator& spec, ScriptedLane& l, const DraftContext& ctx, int drafting_tokens,
                 int plain_tokens) {
  spec.BeginRound(ctx.decoding_lanes);
  const DraftDecision d = spec.Plan(l.lane, ctx);
  const int depth = spec.ProposeDepth(l.lane, ctx.max_drafts);
  const DraftRoundTag tag = spec.EndRound();
  const int accepted = l.Verify(d.tokens);
  if (!d.tokens.empty()) {
    spec.OnVerified(l.lane.id, d.source, static_cast<int>(d.tokens.size()), accepted);
  }
  std::vector<int32_t> proposal;
  for (int j = 0; j < depth; ++j) {
    proposal.push_back(l.period[(l.lane.seq.size() + static_cast<size_t>(j)) % l.period.size()]);
  }
  if (depth > 0) spec.OnProposed(l.lane.id, static_cast<int64_t>(l.lane.seq.size()), proposal);
  RoundObservation o;
  o.period_us = 1000;
  o.draft_tag = tag.tag;
  o.tokens = d.tokens.empty() ? plain_tokens : drafting_tokens;
  spec.ObserveRound(o);
  return {static_cast<int>(d.tokens.size()), depth, tag.drafting_allowed};
}

TEST(SpeculatorTest, StopsDraftingAtALaneCountWhereRoundsWithDraftsGaveFewerTokens) {
  // The cost model says always-right drafts pay with five lanes (a token is
  // 1% of a round), but on this worker rounds with drafting give 4 tokens a
  // millisecond and rounds without 5 (compute-bound): the measured gate
  // stops drafting at five lanes, and only there.
  const RoundCostModel cost = CostOf(10000, 100);
  DraftContext five{.max_drafts = 8, .decoding_lanes = 5, .row_in_flight = false, .cost = &cost};
  for (const char* source : {"ngram", "model"}) {
    SCOPED_TRACE(source);
    auto spec = Make({source}, 8, /*adaptive=*/true, /*gate=*/true);
    ScriptedLane l(1, {5, 6, 7, 8, 9, 10, 11});
    int drafted = 0, allowed = 0, asked = 0;
    for (int i = 0; i < 400; ++i) {
      const Gated g = GatedRound(*spec, l, five, 4, 5);
      drafted += g.drafts > 0;
      allowed += g.allowed;
      if (!g.allowed) asked += g.asked;
    }
    EXPECT_FALSE(spec->gate().IsOpen(5));
    EXPECT_LT(drafted, 60);
    EXPECT_LT(allowed, 60);
    // The draft model is not asked for proposals while the gate is closed.
    EXPECT_EQ(asked, 0);
    EXPECT_DOUBLE_EQ(spec->gate().TokensPerSecond(5, DraftGate::Regime::kPlain), 5000);
    // A lone lane drafts, once its bucket has seen plain decode.
    DraftContext alone = five;
    alone.decoding_lanes = 1;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(GatedRound(*spec, l, alone, 4, 1).drafts, 0);
    // (The draft model is asked in the first open round, drafts in the next.)
    const int first = GatedRound(*spec, l, alone, 4, 1).drafts;
    EXPECT_GT(std::max(first, GatedRound(*spec, l, alone, 4, 1).drafts), 0);
  }
  // --spec_gate=false: the round-cost model alone decides, and drafts.
  auto model_only = Make({"ngram"});
  ScriptedLane u(2, {5, 6, 7, 8, 9, 10, 11});
  int ungated_drafts = 0;
  for (int i = 0; i < 400; ++i) ungated_drafts += GatedRound(*model_only, u, five, 4, 5).drafts > 0;
  EXPECT_GT(ungated_drafts, 300);
  // Without adaptive depth rounds are not gated.
  auto always = Make({"ngram"}, 8, /*adaptive=*/false);
  always->BeginRound(5);
  EXPECT_EQ(always->EndRound().tag, -1);
}

TEST(SpeculatorTest, WaitsForModelDraftsOfTheRowInFlight) {
  const RoundCostModel cost = CostOf(10000, 100);
  auto spec = Make({"model"});
  ScriptedLane l(1, {5, 6, 7, 8, 9});
  DraftContext ctx{.max_drafts = 8, .decoding_lanes = 1, .row_in_flight = true, .cost = &cost};
  // Placeholders of a new lane: worth waiting for.
  spec->BeginRound(1);
  EXPECT_TRUE(spec->Plan(l.lane, ctx).wait);
  // Without a row in flight, placeholders are never drafted.
  ctx.row_in_flight = false;
  spec->BeginRound(1);
  DraftDecision d = spec->Plan(l.lane, ctx);
  EXPECT_FALSE(d.wait);
  EXPECT_TRUE(d.tokens.empty());
}

TEST(SpeculatorTest, RejectsBadOptions) {
  SpeculatorOptions o;
  o.source_options = SourceOptions();
  EXPECT_FALSE(Speculator::Create(o, nullptr).ok());  // no source
  o.sources = {"ngram", "ngram"};
  EXPECT_FALSE(Speculator::Create(o, nullptr).ok());
  o.sources = {"eagle"};
  EXPECT_FALSE(Speculator::Create(o, nullptr).ok());
  o.sources = {"ngram"};
  o.max_drafts = 0;
  EXPECT_FALSE(Speculator::Create(o, nullptr).ok());
  o.max_drafts = 65;
  EXPECT_FALSE(Speculator::Create(o, nullptr).ok());
  o.max_drafts = 8;
  EXPECT_TRUE(Speculator::Create(o, nullptr).ok());
}

}  // namespace
}  // namespace ringlane::router
