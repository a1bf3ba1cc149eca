#include "kvstore/tier/dram_tier.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/test_util.h"

namespace ringlane::kvstore {
namespace {

using testing::Enc;
using testing::TestBlock;

// Room for exactly `n` entries of `bytes` payload bytes with Enc() keys.
int64_t RoomFor(int n, int64_t bytes) {
  return n * (bytes + static_cast<int64_t>(Enc(0).size()) + DramTier::kEntryOverheadBytes);
}

std::vector<std::string> Keys(std::initializer_list<int> ids) {
  std::vector<std::string> v;
  for (int i : ids) v.push_back(Enc(i));
  return v;
}

TEST(DramTierTest, EvictsLeastRecentlyUsedAndHitsRefresh) {
  DramTier t(RoomFor(3, 100));
  DramTier::Evicted ev;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.Insert(Enc(i), TestBlock(i, 100), &ev));
  EXPECT_TRUE(ev.empty());
  EXPECT_EQ(t.KeysLruOrderForTesting(), Keys({0, 1, 2}));
  ASSERT_TRUE(t.Get(Enc(0)).has_value());  // a hit refreshes
  EXPECT_TRUE(t.Contains(Enc(1)));         // Contains does not
  EXPECT_EQ(t.KeysLruOrderForTesting(), Keys({1, 2, 0}));
  ASSERT_TRUE(t.Insert(Enc(3), TestBlock(3, 100), &ev));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].first, Enc(1));
  EXPECT_EQ(*ev[0].second.payload, *TestBlock(1, 100).payload);  // handed back whole
  EXPECT_FALSE(t.Contains(Enc(1)));
  EXPECT_EQ(t.KeysLruOrderForTesting(), Keys({2, 0, 3}));
  const DramTier::Stats s = t.stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.bytes, 300);
  EXPECT_EQ(s.evictions, 1);
}

TEST(DramTierTest, ALargeBlockEvictsSeveralOldestFirst) {
  DramTier t(RoomFor(4, 100));
  DramTier::Evicted ev;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t.Insert(Enc(i), TestBlock(i, 100), &ev));
  ASSERT_TRUE(t.Insert(Enc(9), TestBlock(9, 300), &ev));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].first, Enc(0));
  EXPECT_EQ(ev[1].first, Enc(1));
  EXPECT_LE(t.stats().bytes, RoomFor(4, 100));
}

TEST(DramTierTest, ABlockOverTheBudgetIsRefusedAndEvictsNothing) {
  DramTier t(RoomFor(2, 100));
  DramTier::Evicted ev;
  ASSERT_TRUE(t.Insert(Enc(0), TestBlock(0, 100), &ev));
  EXPECT_FALSE(t.Insert(Enc(1), TestBlock(1, RoomFor(2, 100)), &ev));
  EXPECT_TRUE(ev.empty());
  EXPECT_TRUE(t.Contains(Enc(0)));
  EXPECT_EQ(t.stats().entries, 1);
}

TEST(DramTierTest, ReinsertingAKeyOnlyRefreshesIt) {
  DramTier t(RoomFor(2, 100));
  DramTier::Evicted ev;
  bool is_new = false;
  ASSERT_TRUE(t.Insert(Enc(0), TestBlock(0, 100), &ev, &is_new));
  EXPECT_TRUE(is_new);
  ASSERT_TRUE(t.Insert(Enc(1), TestBlock(1, 100), &ev));
  ASSERT_TRUE(t.Insert(Enc(0), TestBlock(0, 100), &ev, &is_new));
  EXPECT_FALSE(is_new);
  EXPECT_EQ(t.KeysLruOrderForTesting(), Keys({1, 0}));
  EXPECT_EQ(t.stats().bytes, 200);
}

TEST(DramTierTest, EraseWithPrefixAndTakeAll) {
  DramTier t(RoomFor(8, 10));
  DramTier::Evicted ev;
  for (int i = 0; i < 3; ++i) t.Insert(Enc(i, "a"), TestBlock(i, 10), &ev);
  for (int i = 0; i < 2; ++i) t.Insert(Enc(i, "ab"), TestBlock(i, 10), &ev);
  EXPECT_EQ(t.EraseWithPrefix(ModelPrefix("a")), 3);
  EXPECT_EQ(t.stats().entries, 2);
  t.Get(Enc(0, "ab"));
  DramTier::Evicted all = t.TakeAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, Enc(1, "ab"));  // oldest first
  EXPECT_EQ(t.stats().entries, 0);
  EXPECT_EQ(t.stats().bytes, 0);
}

}  // namespace
}  // namespace ringlane::kvstore
