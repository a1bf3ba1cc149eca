#include "router/scheduler.h"

#include <vector>

#include "gtest/gtest.h"

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

TEST(PrefillTokenLimitTest, NoTargetOrNoModelMeansTheBudget) {
  EXPECT_EQ(PrefillTokenLimit(4, 512, 0, Linear(10000, 500), 16), 508);
  EXPECT_EQ(PrefillTokenLimit(4, 512, 50000, RoundCostModel(), 16), 508);
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

}  // namespace
}  // namespace ringlane::router
