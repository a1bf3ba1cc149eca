#include "router/sched/scheduler.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
namespace {

TEST(RoundCostModelTest, FitsALinearCostAndWaitsForVariedRounds) {
  RoundCostModel m;
  EXPECT_FALSE(m.ready());
  // Same-size rounds say nothing about the per-token cost.
  for (int i = 0; i < 10; ++i) m.Observe(4, 2000);
  EXPECT_FALSE(m.ready());
  EXPECT_DOUBLE_EQ(m.per_token_us(), 0);
  for (int64_t t : {1, 64, 16, 128, 4, 32}) m.Observe(t, 1000 + 50.0 * t);
  // The ten early rounds at 2000 us are off the line; they decay but count.
  ASSERT_TRUE(m.ready());
  RoundCostModel clean;
  for (int64_t t : {1, 64, 16, 128, 4, 32, 8}) clean.Observe(t, 1000 + 50.0 * t);
  EXPECT_NEAR(clean.per_token_us(), 50, 1e-6);
  EXPECT_NEAR(clean.fixed_us(), 1000, 1e-6);
  EXPECT_NEAR(clean.PredictUs(10), 1500, 1e-6);
}

TEST(RoundCostModelTest, FollowsAChangeInSpeed) {
  RoundCostModel m(0.9);
  for (int i = 0; i < 50; ++i) m.Observe(1 + (i % 8) * 16, 1000 + 10.0 * (1 + (i % 8) * 16));
  EXPECT_NEAR(m.per_token_us(), 10, 1e-6);
  for (int i = 0; i < 200; ++i) m.Observe(1 + (i % 8) * 16, 1000 + 40.0 * (1 + (i % 8) * 16));
  EXPECT_NEAR(m.per_token_us(), 40, 0.5);
}

TEST(RoundCostModelTest, TimeFallingWithTokensIsNoSlope) {
  RoundCostModel m;
  for (int64_t t : {1, 10, 100, 1000}) m.Observe(t, 5000 - t);
  EXPECT_DOUBLE_EQ(m.per_token_us(), 0);
  EXPECT_GT(m.fixed_us(), 0);
}

TEST(RoundCostModelTest, SmallRoundsAreMeasuredPerSize) {
  RoundCostModel m;
  // A fit from prefill-sized rounds: 1000 + 10 per token.
  for (int64_t t : {64, 128, 256, 512}) m.Observe(t, 1000 + 10.0 * t);
  // No small round yet: the fit.
  EXPECT_NEAR(m.SmallRoundUs(5), 1050, 1e-6);
  // Rounds of 1, 4 and 9 tokens, twice each: flat, then steep.
  for (int i = 0; i < 2; ++i) {
    m.Observe(1, 1000);
    m.Observe(4, 1500);
    m.Observe(9, 4200);
  }
  EXPECT_NEAR(m.SmallRoundUs(1), 1000, 1e-6);
  EXPECT_NEAR(m.SmallRoundUs(4), 1500, 1e-6);
  EXPECT_NEAR(m.SmallRoundUs(9), 4200, 1e-6);
  // Unmeasured sizes above 4 continue the slope below it (500 / 3 per
  // token), not the chord to 9 (540 per token): optimistic, so a depth that
  // reaches them is tried and measured.
  EXPECT_NEAR(m.SmallRoundUs(5), 1500 + 500.0 / 3, 1e-6);
  EXPECT_NEAR(m.SmallRoundUs(7), 2000, 1e-6);
  // ... but never above the chord.
  EXPECT_LE(m.SmallRoundUs(2), 1000 + 500.0 / 3 + 1e-6);
  // Past the last measured size, the cheaper of its slope from the one
  // below (540) and the fit's.
  const double beyond = std::min(540.0, m.per_token_us());
  EXPECT_NEAR(m.SmallRoundUs(12), 4200 + 3 * beyond, 1e-6);
  EXPECT_LT(beyond, 540.0);
  // A measured size follows its own rounds.
  for (int i = 0; i < 200; ++i) m.Observe(5, 1700);
  EXPECT_NEAR(m.SmallRoundUs(5), 1700, 1);
  EXPECT_NEAR(m.SmallRoundUs(7), 1700 + 2 * 200.0, 1);
}

// A tiny model's round is mostly latency: 9 tokens cost the workers 60 us
// more than one, though a 9-token round that waited for its result (a verify
// row, not pipelined) took 500 us longer end to end. The extra tokens cost
// what the workers spent on them.
TEST(RoundCostModelTest, ExtraTokensCostTheWorkersTimeNotTheRoundsLatency) {
  RoundCostModel m;
  for (int64_t t : {64, 128, 256}) m.Observe(t, 300 + 2.0 * t, 0, 100 + 2.0 * t);
  for (int i = 0; i < 3; ++i) {
    m.Observe(1, 300, 0, 100);
    m.Observe(9, 800, 0, 160);
  }
  EXPECT_NEAR(m.SmallRoundUs(1), 300, 1e-6);
  EXPECT_NEAR(m.SmallRoundUs(9), 360, 1e-6);
  EXPECT_LE(m.SmallRoundUs(5), 330 + 1e-6);
}

RoundCostModel Linear(double fixed_us, double per_token_us) {
  RoundCostModel m;
  for (int64_t t : {1, 8, 32, 128, 256}) m.Observe(t, fixed_us + per_token_us * t);
  return m;
}

TEST(PrefillTokenLimitTest, WithoutDecodersTheWholeBudget) {
  EXPECT_EQ(PrefillTokenLimit(0, 512, 50000, Linear(1000, 100), 16), 512);
}

TEST(PrefillTokenLimitTest, WithDecodersTheTargetDecides) {
  // 50 ms target, 10 ms fixed, 0.5 ms per token: 80 tokens per round, 4 decoding.
  EXPECT_EQ(PrefillTokenLimit(4, 512, 50000, Linear(10000, 500), 16), 76);
  // A looser target is capped by the budget less the decode rows.
  EXPECT_EQ(PrefillTokenLimit(4, 64, 500000, Linear(10000, 500), 16), 60);
  // A target that cannot be met still gives the minimum chunk.
  EXPECT_EQ(PrefillTokenLimit(4, 512, 5000, Linear(10000, 500), 16), 16);
  // ...but never more than the budget allows.
  EXPECT_EQ(PrefillTokenLimit(60, 64, 5000, Linear(10000, 500), 16), 4);
  EXPECT_EQ(PrefillTokenLimit(64, 64, 5000, Linear(10000, 500), 16), 0);
}

TEST(PrefillTokenLimitTest, NoTargetMeansTheBudgetNoModelTheSmallestChunk) {
  EXPECT_EQ(PrefillTokenLimit(4, 512, 0, Linear(10000, 500), 16), 508);
  // Decoders wait on every round: until the model can predict, small chunks.
  EXPECT_EQ(PrefillTokenLimit(4, 512, 50000, RoundCostModel(), 16), 16);
}

TEST(RoundCostModelTest, SeparatesContextFromTokens) {
  // Rounds of decode rows and chunks at varied positions, timed by a known
  // cost: 1000 us + 20 us per token + 0.01 us per attended pair.
  RoundCostModel m;
  auto cost = [](int64_t tokens, double attended) {
    return 1000 + 20.0 * tokens + 0.01 * attended;
  };
  for (int64_t start : {0, 300, 900, 1500, 2100, 2700}) {
    for (int64_t chunk : {1, 64, 256}) {
      const double att = 3 * (start + 1.0) + AttendedPairs(start, chunk);
      m.Observe(3 + chunk, cost(3 + chunk, att), att);
    }
  }
  EXPECT_NEAR(m.per_token_us(), 20, 1e-3);
  EXPECT_NEAR(m.per_attended_us(), 0.01, 1e-6);
  EXPECT_NEAR(m.fixed_us(), 1000, 0.5);
}

TEST(PrefillTokenLimitTest, LaterChunksOfALongPromptAreSmaller) {
  RoundCostModel m;
  for (int64_t start : {0, 500, 1000, 2000, 3000}) {
    for (int64_t chunk : {1, 32, 128, 512}) {
      const double att = AttendedPairs(start, chunk);
      m.Observe(chunk, 1000 + 20.0 * chunk + 0.05 * att, att);
    }
  }
  // Target 20 ms, 3 decode rows near position 100 each.
  const double decode_att = 3 * 101.0;
  const int64_t early = PrefillTokenLimit(3, 512, 20000, m, 16, decode_att, 0);
  const int64_t late = PrefillTokenLimit(3, 512, 20000, m, 16, decode_att, 3000);
  EXPECT_GT(early, late);
  EXPECT_LE(m.PredictUs(3 + late, decode_att + AttendedPairs(3000, late)), 20000);
  EXPECT_GT(m.PredictUs(3 + late + 1, decode_att + AttendedPairs(3000, late + 1)), 20000);
}

TEST(PickPreemptionVictimTest, TheYoungestLaneNotInTheRound) {
  std::vector<PreemptCandidate> lanes = {{1, false, true}, {5, false, true}, {3, false, true}};
  EXPECT_EQ(PickPreemptionVictim(lanes), 1u);
  lanes[1].in_plan = true;
  EXPECT_EQ(PickPreemptionVictim(lanes), 2u);
  lanes[2].holds_blocks = false;
  EXPECT_EQ(PickPreemptionVictim(lanes), 0u);
  lanes[0].in_plan = true;
  EXPECT_EQ(PickPreemptionVictim(lanes), std::nullopt);
  EXPECT_EQ(PickPreemptionVictim({}), std::nullopt);
}

TEST(AdmitToQueueTest, Limits) {
  EXPECT_TRUE(AdmitToQueue(0, 1, 1));
  EXPECT_FALSE(AdmitToQueue(1, 1, 1));
  EXPECT_TRUE(AdmitToQueue(3, 2, 5));
  EXPECT_FALSE(AdmitToQueue(4, 2, 5));
  // A request larger than the limit still gets in alone.
  EXPECT_TRUE(AdmitToQueue(0, 8, 4));
}

TEST(TokensAfterPlannedRoundsTest, CountsThePromptsSampleAndEachDecodePosition) {
  // Mid-prompt: nothing sampled yet beyond what the choice had.
  EXPECT_EQ(TokensAfterPlannedRounds(0, 10, 0), 0);
  EXPECT_EQ(TokensAfterPlannedRounds(0, 10, 9), 0);
  // The last chunk samples the first token; each decode row one more.
  EXPECT_EQ(TokensAfterPlannedRounds(0, 10, 10), 1);
  EXPECT_EQ(TokensAfterPlannedRounds(0, 10, 13), 4);
  // After a preemption the lane's prompt holds 5 generated tokens already.
  EXPECT_EQ(TokensAfterPlannedRounds(5, 15, 14), 5);
  EXPECT_EQ(TokensAfterPlannedRounds(5, 15, 15), 6);
}

TEST(RoundBusyUsTest, ARoundSentAheadCountsFromThePreviousResult) {
  // Sent idle: from the send.
  EXPECT_DOUBLE_EQ(RoundBusyUs(1000, 500, 3000), 2000);
  // Sent while the previous round ran: from when that one returned.
  EXPECT_DOUBLE_EQ(RoundBusyUs(1000, 2000, 3000), 1000);
  EXPECT_DOUBLE_EQ(RoundBusyUs(1000, 4000, 3000), 0);
}

TEST(FormatRoundLogTest, OneJsonLineWithTheFedTokens) {
  RoundLogEntry e;
  e.round_id = 7;
  e.group = 1;
  e.token_budget = 64;
  e.in_flight = 1;
  e.rows = {{3, RoundLogRow::Kind::kDecode, 40, 1, true, "r1"},
            {4, RoundLogRow::Kind::kPrefill, 0, 16, false, "r2"},
            {2, RoundLogRow::Kind::kRelease, 0, 0, false, ""}};
  const std::string line = FormatRoundLog(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["round"], 7);
  EXPECT_EQ(j["group"], 1);
  EXPECT_EQ(j["budget"], 64);
  EXPECT_EQ(j["in_flight"], 1);
  EXPECT_EQ(j["tokens"], 17);
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][0]["kind"], "decode");
  EXPECT_EQ(j["rows"][0]["lane"], 3);
  EXPECT_EQ(j["rows"][0]["start"], 40);
  EXPECT_EQ(j["rows"][0]["sample"], true);
  EXPECT_EQ(j["rows"][0]["request"], "r1");
  EXPECT_EQ(j["rows"][1]["kind"], "prefill");
  EXPECT_EQ(j["rows"][1]["tokens"], 16);
  EXPECT_EQ(j["rows"][2]["kind"], "release");
  // A client's request id that is not UTF-8 does not break the log.
  e.rows[0].request_id = "bad\xff";
  EXPECT_NO_THROW(nlohmann::json::parse(FormatRoundLog(e)));
}

}  // namespace
}  // namespace ringlane::router
