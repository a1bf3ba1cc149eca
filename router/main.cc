// ringlane-router: drives worker groups with RoundPlans and serves the public
// gRPC Generate API. With --listen port 0 it prints `LISTENING router=host:port`
// on stdout once it serves. It starts serving before any worker group is
// ready (health says NOT_SERVING, Generate says UNAVAILABLE) and keeps trying
// to connect, so start order does not matter.
//
// The router never reads the model: token ids, context and KV geometry come
// from the workers, so the only model file it needs is the tokenizer, named
// by --tokenizer (a file, or a model directory to search as LoadTokenizer
// does).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "router/api/gateway.h"
#include "router/api/generate_service.h"
#include "router/request/chat_template.h"
#include "router/request/seed.h"
#include "router/router.h"
#include "router/tokenizer/tokenizer.h"
#include "services/flags_util.h"
#include "services/grpc_security.h"
#include "services/log.h"
#include "services/signals.h"

ABSL_FLAG(std::string, workers, "",
          "worker groups: each group's rank addresses in rank order, comma-separated; groups "
          "separated by ';' (e.g. 'a:1,b:2;c:3,d:4')");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "host:port of the gRPC API; port 0 picks one");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer file (tokenizer.json, *.model, llama2.c *.bin) or a model directory holding "
          "one; required, since the router never reads the model itself");
ABSL_FLAG(std::string, model_id, "", "served model id; empty = the workers' model id");
ABSL_FLAG(double, default_temperature, 0, "temperature of requests that give none");
ABSL_FLAG(std::string, seed_policy, "derived",
          "seed of requests that give none: derived (from prompt and parameters) or random");
ABSL_FLAG(int, max_waiting, 256,
          "choices waiting for a lane per group; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_lanes, 32, "lanes running at once per group");
ABSL_FLAG(int, mask_threads, 0,
          "threads computing the token masks of grammar-constrained rows (response_format, "
          "tool_choice), the planning thread included; 0 = half the cores, at most 8");
ABSL_FLAG(int, round_token_budget, 512, "tokens fed per round (decode rows plus prefill chunks)");
ABSL_FLAG(double, itl_target_ms, 50,
          "target inter-token latency of decoding lanes while prompts prefill; 0 = none");
ABSL_FLAG(int, min_prefill_chunk, 16, "prompt tokens per round even when the target is missed");
ABSL_FLAG(int, max_choices, 16, "largest n of one request");
ABSL_FLAG(int, max_tokens_default, 0,
          "max_tokens of requests that give none; 0 = up to the context limit");
ABSL_FLAG(int, pipeline_depth, 2,
          "rounds of one group in flight at once: 2 sends the next round while the workers run "
          "the previous one, 1 plans each round after the previous result");
ABSL_FLAG(bool, kvstore_offload, true,
          "where the workers have a kvstore (their --kvstore), copy every full KV block there "
          "once its KV is final, so that an evicted or preempted prefix comes back without "
          "recomputation");
ABSL_FLAG(bool, kvstore_restore, true,
          "before admitting a prompt, bring its uncached full blocks back from the workers' "
          "kvstores");
ABSL_FLAG(int, kvstore_restore_deadline_ms, 1000,
          "longest wait for the ranks to restore one prompt's blocks; past it the prompt is "
          "prefilled as usual");
ABSL_FLAG(bool, partial_block_reuse, true,
          "let a prompt reuse the first positions of a cached KV block, not only whole blocks "
          "(the plan copies the block for it first), so an identical resend recomputes only "
          "its last token");
ABSL_FLAG(int, kvstore_max_offloads_per_round, 256,
          "offloaded blocks one round carries at most (write-backs of blocks it evicts first)");
ABSL_FLAG(std::string, spec_drafters, "none",
          "speculative decoding's draft sources, comma-separated, in order of preference: "
          "ngram (prompt lookup), suffix (suffix decoding, per request and over recent outputs), "
          "random (always wrong; for benchmarks), model (the workers' draft model: start rank 0 "
          "with --draft_model); none = off (make serve turns on ngram,suffix). "
          "Output is identical either way");
ABSL_FLAG(int, spec_max_drafts, 8, "most draft tokens per decode step (1..64)");
ABSL_FLAG(bool, spec_adaptive, true,
          "choose each step's draft depth from measured acceptance and round cost (false: "
          "always draft as deep as the source proposes; for tests)");
ABSL_FLAG(bool, spec_gate, true,
          "with --spec_adaptive: measure, per number of decoding lanes, whether rounds with "
          "drafts give more tokens per second than rounds without, and stop drafting where "
          "they do not (false: the round-cost model alone decides)");
ABSL_FLAG(int64_t, spec_suffix_cache_tokens, 65536,
          "tokens of recent outputs the global suffix cache keeps (0 = no global cache)");
ABSL_FLAG(std::string, round_log, "",
          "append every round sent (lanes, row kinds, tokens fed, budget) to this file as JSON "
          "lines; for tests and traces");
ABSL_FLAG(int, round_deadline_ms, 15000,
          "longest wait for one round's results from every rank of a group (15 s); a rank that "
          "misses it fails the group's lanes with UNAVAILABLE and the group reconnects. Must "
          "exceed the slowest round of the model");
ABSL_FLAG(int, connect_timeout_ms, 3000, "how long one attempt to connect a worker group waits");
ABSL_FLAG(int, drain_timeout_ms, 5000, "how long running calls may finish on SIGTERM");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8080",
          "host:port of the OpenAI-compatible HTTP gateway; port 0 picks one; 'off' = none");
