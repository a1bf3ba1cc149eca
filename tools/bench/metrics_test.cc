#include "tools/bench/metrics.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

constexpr char kText[] = R"(# HELP ringlane_generation_tokens_total Tokens generated (all choices)
# TYPE ringlane_generation_tokens_total counter
ringlane_generation_tokens_total{group="0",model="stories260K"} 120
ringlane_generation_tokens_total{group="1",model="stories260K"} 30
ringlane_generate_requests_total{group="0",model="m",outcome="finished"} 5
ringlane_generate_requests_total{group="0",model="m",outcome="failed"} 1
ringlane_rounds_total 42 1700000000000
odd_label{path="a\"b,c}d"} 3.5e2
nan_metric NaN
not a metric line
ringlane_prompt_tokens_total{model="m"}
)";

TEST(PrometheusTextTest, ParsesNamesLabelsAndValues) {
  const std::vector<MetricSample> s = ParsePrometheusText(kText);
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[0].name, "ringlane_generation_tokens_total");
  EXPECT_EQ(s[0].labels.at("model"), "stories260K");
  EXPECT_EQ(s[0].value, 120);
  EXPECT_EQ(s[4].name, "ringlane_rounds_total");
  EXPECT_EQ(s[4].value, 42);  // the timestamp is dropped
  EXPECT_EQ(s[5].labels.at("path"), "a\"b,c}d");
  EXPECT_EQ(s[5].value, 350);
  EXPECT_TRUE(std::isnan(s[6].value));
}

TEST(PrometheusTextTest, SumsOverLabelSets) {
  const std::vector<MetricSample> s = ParsePrometheusText(kText);
  EXPECT_EQ(SumMetric(s, "ringlane_generation_tokens_total"), 150);
  EXPECT_EQ(SumMetric(s, "ringlane_generation_tokens_total", {{"group", "1"}}), 30);
  EXPECT_EQ(SumMetric(s, "ringlane_generate_requests_total", {{"outcome", "failed"}}), 1);
  EXPECT_FALSE(SumMetric(s, "absent_total").has_value());
  EXPECT_FALSE(SumMetric(s, "ringlane_generation_tokens_total", {{"group", "9"}}).has_value());
}

TEST(RinglaneCountersTest, ReadsTheTableAndDiffs) {
  const CounterValues before = ReadRinglaneCounters(ParsePrometheusText(kText));
  EXPECT_EQ(before.at("generation_tokens"), 150);
  EXPECT_EQ(before.at("rounds"), 42);
  EXPECT_EQ(before.at("requests_finished"), 5);
  EXPECT_EQ(before.at("requests_failed"), 1);
  EXPECT_EQ(before.count("spec_accepted_tokens"), 0u);  // not exported: "n/a"
  CounterValues after = before;
  after["generation_tokens"] = 214;
  after["rounds"] = 50;
  const CounterValues d = CounterDelta(before, after);
  EXPECT_EQ(d.at("generation_tokens"), 64);
  EXPECT_EQ(d.at("rounds"), 8);
  EXPECT_FALSE(CountersWentDown(before, after));
  after["rounds"] = 3;  // a restarted router counts from zero again
  EXPECT_TRUE(CountersWentDown(before, after));
}

}  // namespace
}  // namespace ringlane::bench
