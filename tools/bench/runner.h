// Runs a workload against a server: for each stage and concurrency level,
// that many client threads send requests until the level's request count or
// time bound is reached, while the server's metrics are read before, during
// (to see restarts) and after. Samples are collected for the report. Copy
// stages write their documents before a level's first read; agentic stages
// read the metrics again between their first pass and the repeats.
//
// RunWorkload is called from one thread (main); it starts and joins its
// own threads per level: one per stream, each owning an ApiClient, plus a
// metrics scraper. Samples go into a mutex-guarded list.
#ifndef RINGLANE_TOOLS_BENCH_RUNNER_H_
#define RINGLANE_TOOLS_BENCH_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "router/request/loop_watchdog.h"
#include "tools/bench/client.h"
#include "tools/bench/metrics.h"
#include "tools/bench/sample.h"
#include "tools/bench/workload.h"

namespace ringlane::bench {

struct RunOptions {
  ServerOptions server;
  // Caps every level's time (the soak's and the sweep's included); 0: the
  // workload's own bounds only.
  double duration_cap_s = 0;
  // Seeds the prompts' words and drawn lengths. Runs with the same seed send
  // the same prompts, so a second run finds them cached on a server that
  // keeps prefixes; main() picks a fresh one unless told.
  uint64_t seed = 1;
  // The client-side loop detector: the router's watchdog's rule and
  // defaults, applied to the streamed tokens (logprob tokens, else words).
  router::LoopWatchdogOptions loop;
  // Progress bars on stderr.
  bool progress = true;
  // Polled between requests: true stops starting new ones (Ctrl-C).
  std::function<bool()> stop_requested;
  // Where notes go as they happen (default: stderr).
  std::function<void(std::string_view)> log;
};

// kCopy's prompt: `document`, a newline, then the document's first
// `fraction` of its words again (rounded to the nearest word, cut where that
// word ends, so no token is split). Surrounding whitespace of the document
// is dropped.
std::string CopyPromptText(std::string_view document, double fraction);

// One stage run at one concurrency.
struct LevelResult {
  std::string stage;
  StageMode mode = StageMode::kIndependent;
  int concurrency = 0;
  int64_t requests_planned = 0;  // 0: bounded by time only
  double duration_bound_s = 0;   // 0: none
  double wall_s = 0;             // first request sent to the last response's end
  bool stopped_early = false;    // stop_requested ended it
  // Server counters (kRinglaneCounters keys) before and after the level,
  // and their difference; empty without a metrics URL.
  bool has_metrics = false;
  CounterValues before;
  CounterValues after;
  CounterValues delta;
  // Restarts seen: scrapes (every second) where a counter went down.
  int counter_resets = 0;
  // Outages seen: requests could not reach the server, and one started
  // later succeeded.
  int outages = 0;
  int64_t sessions = 0;  // kConversation: sessions started
  // The unrecorded warm-up requests before the level (the server counts
  // their tokens, but before the level's first scrape).
  int warmup_requests = 0;
  int warmup_errors = 0;
  int64_t warmup_prompt_tokens = 0;      // from usage
  int64_t warmup_completion_tokens = 0;  // from usage
  // kCopy: the unrecorded calls that wrote each request's document, made
  // before the level's first scrape (so the level's counters cover only the
  // recorded requests).
  int document_requests = 0;
  int document_errors = 0;
  int64_t document_prompt_tokens = 0;      // from usage
  int64_t document_completion_tokens = 0;  // from usage
  // kAgentic: the counters' difference over each phase ("first", "repeat"),
  // split by a read when the first pass ended; empty without metrics, when
  // that read failed, or when the server restarted.
  std::map<std::string, CounterValues> phase_delta;
};

struct RunResult {
  Workload workload;
  ServerOptions server;  // api_key removed
  uint64_t seed = 0;
  std::string started_at;  // UTC, RFC 3339
  std::vector<RequestSample> samples;
  std::vector<LevelResult> levels;
  // Things the reader of the report must know (approximate lengths, a
  // model picked from the list, a run stopped early).
  std::vector<std::string> notes;
};

// Runs every stage of `workload`. Fails only when the run cannot start (bad
// URL, no model to pick, a bad loop option); request failures are samples
// with errors.
absl::StatusOr<RunResult> RunWorkload(const Workload& workload, const RunOptions& options);

// Runs the client-side loop detector over a finished sample's output.
void DetectLoops(const router::LoopWatchdogOptions& options, RequestSample* sample);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_RUNNER_H_