ABSL_FLAG(std::string, api_key_file, "",
          "file of accepted API keys, one per line ('#' comments); also RINGLANE_API_KEYS "
          "(comma-separated). Without keys the gateway only serves loopback");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "serve a non-loopback --http_listen or --listen without API keys");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signs every worker's certificate: with --tls_cert and "
          "--tls_key, the router talks to workers over mutual TLS (all three or none)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate the router presents to workers");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(bool, metrics_require_key, false, "require an API key for /metrics too");
ABSL_FLAG(int, max_concurrent_per_key, 64,
          "choices (prompts x n) of generation requests in progress per API key (per client IP "
          "without keys); 0 = no limit");
ABSL_FLAG(int64_t, max_body_bytes, 16 << 20, "largest HTTP request body; larger is 413");
ABSL_FLAG(int, http_max_connections, 1024, "HTTP connections open at once; more get 503");
ABSL_FLAG(int, http_max_connections_per_peer, 256,
          "HTTP connections open at once from one client IP; more get 503 (probes are still "
          "answered); 0 = no limit");
ABSL_FLAG(int, http_first_byte_timeout_ms, 10000,
          "how long a new HTTP connection may stay silent before its first request");
ABSL_FLAG(int, http_idle_timeout_ms, 60000,
          "how long an HTTP connection may idle between requests, or take to send one");
ABSL_FLAG(int, max_json_depth, 64, "deepest nesting of arrays/objects in a request body");
ABSL_FLAG(int, max_choices_per_request, 64,
          "prompts x n of one HTTP request (each choice is a lane)");
ABSL_FLAG(int64_t, max_buffered_logprobs, 1 << 16,
          "logprob entries (choices x max_tokens x (top_logprobs+1)) a non-streamed response "
          "may hold; larger requests must stream");
ABSL_FLAG(int64_t, max_request_id_bytes, 128, "longest request id (body or X-Request-Id)");
ABSL_FLAG(int64_t, max_session_id_bytes, 256,
          "longest session id / prompt_cache_key (kept in the affinity map)");
ABSL_FLAG(int64_t, max_stop_bytes, 1024, "longest stop string");
ABSL_FLAG(std::string, chat_template, "auto",
          "chat template: auto (from tokenizer_config.json beside --tokenizer; plain when it "
          "has none), plain, chatml, qwen2, llama3, llama3.1, glm4, glm4.5 or glm4.7 (also "
          "GLM-5)");
ABSL_FLAG(bool, loop_watchdog, true,
          "stop generations that loop (requests may opt out with loop_watchdog: false)");
