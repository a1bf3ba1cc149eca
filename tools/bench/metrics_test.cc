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
  EXPECT_EQ(before.count("sampling_rows"), 0u);
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

// The router's speculative-decoding series carry drafter and temperature
// labels besides model and group; every label set is summed.
constexpr char kSpecText[] = R"(
ringlane_generation_tokens_total{group="0",model="m"} 300
ringlane_sampling_rows_total{group="0",model="m"} 120
ringlane_spec_drafted_tokens_total{drafter="ngram",group="0",model="m",temperature="given"} 100
ringlane_spec_drafted_tokens_total{drafter="suffix",group="0",model="m",temperature="omitted"} 60
ringlane_spec_accepted_tokens_total{drafter="ngram",group="0",model="m",temperature="given"} 70
ringlane_spec_accepted_tokens_total{drafter="suffix",group="0",model="m",temperature="omitted"} 50
ringlane_spec_rejected_tokens_total{drafter="ngram",group="0",model="m",temperature="given"} 30
ringlane_spec_rejected_tokens_total{drafter="suffix",group="0",model="m",temperature="omitted"} 10
ringlane_spec_verify_rows_total{drafter="ngram",group="0",model="m",temperature="given"} 40
ringlane_spec_verify_rows_total{drafter="suffix",group="0",model="m",temperature="omitted"} 20
)";

TEST(RinglaneCountersTest, ReadsTheSpeculationSeries) {
  const CounterValues v = ReadRinglaneCounters(ParsePrometheusText(kSpecText));
  EXPECT_EQ(v.at("spec_drafted_tokens"), 160);
  EXPECT_EQ(v.at("spec_accepted_tokens"), 120);
  EXPECT_EQ(v.at("spec_rejected_tokens"), 40);
  EXPECT_EQ(v.at("spec_verify_rows"), 60);
  EXPECT_EQ(v.at("sampling_rows"), 120);
  const StepStats s = ComputeStepStats(v);
  EXPECT_DOUBLE_EQ(s.tokens_per_step.value(), 2.5);          // 300 / 120
  EXPECT_DOUBLE_EQ(s.draft_acceptance.value(), 0.75);        // 120 / 160
  EXPECT_DOUBLE_EQ(s.accepted_per_verify_row.value(), 2.0);  // 120 / 60
}

TEST(StepStatsTest, OverADifference) {
  CounterValues before = {{"generation_tokens", 1000}, {"sampling_rows", 900}};
  // The drafters' series appear with their first draft, after `before`: a
  // series only in `after` counts from zero.
  CounterValues after = {{"generation_tokens", 1160},   {"sampling_rows", 980},
                         {"spec_drafted_tokens", 200},  {"spec_accepted_tokens", 80},
                         {"spec_rejected_tokens", 120}, {"spec_verify_rows", 50}};
  const CounterValues d = CounterDelta(before, after);
  EXPECT_EQ(d.at("generation_tokens"), 160);
  EXPECT_EQ(d.at("spec_drafted_tokens"), 200);
  const StepStats s = ComputeStepStats(d);
  EXPECT_DOUBLE_EQ(s.tokens_per_step.value(), 2.0);  // 160 tokens in 80 rows
  EXPECT_DOUBLE_EQ(s.draft_acceptance.value(), 0.4);
  EXPECT_DOUBLE_EQ(s.accepted_per_verify_row.value(), 1.6);
}

TEST(StepStatsTest, AbsentOrIdleCountersAreNotANumber) {
  // Speculation off, or a router that predates it: one token per row, no
  // acceptance.
  StepStats s = ComputeStepStats({{"generation_tokens", 64}, {"sampling_rows", 64}});
  EXPECT_DOUBLE_EQ(s.tokens_per_step.value(), 1.0);
  EXPECT_FALSE(s.draft_acceptance.has_value());
  EXPECT_FALSE(s.accepted_per_verify_row.has_value());
  // No sampling rows exported: no tokens per step either.
  s = ComputeStepStats({{"generation_tokens", 64}});
  EXPECT_FALSE(s.tokens_per_step.has_value());
  // Exported but nothing drafted (a level with nothing to draft from).
  s = ComputeStepStats({{"generation_tokens", 0},
                        {"sampling_rows", 0},
                        {"spec_drafted_tokens", 0},
                        {"spec_accepted_tokens", 0},
                        {"spec_verify_rows", 0}});
  EXPECT_FALSE(s.tokens_per_step.has_value());
  EXPECT_FALSE(s.draft_acceptance.has_value());
  EXPECT_FALSE(s.accepted_per_verify_row.has_value());
}

}  // namespace
}  // namespace ringlane::bench
