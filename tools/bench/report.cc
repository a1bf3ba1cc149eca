#include "tools/bench/report.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace ringlane::bench {
namespace {

using json = nlohmann::json;

// Milliseconds with precision that suits their size; "-" for no data.
std::string Ms(double v) {
  if (std::isnan(v)) return "-";
  if (v < 10) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.1f", v);
}

std::string Rate(double v) {
  if (std::isnan(v) || v <= 0) return "-";
  return absl::StrFormat("%.1f", v);
}

std::string GroupName(const GroupStats& g) {
  return g.phase.empty() ? g.stage : absl::StrCat(g.stage, " (", g.phase, ")");
}

std::string SampleWhere(const RequestSample& s) {
  std::string where = absl::StrCat("request ", s.id, " (", s.stage, " c=", s.concurrency);
  if (!s.phase.empty()) absl::StrAppend(&where, " ", s.phase);
  if (s.session >= 0) absl::StrAppend(&where, " session ", s.session, " turn ", s.turn);
  return where + ")";
}

std::string Counter(const CounterValues& v, const char* key) {
  auto it = v.find(key);
  if (it == v.end()) return "n/a";
  return absl::StrFormat("%.0f", it->second);
}

// Client-side sums over every sample of a level (failed ones included: the
// server counts the tokens it produced for them too).
struct LevelSums {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached = 0;
  int64_t requests = 0;
  int64_t errors = 0;
  int64_t turns = 0;
  int64_t loops = 0;
};

// `phase` (when given) keeps only that phase's samples.
LevelSums SumLevel(const RunResult& run, const LevelResult& l, const std::string* phase = nullptr) {
  LevelSums s;
  for (const RequestSample& r : run.samples) {
    if (r.stage != l.stage || r.concurrency != l.concurrency) continue;
    if (phase != nullptr && r.phase != *phase) continue;
    ++s.requests;
    if (!r.ok()) ++s.errors;
    if (r.ok() && r.turn >= 0) ++s.turns;
    if (r.loop_flagged) ++s.loops;
    s.prompt += std::max<int64_t>(0, r.usage_prompt_tokens);
    s.completion += std::max<int64_t>(0, r.usage_completion_tokens);
    s.cached += std::max<int64_t>(0, r.usage_cached_tokens);
  }
  return s;
}

// "512" when the server and the client agree, "DIFFERS: server 510, client
// 512" when not, "n/a" when the server does not say.
std::string Agreement(const CounterValues& delta, const char* key, int64_t client) {
  auto it = delta.find(key);
  if (it == delta.end()) return absl::StrCat("n/a (client ", client, ")");
  const int64_t server = std::llround(it->second);
  if (server == client) return absl::StrCat(server, " = ", client);
  return absl::StrCat("**DIFFERS**: server ", server, ", client ", client);
}

std::string TwoDecimals(const std::optional<double>& v) {
  return v.has_value() ? absl::StrFormat("%.2f", *v) : "n/a";
}

std::string Percent(const std::optional<double>& v) {
  return v.has_value() ? absl::StrFormat("%.1f%%", 100 * *v) : "n/a";
}

json OptionalJson(const std::optional<double>& v) { return v.has_value() ? json(*v) : json(); }

void AddStepStatsJson(const StepStats& s, json* j) {
  (*j)["tokens_per_step"] = OptionalJson(s.tokens_per_step);
  (*j)["draft_acceptance"] = OptionalJson(s.draft_acceptance);
  (*j)["accepted_per_verify_row"] = OptionalJson(s.accepted_per_verify_row);
}

// The counters a group's step statistics come from: its level's difference,
// or its phase's; nullptr when there is none to trust.
const CounterValues* GroupCounters(const RunResult& run, const GroupStats& g) {
  for (const LevelResult& l : run.levels) {
    if (l.stage != g.stage || l.concurrency != g.concurrency) continue;
    if (!l.has_metrics || l.counter_resets > 0) return nullptr;
    if (g.phase.empty()) return &l.delta;
    auto it = l.phase_delta.find(g.phase);
    return it != l.phase_delta.end() ? &it->second : nullptr;
  }
  return nullptr;
}

json SummaryJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

std::string CheckText(const GroupStats& g) {
  const int64_t ok = g.requests - g.errors;
  if (ok == 0) return "-";
  std::vector<std::string> parts;
  if (g.mismatched) parts.push_back(absl::StrCat("**MISMATCH** ", g.mismatched, "/", ok));
  if (g.verified) parts.push_back(absl::StrCat("verified ", g.verified, "/", ok));
  if (g.unverified) parts.push_back(absl::StrCat("unverified ", g.unverified, "/", ok));
  if (g.no_usage) parts.push_back(absl::StrCat("no usage ", g.no_usage, "/", ok));
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::vector<GroupStats> ComputeGroups(const RunResult& run) {
  // Groups in the order their first sample appears (stage, level, phase).
  std::vector<std::tuple<std::string, int, std::string>> order;
  std::map<std::tuple<std::string, int, std::string>, std::vector<const RequestSample*>> by_key;
  for (const RequestSample& s : run.samples) {
    auto key = std::make_tuple(s.stage, s.concurrency, s.phase);
    if (!by_key.count(key)) order.push_back(key);
    by_key[key].push_back(&s);
  }
  std::vector<GroupStats> out;
  for (const auto& key : order) {
    GroupStats g;
    std::tie(g.stage, g.concurrency, g.phase) = key;
    for (const Stage& st : run.workload.stages) {
      if (st.name == g.stage) g.mode = st.mode;
    }
    std::vector<double> ttft, itl, tpot, e2e, per_stream, prefill;
    double first_start = INFINITY, last_end = -INFINITY;
    for (const RequestSample* s : by_key[key]) {
      ++g.requests;
      if (!s->ok()) {
        ++g.errors;
        continue;
      }
      if (!std::isnan(s->ttft_ms)) ttft.push_back(s->ttft_ms);
      itl.insert(itl.end(), s->itl_ms.begin(), s->itl_ms.end());
      if (!std::isnan(s->tpot_ms)) tpot.push_back(s->tpot_ms);
      if (!std::isnan(s->e2e_ms)) {
        e2e.push_back(s->e2e_ms);
        if (s->e2e_ms > 0) per_stream.push_back(s->output_tokens * 1000.0 / s->e2e_ms);
        first_start = std::min(first_start, s->start_s);
        last_end = std::max(last_end, s->start_s + s->e2e_ms / 1000);
      }
      if (s->usage_prompt_tokens > 0 && !std::isnan(s->ttft_ms) && s->ttft_ms > 0) {
        prefill.push_back(s->usage_prompt_tokens * 1000.0 / s->ttft_ms);
      }
      g.usage_prompt_tokens += std::max<int64_t>(0, s->usage_prompt_tokens);
      g.usage_completion_tokens += std::max<int64_t>(0, s->usage_completion_tokens);
      g.logprob_tokens += std::max<int64_t>(0, s->logprob_tokens);
      g.output_tokens += s->output_tokens;
      if (s->usage_cached_tokens >= 0) {
        g.cached_tokens += s->usage_cached_tokens;
        ++g.with_cached;
      }
      switch (s->check) {
        case TokenCheck::kVerified:
          ++g.verified;
          break;
        case TokenCheck::kMismatch:
          ++g.mismatched;
          break;
        case TokenCheck::kUnverified:
          ++g.unverified;
          break;
        case TokenCheck::kNoUsage:
          ++g.no_usage;
          break;
      }
      if (s->prompt_tokens_exact && s->usage_prompt_tokens >= 0 &&
          s->usage_prompt_tokens != s->prompt_tokens_expected) {
        ++g.prompt_mismatched;
      }
      if (!s->streamed) ++g.not_streamed;
      if (s->loop_flagged) ++g.loops_flagged;
    }
    g.ttft_ms = Summarize(ttft);
    g.itl_ms = Summarize(itl);
    g.tpot_ms = Summarize(tpot);
    g.e2e_ms = Summarize(e2e);
    const double span = last_end - first_start;
    // Resend's phases interleave (cold, warm, cold, ...), so only its whole
    // level has a throughput; agentic's run one after the other.
    const bool own_span = g.phase.empty() || g.mode == StageMode::kAgentic;
    g.aggregate_tps = span > 0 && own_span ? g.output_tokens / span : NAN;
    g.per_stream_tps = Summarize(per_stream).mean;
    g.prefill_tps = Summarize(prefill).mean;
    if (const CounterValues* c = GroupCounters(run, g)) g.steps = ComputeStepStats(*c);
    out.push_back(std::move(g));
  }
  return out;
}

std::string RenderMarkdown(const RunResult& run, const std::vector<GroupStats>& groups) {
  std::string md;
  const ServerOptions& sv = run.server;
  absl::StrAppend(&md, "# ringlane-bench: ", run.workload.name, "\n\n");
  if (!run.workload.description.empty()) absl::StrAppend(&md, run.workload.description, "\n\n");
  absl::StrAppend(&md, "- server: `", sv.base_url, "` (",
                  sv.kind == ServerKind::kRinglane ? "ringlane" : "generic", "), model `", sv.model,
                  "`, endpoint ", EndpointName(run.workload.endpoint), "\n");
  absl::StrAppend(&md, "- started ", run.started_at, ", seed ", run.seed, ", temperature ",
                  run.workload.temperature, ", ", run.samples.size(), " requests\n");
  absl::StrAppend(&md, "- output tokens counted from ",
                  sv.request_logprobs ? "logprob entries (checked against usage)"
                                      : "usage only (no logprobs requested: unverified)",
                  "\n");
  absl::StrAppend(&md,
                  "- percentiles: linear interpolation between closest ranks (NumPy's default); "
                  "latencies in ms over successful requests; ITL per token (a chunk's gap / its "
                  "tokens); TPOT = (E2E - TTFT) / (n - 1)\n");
  for (const std::string& n : run.notes) absl::StrAppend(&md, "- note: ", n, "\n");

  absl::StrAppend(&md, "\n## Latency (ms)\n\n",
                  "| stage | conc | req | err | TTFT p50 | p90 | p99 | ITL p50 | p90 | p99 | "
                  "TPOT p50 | p90 | p99 | E2E p50 | p90 | p99 |\n",
                  "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (const GroupStats& g : groups) {
    absl::StrAppend(&md, "| ", GroupName(g), " | ", g.concurrency, " | ", g.requests, " | ",
                    g.errors, " | ", Ms(g.ttft_ms.p50), " | ", Ms(g.ttft_ms.p90), " | ",
                    Ms(g.ttft_ms.p99), " | ", Ms(g.itl_ms.p50), " | ", Ms(g.itl_ms.p90), " | ",
                    Ms(g.itl_ms.p99), " | ", Ms(g.tpot_ms.p50), " | ", Ms(g.tpot_ms.p90), " | ",
                    Ms(g.tpot_ms.p99), " | ", Ms(g.e2e_ms.p50), " | ", Ms(g.e2e_ms.p90), " | ",
                    Ms(g.e2e_ms.p99), " |\n");
  }

  absl::StrAppend(
      &md, "\n## Throughput and token counts\n\n",
      "| stage | conc | output tok/s (all streams) | tok/s per stream | prefill tok/s | "
      "prompt tokens (usage) | output tokens (usage) | output tokens (logprobs) | "
      "cached tokens | token check |\n",
      "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
  for (const GroupStats& g : groups) {
    absl::StrAppend(&md, "| ", GroupName(g), " | ", g.concurrency, " | ", Rate(g.aggregate_tps),
                    " | ", Rate(g.per_stream_tps), " | ", Rate(g.prefill_tps), " | ",
                    g.usage_prompt_tokens, " | ", g.usage_completion_tokens, " | ",
                    g.verified + g.mismatched + g.no_usage > 0 ? absl::StrCat(g.logprob_tokens)
                                                               : std::string("-"),
                    " | ", g.with_cached > 0 ? absl::StrCat(g.cached_tokens) : std::string("-"),
                    " | ", CheckText(g), " |\n");
  }

  bool any_metrics = false;
  for (const LevelResult& l : run.levels) any_metrics = any_metrics || l.has_metrics;
  if (any_metrics) {
    absl::StrAppend(
        &md, "\n## Server metrics (difference over each level, from `", sv.metrics_url, "`)\n\n",
        "| stage | conc | rounds | prompt tokens (server = client) | generated tokens (server = "
        "client) | cached tokens (server = client) | loops flagged / stopped | preemptions | "
        "tokens per step | draft acceptance | accepted per verify row |\n",
        "|---|--:|--:|---|---|---|--:|--:|--:|--:|--:|\n");
    auto row = [&](const std::string& label, const LevelResult& l, const CounterValues& d,
                   const LevelSums& s) {
      const StepStats steps = ComputeStepStats(d);
      absl::StrAppend(&md, "| ", label, " | ", l.concurrency, " | ", Counter(d, "rounds"), " | ",
                      Agreement(d, "prompt_tokens", s.prompt), " | ",
                      Agreement(d, "generation_tokens", s.completion), " | ",
                      Agreement(d, "cached_prompt_tokens", s.cached), " | ",
                      Counter(d, "loops_detected"), " / ", Counter(d, "loops_stopped"), " | ",
                      Counter(d, "preemptions"), " | ", TwoDecimals(steps.tokens_per_step), " | ",
                      Percent(steps.draft_acceptance), " | ",
                      TwoDecimals(steps.accepted_per_verify_row), " |\n");
    };
    for (const LevelResult& l : run.levels) {
      if (!l.has_metrics) continue;
      // A restarted server counts from zero again and lost what the old
      // process counted since the last read: its totals cannot be compared.
      row(l.stage, l, l.counter_resets > 0 ? CounterValues() : l.delta, SumLevel(run, l));
      for (const auto& [phase, d] : l.phase_delta) {
        row(absl::StrCat(l.stage, " (", phase, ")"), l, d, SumLevel(run, l, &phase));
      }
    }
    absl::StrAppend(&md,
                    "\ntokens per step = generated tokens / rows that sampled (a prompt's last "
                    "chunk, a decode row, a verify row; 1.00 without speculation); draft "
                    "acceptance = accepted / drafted tokens; accepted per verify row = accepted "
                    "tokens / rows that carried drafts. n/a: the server does not export the "
                    "counters.\n");
  }

  bool any_soak = false;
  for (const LevelResult& l : run.levels) any_soak = any_soak || l.mode == StageMode::kConversation;
  if (any_soak) {
    absl::StrAppend(&md, "\n## Soak\n\n",
                    "| stage | conc | time (s) | sessions | turns done | errors | restarts seen | "
                    "outages | looping outputs (client) | loops flagged / stopped (server) |\n",
                    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (const LevelResult& l : run.levels) {
      if (l.mode != StageMode::kConversation) continue;
      const LevelSums s = SumLevel(run, l);
      absl::StrAppend(&md, "| ", l.stage, " | ", l.concurrency, " | ",
                      absl::StrFormat("%.1f", l.wall_s), " | ", l.sessions, " | ", s.turns, " | ",
                      s.errors, " | ", l.has_metrics ? absl::StrCat(l.counter_resets) : "n/a",
                      " | ", l.outages, " | ", s.loops, " | ",
                      l.has_metrics && l.counter_resets == 0
                          ? absl::StrCat(Counter(l.delta, "loops_detected"), " / ",
                                         Counter(l.delta, "loops_stopped"))
                          : "n/a",
                      " |\n");
    }
  }

  // Every discrepancy by name: a mismatch is reported, never averaged away.
  std::vector<std::string> flags;
  std::map<std::string, int64_t> errors;
  int64_t retried = 0;
  for (const RequestSample& s : run.samples) {
    retried += s.retried;
    if (!s.ok()) {
      ++errors[s.error.substr(0, 160)];
      continue;
    }
    if (s.check == TokenCheck::kMismatch) {
      flags.push_back(
          absl::StrCat(SampleWhere(s), ": usage.completion_tokens = ", s.usage_completion_tokens,
                       " but the stream carried ", s.logprob_tokens, " logprob entries"));
    }
    if (s.prompt_tokens_exact && s.usage_prompt_tokens >= 0 &&
        s.usage_prompt_tokens != s.prompt_tokens_expected) {
      flags.push_back(
          absl::StrCat(SampleWhere(s), ": usage.prompt_tokens = ", s.usage_prompt_tokens,
                       " but the server's tokenizer counted ", s.prompt_tokens_expected));
    }
    if (!s.streamed) flags.push_back(SampleWhere(s) + ": the response was not streamed");
    if (s.usage_completion_tokens < 0) {
      flags.push_back(SampleWhere(s) + ": no usage reported");
    }
  }
  for (const LevelResult& l : run.levels) {
    if (!l.has_metrics) continue;
    if (l.counter_resets > 0) {
      flags.push_back(absl::StrCat(l.stage, " c=", l.concurrency, ": the server restarted ",
                                   l.counter_resets,
                                   " time(s) during the level (its counters went back), so its "
                                   "metrics are not compared"));
      continue;
    }
    const LevelSums s = SumLevel(run, l);
    for (auto [key, client] : {std::pair<const char*, int64_t>{"prompt_tokens", s.prompt},
                               {"generation_tokens", s.completion}}) {
      auto it = l.delta.find(key);
      if (it != l.delta.end() && std::llround(it->second) != client) {
        flags.push_back(absl::StrCat(l.stage, " c=", l.concurrency, ": the server's ", key,
                                     " grew by ", std::llround(it->second),
                                     ", the responses' usage adds up to ", client));
      }
    }
  }
  if (retried > 0) {
    // Not an error: the server closed an idle kept-alive connection as the
    // request went out, and the client sent it again on a new one.
    flags.push_back(absl::StrCat(retried,
                                 " request(s) were retried once on a new connection: the "
                                 "server closed the kept-alive one unanswered"));
  }
  if (!flags.empty() || !errors.empty()) {
    absl::StrAppend(&md, "\n## Flags\n\n");
    constexpr size_t kMaxFlags = 40;
    for (size_t i = 0; i < flags.size() && i < kMaxFlags; ++i) {
      absl::StrAppend(&md, "- ", flags[i], "\n");
    }
    if (flags.size() > kMaxFlags) {
      absl::StrAppend(&md, "- ... and ", flags.size() - kMaxFlags, " more (samples.json)\n");
    }
    for (const auto& [message, count] : errors) {
      absl::StrAppend(&md, "- ", count, " request(s) failed: ",
                      absl::StrReplaceAll(message, {{"\n", " "}, {"|", "/"}}), "\n");
    }
  }
  return md;
}

std::string RenderJson(const RunResult& run, const std::vector<GroupStats>& groups) {
  json j;
  j["tool"] = "ringlane-bench";
  j["workload"] = run.workload.name;
  j["server"] = {{"base_url", run.server.base_url},
                 {"kind", run.server.kind == ServerKind::kRinglane ? "ringlane" : "generic"},
                 {"model", run.server.model},
                 {"logprobs", run.server.request_logprobs},
                 {"metrics_url", run.server.metrics_url},
                 {"tokenize_url", run.server.tokenize_url}};
  j["started_at"] = run.started_at;
  j["seed"] = run.seed;
  j["temperature"] = run.workload.temperature;
  j["endpoint"] = EndpointName(run.workload.endpoint);
  j["percentile_method"] = "linear interpolation between closest ranks (type 7)";
  j["notes"] = run.notes;
  json levels = json::array();
  for (const LevelResult& l : run.levels) {
    levels.push_back({{"stage", l.stage},
                      {"mode", StageModeName(l.mode)},
                      {"concurrency", l.concurrency},
                      {"requests_planned", l.requests_planned},
                      {"duration_bound_s", l.duration_bound_s},
                      {"wall_s", l.wall_s},
                      {"stopped_early", l.stopped_early},
                      {"has_metrics", l.has_metrics},
                      {"metrics_before", l.before},
                      {"metrics_after", l.after},
                      {"metrics_delta", l.delta},
                      {"restarts_seen", l.counter_resets},
                      {"outages", l.outages},
                      {"sessions", l.sessions},
                      {"warmup_requests", l.warmup_requests},
                      {"warmup_errors", l.warmup_errors},
                      {"warmup_prompt_tokens", l.warmup_prompt_tokens},
                      {"warmup_completion_tokens", l.warmup_completion_tokens},
                      {"document_requests", l.document_requests},
                      {"document_errors", l.document_errors},
                      {"document_prompt_tokens", l.document_prompt_tokens},
                      {"document_completion_tokens", l.document_completion_tokens}});
    json& lj = levels.back();
    AddStepStatsJson(
        l.has_metrics && l.counter_resets == 0 ? ComputeStepStats(l.delta) : StepStats(), &lj);
    json phases = json::array();
    for (const auto& [phase, d] : l.phase_delta) {
      json pj = {{"phase", phase}, {"metrics_delta", d}};
      AddStepStatsJson(ComputeStepStats(d), &pj);
      phases.push_back(std::move(pj));
    }
    lj["phases"] = std::move(phases);
  }
  j["levels"] = std::move(levels);
  json gs = json::array();
  for (const GroupStats& g : groups) {
    gs.push_back({{"stage", g.stage},
                  {"concurrency", g.concurrency},
                  {"phase", g.phase},
                  {"requests", g.requests},
                  {"errors", g.errors},
                  {"ttft_ms", SummaryJson(g.ttft_ms)},
                  {"itl_ms", SummaryJson(g.itl_ms)},
                  {"tpot_ms", SummaryJson(g.tpot_ms)},
                  {"e2e_ms", SummaryJson(g.e2e_ms)},
                  {"usage_prompt_tokens", g.usage_prompt_tokens},
                  {"usage_completion_tokens", g.usage_completion_tokens},
                  {"logprob_tokens", g.logprob_tokens},
                  {"output_tokens", g.output_tokens},
                  {"cached_tokens", g.cached_tokens},
                  {"verified", g.verified},
                  {"mismatched", g.mismatched},
                  {"unverified", g.unverified},
                  {"no_usage", g.no_usage},
                  {"prompt_mismatched", g.prompt_mismatched},
                  {"not_streamed", g.not_streamed},
                  {"loops_flagged", g.loops_flagged},
                  {"aggregate_tokens_per_s", g.aggregate_tps},
                  {"per_stream_tokens_per_s", g.per_stream_tps},
                  {"prefill_tokens_per_s", g.prefill_tps}});
    AddStepStatsJson(g.steps, &gs.back());
  }
  j["groups"] = std::move(gs);
  json samples = json::array();
  for (const RequestSample& s : run.samples) {
    json chunk_ms = json::array(), chunk_tokens = json::array();
    for (const ChunkArrival& c : s.chunks) {
      chunk_ms.push_back(c.t_ms);
      chunk_tokens.push_back(c.logprob_tokens >= 0 ? json(c.logprob_tokens) : json(nullptr));
    }
    auto opt = [](int64_t v) { return v >= 0 ? json(v) : json(nullptr); };
    samples.push_back({{"id", s.id},
                       {"stage", s.stage},
                       {"concurrency", s.concurrency},
                       {"phase", s.phase},
                       {"stream", s.stream},
                       {"session", opt(s.session)},
                       {"turn", opt(s.turn)},
                       {"start_s", s.start_s},
                       {"max_tokens", s.max_tokens},
                       {"prompt_tokens_expected", opt(s.prompt_tokens_expected)},
                       {"prompt_tokens_exact", s.prompt_tokens_exact},
                       {"http_status", s.http_status},
                       {"error", s.error},
                       {"connection_failed", s.connection_failed},
                       {"retried", s.retried},
                       {"streamed", s.streamed},
                       {"done_marker", s.done_marker},
                       {"finish_reason", s.finish_reason},
                       {"ttft_ms", s.ttft_ms},
                       {"e2e_ms", s.e2e_ms},
                       {"tpot_ms", s.tpot_ms},
                       {"chunk_ms", std::move(chunk_ms)},
                       {"chunk_tokens", std::move(chunk_tokens)},
                       {"itl_ms", s.itl_ms},
                       {"usage_prompt_tokens", opt(s.usage_prompt_tokens)},
                       {"usage_completion_tokens", opt(s.usage_completion_tokens)},
                       {"usage_cached_tokens", opt(s.usage_cached_tokens)},
                       {"logprob_tokens", opt(s.logprob_tokens)},
                       {"output_tokens", s.output_tokens},
                       {"token_check", TokenCheckName(s.check)},
                       {"verified", s.check == TokenCheck::kVerified},
                       {"loop_flagged", s.loop_flagged},
                       {"loop_period", s.loop_period},
                       {"text", s.text}});
  }
  j["samples"] = std::move(samples);
  // Replacement keeps a server's invalid UTF-8 from failing the whole file.
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

namespace {

absl::Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

// Runs `gnuplot script`; returns "" on success, else why not.
std::string RunGnuplot(const std::string& script) {
  std::vector<std::string> args = {"gnuplot", script};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ);
  if (rc == ENOENT) return "gnuplot is not installed (apt-get install gnuplot-nox)";
  if (rc != 0) return absl::StrCat("cannot start gnuplot: errno ", rc);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "gnuplot failed";
  return "";
}

std::string Dat(double v) { return std::isnan(v) ? "NaN" : absl::StrFormat("%.4f", v); }

// Quotes a path for a gnuplot string literal.
std::string GnuplotQuoted(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WriteOutputs(const RunResult& run,
                                                      const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<std::string> lines;
  const std::vector<GroupStats> groups = ComputeGroups(run);
  const fs::path out(dir);
  if (absl::Status s = WriteFile(out / "report.md", RenderMarkdown(run, groups)); !s.ok()) return s;
  lines.push_back((out / "report.md").string());
  if (absl::Status s = WriteFile(out / "samples.json", RenderJson(run, groups)); !s.ok()) return s;
  lines.push_back((out / "samples.json").string());

  for (const Stage& stage : run.workload.stages) {
    std::vector<const GroupStats*> rows;
    for (const GroupStats& g : groups) {
      if (g.stage == stage.name && g.phase.empty()) rows.push_back(&g);
    }
    if (stage.concurrency.size() < 2 || rows.size() < 2) continue;
    std::string dat =
        "# concurrency ttft_p50 ttft_p90 ttft_p99 tpot_p50 tpot_p90 tpot_p99 itl_p50 itl_p90 "
        "itl_p99 e2e_p50 e2e_p90 e2e_p99 aggregate_tps per_stream_tps\n";
    for (const GroupStats* g : rows) {
      absl::StrAppend(&dat, g->concurrency);
      for (double v :
           {g->ttft_ms.p50, g->ttft_ms.p90, g->ttft_ms.p99, g->tpot_ms.p50, g->tpot_ms.p90,
            g->tpot_ms.p99, g->itl_ms.p50, g->itl_ms.p90, g->itl_ms.p99, g->e2e_ms.p50,
            g->e2e_ms.p90, g->e2e_ms.p99, g->aggregate_tps, g->per_stream_tps}) {
        absl::StrAppend(&dat, " ", Dat(v));
      }
      dat += "\n";
    }
    const fs::path dat_path = fs::absolute(out / (stage.name + ".dat"));
    const fs::path png_path = fs::absolute(out / (stage.name + ".png"));
    const fs::path gp_path = fs::absolute(out / (stage.name + ".gp"));
    if (absl::Status s = WriteFile(dat_path, dat); !s.ok()) return s;
    const std::string d = GnuplotQuoted(dat_path.string());
    const std::string title =
        absl::StrReplaceAll(absl::StrCat(run.workload.name == stage.name
                                             ? stage.name
                                             : absl::StrCat(run.workload.name, "/", stage.name),
                                         ": ", run.server.model, " at ", run.server.base_url),
                            {{"'", ""}});
    std::string gp = absl::StrCat(
        "set terminal pngcairo noenhanced size 1400,520 font ',10'\n", "set output ",
        GnuplotQuoted(png_path.string()), "\n", "set multiplot layout 1,2 title '", title, "'\n",
        "set grid\nset key top left\nset xlabel 'concurrent streams'\n",
        "set datafile missing 'NaN'\n", "set logscale y\nset ylabel 'latency (ms, log scale)'\n",
        "set title 'latency percentiles'\n", "plot ", d,
        " using 1:2 with linespoints lc 1 pt 7 title 'TTFT p50', ", d,
        " using 1:3 with linespoints lc 1 dt 2 pt 6 title 'TTFT p90', ", d,
        " using 1:4 with linespoints lc 1 dt 3 pt 4 title 'TTFT p99', ", d,
        " using 1:5 with linespoints lc 2 pt 7 title 'TPOT p50', ", d,
        " using 1:6 with linespoints lc 2 dt 2 pt 6 title 'TPOT p90', ", d,
        " using 1:7 with linespoints lc 2 dt 3 pt 4 title 'TPOT p99', ", d,
        " using 1:10 with linespoints lc 3 dt 3 pt 4 title 'ITL p99'\n",
        "unset logscale y\nset yrange [0:*]\nset ylabel 'output tokens/s'\n",
        "set title 'throughput'\n", "plot ", d,
        " using 1:14 with linespoints lc rgb '#1f77b4' pt 7 title 'all streams', ", d,
        " using 1:15 with linespoints lc rgb '#d62728' pt 5 title 'per stream (mean)'\n",
        "unset multiplot\n");
    if (absl::Status s = WriteFile(gp_path, gp); !s.ok()) return s;
    const std::string why = RunGnuplot(gp_path.string());
    if (why.empty()) {
      lines.push_back(png_path.string());
    } else {
      lines.push_back(absl::StrCat(png_path.string(), " skipped: ", why, " (data in ",
                                   dat_path.string(), ", script ", gp_path.string(), ")"));
    }
  }
  return lines;
}

}  // namespace ringlane::bench
