// ringlane-bench: measures any OpenAI-compatible server the same way, so two
// stacks can be compared on one harness (tools/bench/README.md).
//
//   ringlane-bench --base_url=http://127.0.0.1:8080/v1 --workload=sweep --out=bench-out
//   ringlane-bench --server=generic --base_url=http://127.0.0.1:8000/v1 --workload=decode
//
// Flags become a RunOptions here; everything else is in ringlane_bench.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/flags_util.h"
#include "services/http_client.h"
#include "services/signals.h"
#include "tools/bench/report.h"
#include "tools/bench/runner.h"
#include "tools/bench/workload.h"

ABSL_FLAG(std::string, base_url, "http://127.0.0.1:8080/v1",
          "the server's OpenAI API root (completions at {base_url}/completions)");
ABSL_FLAG(
    std::string, workload, "decode",
    "a shipped workload (decode, prefill, sweep, resend, soak, copy, agentic) or a workload JSON "
    "file");
ABSL_FLAG(std::string, server, "ringlane",
          "ringlane (send its extensions ignore_eos/loop_watchdog, read /tokenize and /metrics) "
          "or generic (standard OpenAI fields only)");
ABSL_FLAG(std::string, model, "", "model id; empty = the first of {base_url}/models");
ABSL_FLAG(std::string, api_key, "", "bearer token; empty = $OPENAI_API_KEY when set");
ABSL_FLAG(std::string, out, "bench-out", "directory for report.md, samples.json and plots");
ABSL_FLAG(double, duration_s, 0,
          "cap on every level's time, the soak's included (0 = the workload's own bounds)");
ABSL_FLAG(std::string, count_tokens, "auto",
          "logprobs (ask for logprobs and count their entries), usage (trust the server's usage, "
          "reported unverified) or auto (logprobs for ringlane, usage for generic)");
ABSL_FLAG(std::string, metrics_url, "auto",
          "Prometheus metrics to read before and after each level; auto = {root}/metrics for "
          "ringlane, none for generic");
ABSL_FLAG(std::string, tokenize_url, "auto",
          "POST {model, prompt} -> {count} for exact prompt lengths; auto = {root}/tokenize for "
          "ringlane, none for generic");
ABSL_FLAG(std::string, extra_body, "",
          "JSON object merged into every request (another server's own knobs, e.g. "
          "'{\"ignore_eos\": true}')");
ABSL_FLAG(double, temperature, -1, "overrides the workload's temperature (-1 = keep)");
ABSL_FLAG(double, length_scale, 1,
          "multiplies every prompt and output length (the shipped workloads fit a 512-token "
          "context; 16 suits an 8k model)");
ABSL_FLAG(double, request_timeout_s, 300, "longest one request may take");
ABSL_FLAG(uint64_t, seed, 0,
          "seeds the prompts; 0 = a fresh seed, so no prompt of an earlier run is cached");
ABSL_FLAG(int, loop_max_period, 64, "client-side loop detector: longest cycle, in tokens");
ABSL_FLAG(int, loop_flag_repeats, 4, "client-side loop detector: occurrences that flag a loop");
ABSL_FLAG(bool, progress, true, "progress bars on stderr");
ABSL_FLAG(bool, list_workloads, false, "print the shipped workloads and exit");
ABSL_FLAG(std::string, show_workload, "", "print a shipped workload's JSON and exit");

