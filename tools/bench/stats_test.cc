#include "tools/bench/stats.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  // Type 7: rank h = (n - 1) q / 100.
  const std::vector<double> v = {40, 10, 30, 20};  // sorted: 10 20 30 40
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 10);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 40);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 25);    // h = 1.5
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 37);    // h = 2.7
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 39.7);  // h = 2.97
}

TEST(PercentileTest, EdgeCases) {
  EXPECT_TRUE(std::isnan(Percentile({}, 50)));
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3}, 150), 3);  // clamped
}

TEST(SummarizeTest, AllFields) {
  std::vector<double> v;
  for (int i = 1; i <= 101; ++i) v.push_back(i);
  const Summary s = Summarize(v);
  EXPECT_EQ(s.count, 101);
  EXPECT_DOUBLE_EQ(s.mean, 51);
  EXPECT_DOUBLE_EQ(s.p50, 51);
  EXPECT_DOUBLE_EQ(s.p90, 91);
  EXPECT_DOUBLE_EQ(s.p99, 100);
  EXPECT_DOUBLE_EQ(s.max, 101);
  const Summary empty = Summarize({});
  EXPECT_EQ(empty.count, 0);
  EXPECT_TRUE(std::isnan(empty.p50));
}

}  // namespace
}  // namespace ringlane::bench