ABSL_FLAG(int, loop_max_period, 64, "longest token cycle the loop watchdog looks for");
ABSL_FLAG(int, loop_flag_repeats, 4,
          "occurrences of a cycle in a row that flag a lane as looping (metric, log line)");
ABSL_FLAG(int, loop_stop_tokens, 256,
          "tokens of pure repetition after which a looping lane is stopped (finish reason "
          "loop); 0 = only flag");

namespace rs = ringlane::services;
namespace rr = ringlane::router;

namespace {

using rs::IsLoopbackHost;

// A numeric flag and the range it must lie in. main() checks every row in
// one loop before it builds anything, so each bound is written once, beside
// its flag's name.
struct FlagRange {
  const char* name;  // without the leading "--"
  double value;
  double min;
  double max;
};
constexpr double kNoMax = std::numeric_limits<double>::infinity();

template <typename T>
FlagRange Range(const char* name, T value, double min, double max = kNoMax) {
  return {name, static_cast<double>(value), min, max};
}

// Exits with a usage error (status 2) naming the first flag out of its range.
void CheckFlagRanges(std::initializer_list<FlagRange> flags) {
  auto number = [](double x) { return absl::StrFormat("%.15g", x); };
  for (const FlagRange& f : flags) {
    if (f.value >= f.min && f.value <= f.max) continue;  // NaN fails too
    rs::ExitWithUsageError(
        f.max == kNoMax
            ? absl::StrCat("--", f.name, " must be >= ", number(f.min))
            : absl::StrCat("--", f.name, " must be in [", number(f.min), ", ", number(f.max), "]"));
  }
}

// Keys from --api_key_file and RINGLANE_API_KEYS; exits when the file
// cannot be read.
std::set<std::string> LoadApiKeys(const std::string& file) {
  std::set<std::string> keys;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) rs::ExitWithUsageError(absl::StrCat("--api_key_file: cannot read ", file));
    std::string line;
    while (std::getline(in, line)) {
      std::string k(absl::StripAsciiWhitespace(line));
      if (!k.empty() && k[0] != '#') keys.insert(k);
    }
    if (keys.empty()) rs::ExitWithUsageError(absl::StrCat("--api_key_file: no keys in ", file));
  }
  if (const char* env = std::getenv("RINGLANE_API_KEYS")) {
    for (absl::string_view k : absl::StrSplit(env, ',')) {
      std::string key(absl::StripAsciiWhitespace(k));
      if (!key.empty()) keys.insert(key);
    }
  }
  return keys;
}