namespace {

using ringlane::services::ExitWithUsageError;

// "http://h:p/v1" -> "http://h:p": where ringlane serves /metrics and
// /tokenize.
std::string RootOf(const std::string& base_url) {
  absl::StatusOr<ringlane::services::HttpUrl> u = ringlane::services::ParseHttpUrl(base_url);
  if (!u.ok()) ExitWithUsageError(absl::StrCat("--base_url: ", u.status().message()));
  return absl::StrCat("http://", ringlane::services::JoinHostPort(u->host, u->port));
}

std::string SideUrl(const std::string& flag, bool ringlane, const std::string& base_url,
                    const char* path) {
  if (flag == "none") return "";
  if (flag == "auto") return ringlane ? RootOf(base_url) + path : "";
  return flag;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ringlane-bench --base_url=http://HOST:PORT/v1 --workload=NAME|FILE [--server=ringlane|"
      "generic] [--out=DIR]\nMeasures an OpenAI-compatible server; see tools/bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  namespace bench = ringlane::bench;

  if (absl::GetFlag(FLAGS_list_workloads)) {
    for (const std::string& name : bench::ShippedWorkloadNames()) {
      absl::StatusOr<bench::Workload> w = bench::LoadWorkload(name);
      std::printf("%-8s %s\n", name.c_str(), w.ok() ? w->description.c_str() : "(invalid)");
    }
    return 0;
  }
  if (const std::string name = absl::GetFlag(FLAGS_show_workload); !name.empty()) {
    absl::StatusOr<std::string> text = bench::ShippedWorkloadText(name);
    if (!text.ok()) ExitWithUsageError(absl::StrCat("--show_workload: ", text.status().message()));
    std::fputs(text->c_str(), stdout);
    return 0;
  }

  bench::RunOptions options;
  const std::string server = absl::GetFlag(FLAGS_server);
  if (server != "ringlane" && server != "generic") {
    ExitWithUsageError("--server: ringlane or generic");
  }
  const bool ringlane = server == "ringlane";
  bench::ServerOptions& sv = options.server;
  sv.base_url = absl::GetFlag(FLAGS_base_url);
  while (!sv.base_url.empty() && sv.base_url.back() == '/') sv.base_url.pop_back();
  RootOf(sv.base_url);  // validates
  sv.kind = ringlane ? bench::ServerKind::kRinglane : bench::ServerKind::kGeneric;
  sv.model = absl::GetFlag(FLAGS_model);
  sv.api_key = absl::GetFlag(FLAGS_api_key);
  if (sv.api_key.empty() && std::getenv("OPENAI_API_KEY") != nullptr) {
    sv.api_key = std::getenv("OPENAI_API_KEY");
  }
  const std::string count = absl::GetFlag(FLAGS_count_tokens);
  if (count != "auto" && count != "logprobs" && count != "usage") {
    ExitWithUsageError("--count_tokens: auto, logprobs or usage");
  }
  sv.request_logprobs = count == "logprobs" || (count == "auto" && ringlane);
  sv.metrics_url = SideUrl(absl::GetFlag(FLAGS_metrics_url), ringlane, sv.base_url, "/metrics");
  sv.tokenize_url = SideUrl(absl::GetFlag(FLAGS_tokenize_url), ringlane, sv.base_url, "/tokenize");
  sv.extra_body = absl::GetFlag(FLAGS_extra_body);
  if (absl::GetFlag(FLAGS_request_timeout_s) <= 0) {
    ExitWithUsageError("--request_timeout_s: must be > 0");
  }
  sv.request_timeout = absl::Seconds(absl::GetFlag(FLAGS_request_timeout_s));

  absl::StatusOr<bench::Workload> workload = bench::LoadWorkload(absl::GetFlag(FLAGS_workload));
  if (!workload.ok()) ExitWithUsageError(absl::StrCat("--workload: ", workload.status().message()));
  const double scale = absl::GetFlag(FLAGS_length_scale);
  if (!(scale > 0)) ExitWithUsageError("--length_scale: must be > 0");
  if (scale != 1) *workload = bench::ScaleLengths(*workload, scale);
  if (absl::GetFlag(FLAGS_temperature) >= 0)
    workload->temperature = absl::GetFlag(FLAGS_temperature);
  if (absl::GetFlag(FLAGS_duration_s) < 0) ExitWithUsageError("--duration_s: must be >= 0");
  options.duration_cap_s = absl::GetFlag(FLAGS_duration_s);

  options.seed = absl::GetFlag(FLAGS_seed);
  if (options.seed == 0) options.seed = std::random_device()() | 1ULL << 32;
  options.loop.max_period = absl::GetFlag(FLAGS_loop_max_period);
  options.loop.flag_repeats = absl::GetFlag(FLAGS_loop_flag_repeats);
  options.progress = absl::GetFlag(FLAGS_progress);
  // Ctrl-C stops starting requests; the report covers what ran. A second
  // one exits at once.
  ringlane::services::InstallShutdownSignalHandlers(/*second_signal_exits=*/true);
  options.stop_requested = [] { return ringlane::services::ShutdownRequested(); };

  absl::StatusOr<bench::RunResult> run = bench::RunWorkload(*workload, options);
  if (!run.ok()) {
    std::fprintf(stderr, "ringlane-bench: %s\n", std::string(run.status().message()).c_str());
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  absl::StatusOr<std::vector<std::string>> written = bench::WriteOutputs(*run, out);
  if (!written.ok()) {
    std::fprintf(stderr, "ringlane-bench: %s\n", std::string(written.status().message()).c_str());
    return 1;
  }
  std::fputs(bench::RenderMarkdown(*run, bench::ComputeGroups(*run)).c_str(), stdout);
  for (const std::string& line : *written)
    std::fprintf(stderr, "ringlane-bench: %s\n", line.c_str());
  return 0;
}
