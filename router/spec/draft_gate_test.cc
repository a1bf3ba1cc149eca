#include "router/spec/draft_gate.h"

#include <gtest/gtest.h>

namespace ringlane::router {
namespace {

using Regime = DraftGate::Regime;

// `rounds` rounds at `lanes` lanes where drafting is wanted (promising
// `expected` tokens a step): drafting rounds while the gate is open, each
// giving `drafting_tokens` tokens in `drafting_us`, plain ones while it is
// closed, `plain_tokens` in 1000 us. Returns the time spent open, in us.
double Wanted(DraftGate& gate, int64_t lanes, int rounds, int drafting_tokens, int plain_tokens,
              double expected = 4, double drafting_us = 1000) {
  double open_us = 0;
  for (int i = 0; i < rounds; ++i) {
    gate.NoteWanted(lanes, expected);
    const bool o = gate.IsOpen(lanes);
    const int tag = gate.Tag(lanes, o ? Regime::kDrafting : Regime::kPlain, /*wanted=*/true);
    EXPECT_EQ(DraftGate::TagOpen(tag), o);
    gate.Observe(tag, o ? drafting_tokens : plain_tokens, o ? drafting_us : 1000);
    if (o) open_us += drafting_us;
  }
  return open_us;
}

// Rounds where no lane wants to draft: plain, whatever the gate.
void Plain(DraftGate& gate, int64_t lanes, int rounds, int tokens) {
  for (int i = 0; i < rounds; ++i) {
    gate.Observe(gate.Tag(lanes, Regime::kPlain, /*wanted=*/false), tokens, 1000);
  }
}

TEST(DraftGateTest, StartsClosedUntilItHasSeenPlainDecode) {
  DraftGate gate;
  EXPECT_FALSE(gate.IsOpen(1));
  EXPECT_FALSE(gate.IsOpen(5));
  Plain(gate, 1, 7, 1);
  EXPECT_FALSE(gate.IsOpen(1));
  Plain(gate, 1, 1, 1);
  EXPECT_TRUE(gate.IsOpen(1));
  EXPECT_DOUBLE_EQ(gate.TokensPerSecond(1, Regime::kPlain), 1000);
  EXPECT_FALSE(gate.IsOpen(2));
}

TEST(DraftGateTest, KeepsDraftingWhereItPays) {
  DraftGate gate;
  // Eight plain rounds to learn plain decode, one settling, then drafting
  // for good.
  const double open_us = Wanted(gate, 1, 2000, 6, 1);
  EXPECT_TRUE(gate.IsOpen(1));
  EXPECT_NEAR(gate.TokensPerSecond(1, Regime::kDrafting), 6000, 1e-6);
  EXPECT_DOUBLE_EQ(open_us, (2000 - 8) * 1000.0);
}

TEST(DraftGateTest, StopsDraftingWhereItCostsAndRechecksForAFewPercentOfTheTime) {
  DraftGate gate;
  // Five lanes on a compute-bound worker: a drafting round gives 16 tokens
  // in 4 ms, a plain one 5 in 1 ms.
  const int rounds = 5000;
  const double open_us = Wanted(gate, 5, rounds, 16, 5, 4, /*drafting_us=*/4000);
  EXPECT_FALSE(gate.IsOpen(5));
  const double total_us = open_us + (rounds - open_us / 4000) * 1000;
  EXPECT_LT(open_us / total_us, 0.04);
  // Re-checks happened: more than the first window drafted.
  EXPECT_GT(open_us, 3 * 5 * 4000.0);
  // Other lane counts are measured on their own; 5-8 share a bucket.
  EXPECT_FALSE(gate.IsOpen(8));
  Plain(gate, 4, 8, 4);
  Plain(gate, 9, 8, 9);
  EXPECT_TRUE(gate.IsOpen(4));
  EXPECT_TRUE(gate.IsOpen(9));
}

TEST(DraftGateTest, ALossWithinTheMarginKeepsDrafting) {
  DraftGate gate;
  Plain(gate, 2, 20, 100);
  EXPECT_DOUBLE_EQ(Wanted(gate, 2, 400, 97, 100), 400 * 1000.0);
  EXPECT_TRUE(gate.IsOpen(2));
}

TEST(DraftGateTest, ReopensAtOnceWhenTheWantedDraftsPromiseMuchMore) {
  DraftGate gate;
  Plain(gate, 1, 20, 2);
  // Drafts of a fresh answer: short and often wrong, they lose.
  Wanted(gate, 1, 100, 1, 2, /*expected=*/1.3);
  EXPECT_FALSE(gate.IsOpen(1));
  // The agent repeats an earlier answer: deep drafts, always right. The gate
  // opens within a few rounds, not after its hold.
  int rounds = 0;
  while (!gate.IsOpen(1) && rounds < 64) {
    Wanted(gate, 1, 1, 7, 1, /*expected=*/8);
    ++rounds;
  }
  EXPECT_TRUE(gate.IsOpen(1));
  EXPECT_LT(rounds, 10);
  Wanted(gate, 1, 200, 7, 1, 8);
  EXPECT_TRUE(gate.IsOpen(1));
}

TEST(DraftGateTest, ClosedCountsOnlyTheTimeOfRoundsThatWantedDrafts) {
  DraftGate gate;
  Plain(gate, 3, 20, 5);
  // Four drafting rounds of 1 ms lose: closed for 16 x 4 ms of wanted
  // rounds.
  Wanted(gate, 3, 4, 1, 5);
  ASSERT_FALSE(gate.IsOpen(3));
  // However long nobody wants to draft, nothing is re-checked.
  Plain(gate, 3, 5000, 5);
  EXPECT_FALSE(gate.IsOpen(3));
  Wanted(gate, 3, 63, 1, 5);
  EXPECT_FALSE(gate.IsOpen(3));
  Wanted(gate, 3, 2, 1, 5);
  EXPECT_TRUE(gate.IsOpen(3));
}

TEST(DraftGateTest, IgnoresProbeRoundsStaleTagsAndSettlingRounds) {
  DraftGateOptions o;
  o.window = 4;
  o.settle = 1;
  DraftGate gate(o);
  Plain(gate, 2, 10, 10);
  ASSERT_TRUE(gate.IsOpen(2));
  const int stale = gate.Tag(2, Regime::kDrafting, true);
  // Only probes out: neither plain nor drafting.
  for (int i = 0; i < 100; ++i) gate.Observe(gate.Tag(2, Regime::kNeither, true), 0, 1000);
  EXPECT_TRUE(gate.IsOpen(2));
  EXPECT_EQ(gate.TokensPerSecond(2, Regime::kDrafting), 0);
  Wanted(gate, 2, 4, 1, 10);
  EXPECT_FALSE(gate.IsOpen(2));
  // A drafting round planned while open, arriving after the gate closed.
  gate.Observe(stale, 1000, 1000);
  EXPECT_FALSE(gate.IsOpen(2));
  // The settling round after the switch is not measured.
  gate.Observe(gate.Tag(2, Regime::kPlain, false), 1000, 1000);
  EXPECT_DOUBLE_EQ(gate.TokensPerSecond(2, Regime::kPlain), 10000);
  // Tags from nowhere and empty periods are ignored.
  gate.Observe(-1, 5, 1000);
  gate.Observe(1 << 20, 5, 1000);
  gate.Observe(gate.Tag(2, Regime::kPlain, false), 5, 0);
}

}  // namespace
}  // namespace ringlane::router
