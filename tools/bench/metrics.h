// Reading a server's Prometheus /metrics text: a generic parser (name,
// labels, value; summed over label sets on request) and the one table of
// ringlane metric names the report uses, so a renamed metric is a one-line
// change here.
#ifndef RINGLANE_TOOLS_BENCH_METRICS_H_
#define RINGLANE_TOOLS_BENCH_METRICS_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ringlane::bench {

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the Prometheus text exposition format (and OpenMetrics text, which
// differs only in ways this ignores): comments and blank lines skipped,
// label values unescaped, a trailing timestamp dropped. Malformed lines are
// skipped rather than failing the scrape: one odd line from a foreign server
// must not lose the rest.
std::vector<MetricSample> ParsePrometheusText(std::string_view text);

// The sum of `name` over every label set that carries all of `labels`;
// nullopt when no sample matches (the server does not export it).
std::optional<double> SumMetric(const std::vector<MetricSample>& samples, std::string_view name,
                                const std::map<std::string, std::string>& labels = {});

// A ringlane counter the report reads: `key` is the report's name for it;
// when `label` is set only series with label=value are summed.
struct ServerCounter {
  const char* key;
  const char* metric;
  const char* label = nullptr;
  const char* value = nullptr;
};

// The router's counters (router/router_metrics.cc), summed over the label
// sets not named here (model, group).
inline constexpr ServerCounter kRinglaneCounters[] = {
    {"prompt_tokens", "ringlane_prompt_tokens_total"},
    {"generation_tokens", "ringlane_generation_tokens_total"},
    {"cached_prompt_tokens", "ringlane_cached_prompt_tokens_total"},
    {"rounds", "ringlane_rounds_total"},
    {"loops_detected", "ringlane_loops_detected_total"},
    {"loops_stopped", "ringlane_loops_stopped_total"},
    {"preemptions", "ringlane_preemptions_total"},
    {"requests_finished", "ringlane_generate_requests_total", "outcome", "finished"},
    {"requests_failed", "ringlane_generate_requests_total", "outcome", "failed"},
    {"requests_cancelled", "ringlane_generate_requests_total", "outcome", "cancelled"},
    // Speculative decoding, summed over drafter and temperature too: tokens
    // drafted, accepted and rejected by verification, and the rows that
    // carried drafts to verify. "n/a" in the report while the router does
    // not export them.
    {"spec_drafted_tokens", "ringlane_spec_drafted_tokens_total"},
    {"spec_accepted_tokens", "ringlane_spec_accepted_tokens_total"},
    {"spec_rejected_tokens", "ringlane_spec_rejected_tokens_total"},
    {"spec_verify_rows", "ringlane_spec_verify_rows_total"},
    // Rows that sampled: a prompt's last chunk, a decode row, a verify row.
    // generation_tokens / sampling_rows is the tokens per step.
    {"sampling_rows", "ringlane_sampling_rows_total"},
};

// Counter key -> value for the counters the server exports.
using CounterValues = std::map<std::string, double>;
CounterValues ReadRinglaneCounters(const std::vector<MetricSample>& samples);

// after - before for every key in `after`. A key only in `after` counts
// from zero: a labelled series appears at its first increment (a drafter's
// first draft), and a counter starts at zero.
CounterValues CounterDelta(const CounterValues& before, const CounterValues& after);

// What a counter difference (a level's or a phase's) says about steps and
// speculative decoding. Each is nullopt when a counter it needs is absent
// (the server does not export it) or its denominator did not grow.
struct StepStats {
  // generation_tokens / sampling_rows: tokens each sampling row yielded;
  // 1 without speculation, above 1 as drafts are accepted.
  std::optional<double> tokens_per_step;
  // spec_accepted_tokens / spec_drafted_tokens, in [0, 1].
  std::optional<double> draft_acceptance;
  // spec_accepted_tokens / spec_verify_rows: accepted drafts per row that
  // carried drafts.
  std::optional<double> accepted_per_verify_row;
};
StepStats ComputeStepStats(const CounterValues& delta);

// Whether some counter went down between two scrapes: the process behind
// the endpoint restarted (counters start again from zero).
bool CountersWentDown(const CounterValues& before, const CounterValues& after);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_METRICS_H_