// --chat_template=auto: the template named by tokenizer_config.json in the
// tokenizer's directory (or beside the tokenizer file).
absl::StatusOr<rr::ChatTemplate> ResolveChatTemplate(const std::string& flag,
                                                     const std::string& tokenizer_path) {
  if (flag != "auto") return rr::ChatTemplateByName(flag);
  std::filesystem::path dir(tokenizer_path);
  if (!std::filesystem::is_directory(dir)) dir = dir.parent_path();
  const std::filesystem::path config = dir / "tokenizer_config.json";
  std::ifstream in(config);
  if (!in) return rr::ChatTemplate(rr::ChatTemplateFamily::kPlain);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = rr::DetectChatTemplate(text);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(config.string(), ": ", t.status().message(),
                                                        "; choose one with --chat_template"));
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ringlane-router --workers=host:port[,host:port...][;...] --tokenizer=PATH "
      "[--listen=127.0.0.1:50051]");
  absl::ParseCommandLine(argc, argv);
  rs::InstallShutdownSignalHandlers();
  rs::SetLogComponent("router");

  auto level = rs::ParseSeverity(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) rs::ExitWithUsageError(absl::StrCat("--log_level: ", level.status().message()));
  rs::SetMinLogSeverity(*level);

  CheckFlagRanges({
      Range("default_temperature", absl::GetFlag(FLAGS_default_temperature), 0, 100),
      Range("max_waiting", absl::GetFlag(FLAGS_max_waiting), 1),
      Range("round_token_budget", absl::GetFlag(FLAGS_round_token_budget), 2),
      Range("max_lanes", absl::GetFlag(FLAGS_max_lanes), 1),
      Range("mask_threads", absl::GetFlag(FLAGS_mask_threads), 0, 256),
      Range("itl_target_ms", absl::GetFlag(FLAGS_itl_target_ms), 0),
      Range("min_prefill_chunk", absl::GetFlag(FLAGS_min_prefill_chunk), 1),
      Range("max_choices", absl::GetFlag(FLAGS_max_choices), 1),
      Range("max_tokens_default", absl::GetFlag(FLAGS_max_tokens_default), 0),
      Range("pipeline_depth", absl::GetFlag(FLAGS_pipeline_depth), 1, 2),
      Range("round_deadline_ms", absl::GetFlag(FLAGS_round_deadline_ms), 100, 3600 * 1000),
      Range("connect_timeout_ms", absl::GetFlag(FLAGS_connect_timeout_ms), 1),
      Range("drain_timeout_ms", absl::GetFlag(FLAGS_drain_timeout_ms), 0),
      Range("max_concurrent_per_key", absl::GetFlag(FLAGS_max_concurrent_per_key), 0),
      Range("max_body_bytes", absl::GetFlag(FLAGS_max_body_bytes), 1024),
      Range("http_max_connections", absl::GetFlag(FLAGS_http_max_connections), 1),
      Range("http_max_connections_per_peer", absl::GetFlag(FLAGS_http_max_connections_per_peer), 0),
      Range("http_first_byte_timeout_ms", absl::GetFlag(FLAGS_http_first_byte_timeout_ms), 1),
      Range("http_idle_timeout_ms", absl::GetFlag(FLAGS_http_idle_timeout_ms), 1),
      Range("max_json_depth", absl::GetFlag(FLAGS_max_json_depth), 8, 10000),
      Range("max_choices_per_request", absl::GetFlag(FLAGS_max_choices_per_request), 1),
      Range("max_buffered_logprobs", absl::GetFlag(FLAGS_max_buffered_logprobs), 0),
      Range("max_request_id_bytes", absl::GetFlag(FLAGS_max_request_id_bytes), 8, 4096),
      Range("max_session_id_bytes", absl::GetFlag(FLAGS_max_session_id_bytes), 8, 65536),
      Range("max_stop_bytes", absl::GetFlag(FLAGS_max_stop_bytes), 1, 1 << 20),
      Range("kvstore_restore_deadline_ms", absl::GetFlag(FLAGS_kvstore_restore_deadline_ms), 1,
            60000),
      Range("kvstore_max_offloads_per_round", absl::GetFlag(FLAGS_kvstore_max_offloads_per_round),
            0, 100000),
  });

  rr::RouterOptions o;
  const std::string workers = absl::GetFlag(FLAGS_workers);
  if (workers.empty()) rs::ExitWithUsageError("--workers is required");
  for (absl::string_view g : absl::StrSplit(workers, ';')) {
    std::vector<std::string> ranks;
    for (absl::string_view a : absl::StrSplit(g, ',')) {
      if (auto hp = rs::ParseHostPort(std::string(a)); !hp.ok() || hp->second == 0) {
        rs::ExitWithUsageError(absl::StrCat("--workers: bad address '", std::string(a),
                                            "': ", hp.ok() ? "port 0" : hp.status().message()));
      }
      ranks.emplace_back(a);
    }
    o.groups.push_back(std::move(ranks));
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  auto listen_hp = rs::ParseHostPort(listen);
  if (!listen_hp.ok()) {
    rs::ExitWithUsageError(absl::StrCat("--listen: ", listen_hp.status().message()));
  }
  auto tls = rs::LoadTls(
      {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)});
  if (!tls.ok()) rs::ExitWithUsageError(std::string(tls.status().message()));
  // Before the first worker channel exists: every one of them uses it.
  rs::SetPeerTls(*tls);
  const std::string tok_path = absl::GetFlag(FLAGS_tokenizer);
  if (tok_path.empty()) rs::ExitWithUsageError("--tokenizer is required");
  o.model_id = absl::GetFlag(FLAGS_model_id);
  o.default_temperature = static_cast<float>(absl::GetFlag(FLAGS_default_temperature));
  auto policy = rr::ParseSeedPolicy(absl::GetFlag(FLAGS_seed_policy));
  if (!policy.ok())
    rs::ExitWithUsageError(absl::StrCat("--seed_policy: ", policy.status().message()));
  o.seed_policy = *policy;
  o.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.round_token_budget = absl::GetFlag(FLAGS_round_token_budget);
  o.max_lanes = absl::GetFlag(FLAGS_max_lanes);
  o.mask_threads = absl::GetFlag(FLAGS_mask_threads);
  if (o.mask_threads == 0) {
    o.mask_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  }
  // The one bound that depends on another flag: decode rows of every lane
  // must leave a round's budget room for prefill.
  if (o.max_lanes >= o.round_token_budget) {
    rs::ExitWithUsageError("--max_lanes must be in [1, --round_token_budget)");
  }
  o.itl_target_ms = absl::GetFlag(FLAGS_itl_target_ms);
  o.min_prefill_chunk = absl::GetFlag(FLAGS_min_prefill_chunk);
  o.max_choices = absl::GetFlag(FLAGS_max_choices);
  o.max_tokens_default = absl::GetFlag(FLAGS_max_tokens_default);
  o.pipeline_depth = absl::GetFlag(FLAGS_pipeline_depth);
  o.partial_block_reuse = absl::GetFlag(FLAGS_partial_block_reuse);
  o.kv_tiering.offload = absl::GetFlag(FLAGS_kvstore_offload);
  o.kv_tiering.restore = absl::GetFlag(FLAGS_kvstore_restore);
  o.kv_tiering.restore_deadline =
      std::chrono::milliseconds(absl::GetFlag(FLAGS_kvstore_restore_deadline_ms));
  o.kv_tiering.max_offloads_per_round = absl::GetFlag(FLAGS_kvstore_max_offloads_per_round);
  o.round_deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_round_deadline_ms));
  o.round_log_path = absl::GetFlag(FLAGS_round_log);
  if (const std::string d = absl::GetFlag(FLAGS_spec_drafters); d != "none" && !d.empty()) {
    o.speculation.sources = absl::StrSplit(d, ',', absl::SkipEmpty());
  }
  o.speculation.max_drafts = absl::GetFlag(FLAGS_spec_max_drafts);
  o.speculation.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  o.speculation.gate = absl::GetFlag(FLAGS_spec_gate);
  o.speculation.source_options.suffix_cache_tokens = absl::GetFlag(FLAGS_spec_suffix_cache_tokens);
  if (o.speculation.source_options.suffix_cache_tokens < 0) {
    rs::ExitWithUsageError("--spec_suffix_cache_tokens must be >= 0");
  }
  o.loop_watchdog.enabled = absl::GetFlag(FLAGS_loop_watchdog);
  o.loop_watchdog.max_period = absl::GetFlag(FLAGS_loop_max_period);
  o.loop_watchdog.flag_repeats = absl::GetFlag(FLAGS_loop_flag_repeats);
  o.loop_watchdog.stop_after_tokens = absl::GetFlag(FLAGS_loop_stop_tokens);
  if (auto d = rr::LoopDetector::Create(o.loop_watchdog); !d.ok()) {
    rs::ExitWithUsageError(absl::StrCat("--loop_*: ", d.status().message()));
  }
  auto chat_template = ResolveChatTemplate(absl::GetFlag(FLAGS_chat_template), tok_path);
  if (!chat_template.ok()) {
    rs::ExitWithUsageError(absl::StrCat("--chat_template: ", chat_template.status().message()));
  }
  o.chat_template = *chat_template;

  rr::GatewayOptions go;
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  const bool http_on = http_listen != "off";
  // One set of keys and one loopback rule for both public APIs.
  go.api_keys = LoadApiKeys(absl::GetFlag(FLAGS_api_key_file));
  auto refuse_open = [&](const char* flag, const std::string& value, const std::string& host) {
    if (go.api_keys.empty() && !IsLoopbackHost(host) &&
        !absl::GetFlag(FLAGS_allow_unauthenticated)) {
      rs::ExitWithUsageError(absl::StrCat(
          flag, "=", value,
          " is reachable from other hosts but no API keys are set: give --api_key_file or "
          "RINGLANE_API_KEYS, or pass --allow_unauthenticated"));
    }
  };
  refuse_open("--listen", listen, listen_hp->first);
  if (http_on) {
    auto hp = rs::ParseHostPort(http_listen);
    if (!hp.ok()) rs::ExitWithUsageError(absl::StrCat("--http_listen: ", hp.status().message()));
    go.listen = http_listen;
    refuse_open("--http_listen", http_listen, hp->first);
  }
  go.metrics_require_key = absl::GetFlag(FLAGS_metrics_require_key);
  go.max_concurrent_per_key = absl::GetFlag(FLAGS_max_concurrent_per_key);
  go.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_body_bytes));
  go.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  go.max_connections_per_peer = absl::GetFlag(FLAGS_http_max_connections_per_peer);
  go.first_byte_timeout =
      std::chrono::milliseconds(absl::GetFlag(FLAGS_http_first_byte_timeout_ms));
  go.idle_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_http_idle_timeout_ms));
  go.limits.max_json_depth = absl::GetFlag(FLAGS_max_json_depth);
  go.limits.max_choices = absl::GetFlag(FLAGS_max_choices_per_request);
  go.max_buffered_logprobs = absl::GetFlag(FLAGS_max_buffered_logprobs);
  o.max_request_id_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_request_id_bytes));
  o.max_session_id_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_session_id_bytes));
  go.max_request_id_bytes = o.max_request_id_bytes;
  go.limits.max_request_id_bytes = o.max_request_id_bytes;
  go.limits.max_session_id_bytes = o.max_session_id_bytes;
  o.max_stop_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_stop_bytes));
  go.limits.max_stop_bytes = o.max_stop_bytes;
  o.connect_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_connect_timeout_ms));

  auto tok = rr::LoadTokenizer(tok_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: --tokenizer: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const std::string o_chat_name(o.chat_template.name());
  auto router = rr::Router::Create(std::move(o), std::move(*tok));
  if (!router.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(router.status().message()).c_str());
    return 1;
  }
  auto server = rr::RouterServer::Start(router->get(), listen, rr::ApiKeys(go.api_keys));
  if (!server.ok()) {
    std::fprintf(stderr, "error: --listen: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<rr::Gateway> gateway;
  if (http_on) {
    auto g = rr::Gateway::Start(router->get(), go);
    if (!g.ok()) {
      std::fprintf(stderr, "error: --http_listen: %s\n", std::string(g.status().message()).c_str());
      return 1;
    }
    gateway = std::move(*g);
  }
  const auto hp = *rs::ParseHostPort(listen);
  std::string line =
      absl::StrCat("LISTENING router=", rs::JoinHostPort(hp.first, (*server)->port()));
  if (gateway) {
    const std::string http =
        rs::JoinHostPort(rs::ParseHostPort(http_listen)->first, gateway->port());
    absl::StrAppend(&line, "\nLISTENING http=", http);
    RL_LOG(INFO) << "serving the OpenAI API on http://" << http << "/v1 ("
                 << (go.api_keys.empty() ? std::string("no API key required")
                                         : absl::StrCat(go.api_keys.size(), " API key(s)"))
                 << ", chat template " << std::string(o_chat_name) << ")";
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  RL_LOG(INFO) << "serving the Generate API on " << rs::JoinHostPort(hp.first, (*server)->port())
               << " ("
               << (go.api_keys.empty() ? std::string("no API key required")
                                       : absl::StrCat(go.api_keys.size(), " API key(s)"))
               << ") for " << workers
               << (rs::PeerTlsEnabled() ? " over mutual TLS" : " over plaintext gRPC");

  const int sig = rs::WaitForShutdownSignal();
  RL_LOG(INFO) << "signal " << sig << ", draining";
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  if (gateway) gateway->BeginDrain();
  (*server)->Shutdown(absl::ToChronoTime(deadline));
  if (gateway) gateway->Drain(deadline);
  gateway.reset();
  router->reset();
  server->reset();
  return 0;
}
