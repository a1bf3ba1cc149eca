// ringlane-bench's outputs from a finished run: per-group statistics, the
// Markdown report, the JSON file with every sample, and the gnuplot plot of
// each concurrency sweep. Pure functions of a RunResult, except
// WriteOutputs, which writes the files and runs gnuplot.
#ifndef RINGLANE_TOOLS_BENCH_REPORT_H_
#define RINGLANE_TOOLS_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/metrics.h"
#include "tools/bench/runner.h"
#include "tools/bench/stats.h"

namespace ringlane::bench {

// The samples of one stage at one concurrency and phase.
struct GroupStats {
  std::string stage;
  int concurrency = 0;
  std::string phase;
  StageMode mode = StageMode::kIndependent;
  int64_t requests = 0;
  int64_t errors = 0;
  // Over successful requests, in milliseconds.
  Summary ttft_ms;
  Summary itl_ms;
  Summary tpot_ms;
  Summary e2e_ms;
  // Token sums over successful requests; usage sums cover those that
  // reported usage, the logprob sum those whose stream could be counted.
  int64_t usage_prompt_tokens = 0;
  int64_t usage_completion_tokens = 0;
  int64_t logprob_tokens = 0;
  int64_t output_tokens = 0;  // sum of n (see sample.h)
  int64_t cached_tokens = 0;
  int64_t with_cached = 0;  // requests that reported cached_tokens
  // Token checks (TokenCheck) of successful requests.
  int64_t verified = 0;
  int64_t mismatched = 0;
  int64_t unverified = 0;
  int64_t no_usage = 0;
  // Requests whose usage.prompt_tokens differs from the tokenizer's count.
  int64_t prompt_mismatched = 0;
  int64_t not_streamed = 0;
  int64_t loops_flagged = 0;
  // Output tokens / (last response end - first request start).
  double aggregate_tps = 0;
  // Mean over requests of n / E2E.
  double per_stream_tps = 0;
  // Mean over requests of usage.prompt_tokens / TTFT.
  double prefill_tps = 0;
  // From the server's counters over the group's level, or over its phase
  // where the phases run one after another (kAgentic); empty for phases
  // that interleave (kResend), without metrics, after a restart, and for
  // counters the server does not export.
  StepStats steps;
};

std::vector<GroupStats> ComputeGroups(const RunResult& run);

std::string RenderMarkdown(const RunResult& run, const std::vector<GroupStats>& groups);
// samples.json: the run, its notes, levels (with server counters), groups
// and every sample.
std::string RenderJson(const RunResult& run, const std::vector<GroupStats>& groups);

// Writes report.md, samples.json and, for each stage with several
// concurrency levels, <stage>.dat, <stage>.gp and <stage>.png (gnuplot)
// into `dir` (created). Returns lines for the user: files written, or why a
// plot was skipped. Fails only when the directory or a file cannot be
// written.
absl::StatusOr<std::vector<std::string>> WriteOutputs(const RunResult& run, const std::string& dir);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_REPORT_H_
