#include "router/router_metrics.h"

namespace ringlane::router {

namespace {

// Seconds from 1 ms to 2 min: a first token behind a long prefill takes
// tens of seconds, a decode step of a small model a millisecond.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.15, 0.2,  0.3,
          0.4,   0.5,    0.75,  1.0,  2.5,  5.0,  10.0, 20.0, 40.0, 80.0, 120.0};
}

// A mask takes microseconds over a small vocabulary, milliseconds inside a
// string over a large one.
prometheus::Histogram::BucketBoundaries MaskBuckets() {
  return {0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3};
}

prometheus::Histogram::BucketBoundaries RoundTokenBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
}

prometheus::Histogram::BucketBoundaries DraftBuckets() {
  return {0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64};
}

template <typename B>
auto& Reg(B builder, const char* name, const char* help, prometheus::Registry& r) {
  return builder.Name(name).Help(help).Register(r);
}

}  // namespace

RouterMetrics::RouterMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  ttft_ = &Reg(BuildHistogram(), "ringlane_time_to_first_token_seconds",
               "Request submitted to its first generated token", r);
  itl_ = &Reg(BuildHistogram(), "ringlane_inter_token_latency_seconds",
              "Gap between consecutive tokens of one choice", r);
  tpot_ = &Reg(BuildHistogram(), "ringlane_time_per_output_token_seconds",
               "Per choice: (last token - first token) / (tokens - 1)", r);
  e2e_ = &Reg(BuildHistogram(), "ringlane_e2e_request_latency_seconds",
              "Request submitted to its last choice finishing", r);
  requests_ = &Reg(BuildCounter(), "ringlane_generate_requests_total",
                   "Generation requests that ran on a worker group, by outcome", r);
  prompt_tokens_ =
      &Reg(BuildCounter(), "ringlane_prompt_tokens_total", "Prompt tokens of requests run", r);
  cached_tokens_ = &Reg(BuildCounter(), "ringlane_cached_prompt_tokens_total",
                        "Prompt tokens served from the KV cache instead of prefilled", r);
  block_copies_ = &Reg(BuildCounter(), "ringlane_kv_block_copies_total",
                       "KV blocks copied inside a pool so that a prompt reuses the first "
                       "positions of a cached block (token-granular prefix hits)",
                       r);
  generation_tokens_ =
      &Reg(BuildCounter(), "ringlane_generation_tokens_total", "Tokens generated (all choices)", r);
  default_temperature_ = &Reg(BuildCounter(), "ringlane_requests_default_temperature_total",
                              "Requests that gave no temperature and got the server default", r);
  constrained_choices_ =
      &Reg(BuildCounter(), "ringlane_constrained_choices_total",
           "Choices decoded under a grammar (response_format, tool_choice required or named)", r);
  grammar_mask_ = &Reg(BuildHistogram(), "ringlane_grammar_mask_seconds",
                       "Planner time computing one decode row's token masks (one per position "
                       "it samples), on the group's thread",
                       r);
  loops_detected_ = &Reg(BuildCounter(), "ringlane_loops_detected_total",
                         "Choices the loop watchdog flagged as repeating a cycle", r);
  loops_stopped_ = &Reg(BuildCounter(), "ringlane_loops_stopped_total",
                        "Choices the loop watchdog stopped (finish reason loop)", r);
  finished_choices_ = &Reg(BuildCounter(), "ringlane_finished_choices_total",
                           "Choices that finished, by finish reason", r);
  preemptions_ = &Reg(BuildCounter(), "ringlane_preemptions_total",
                      "Lanes preempted to free KV blocks (their choice restarts later)", r);
  rounds_ = &Reg(BuildCounter(), "ringlane_rounds_total", "Rounds run by the worker group", r);
  round_duration_ = &Reg(BuildHistogram(), "ringlane_round_duration_seconds",
                         "Round sent to its result received", r);
  round_tokens_ = &Reg(BuildHistogram(), "ringlane_round_tokens",
                       "Tokens fed per round (decode rows plus prefill chunks)", r);
  kvstore_offloaded_ = &Reg(BuildCounter(), "ringlane_kvstore_offloaded_blocks_total",
                            "KV blocks the plans asked the workers to copy to their kvstore", r);
  kvstore_restores_ = &Reg(BuildCounter(), "ringlane_kvstore_restores_total",
                           "Prompts whose uncached blocks were asked of the kvstore, by outcome "
                           "(hit: at least one block came back)",
                           r);
  kvstore_restored_tokens_ =
      &Reg(BuildCounter(), "ringlane_kvstore_restored_tokens_total",
           "Prompt tokens whose KV came back from the kvstore instead of being prefilled", r);
  sampling_rows_ = &Reg(BuildCounter(), "ringlane_sampling_rows_total",
                        "Rows that sampled: prompts' last chunks, decode and verify rows "
                        "(generation tokens / this = tokens per step)",
                        r);
  spec_drafted_ = &Reg(BuildCounter(), "ringlane_spec_drafted_tokens_total",
                       "Draft tokens sent for verification, by draft source and whether the "
                       "request gave a temperature",
                       r);
  spec_accepted_ = &Reg(BuildCounter(), "ringlane_spec_accepted_tokens_total",
                        "Draft tokens the workers accepted (equal to their own sample)", r);
  spec_rejected_ =
      &Reg(BuildCounter(), "ringlane_spec_rejected_tokens_total",
           "Draft tokens not accepted (the first mismatch and every draft after it)", r);
  spec_verify_rows_ =
      &Reg(BuildCounter(), "ringlane_spec_verify_rows_total", "Decode rows that carried drafts", r);
  spec_accepted_per_step_ = &Reg(BuildHistogram(), "ringlane_spec_accepted_tokens_per_step",
                                 "Drafts accepted per verify row (a step emits this plus one)", r);
  spec_verify_rows_per_round_ = &Reg(BuildHistogram(), "ringlane_spec_verify_rows_per_round",
                                     "Verify rows per round, with speculation on", r);
  spec_depth_ = &Reg(BuildHistogram(), "ringlane_spec_depth",
                     "Drafts chosen per decode row with speculation on (0: a plain row)", r);
  spec_rounds_ = &Reg(BuildCounter(), "ringlane_spec_rounds_total",
                      "Rounds planned with speculation on, by whether drafting was allowed "
                      "(the measured gate: off where drafting did not pay at that many lanes)",
                      r);
  lanes_running_ =
      &Reg(BuildGauge(), "ringlane_lanes_running", "Lanes running on the worker group", r);
  lanes_waiting_ = &Reg(BuildGauge(), "ringlane_lanes_waiting", "Choices waiting for a lane", r);
  kv_used_ = &Reg(BuildGauge(), "ringlane_kv_blocks_used",
                  "KV blocks held by running lanes (not free, not evictable)", r);
  kv_total_ = &Reg(BuildGauge(), "ringlane_kv_blocks_capacity", "KV blocks of the group's pool", r);
  hit_rate_ = &Reg(BuildGauge(), "ringlane_prefix_cache_hit_rate",
                   "Cached prompt tokens / prompt tokens since start", r);
  group_ready_ =
      &Reg(BuildGauge(), "ringlane_group_ready", "1 while the worker group serves rounds", r);
  group_epoch_ = &Reg(BuildGauge(), "ringlane_group_epoch", "The worker group's epoch", r);
}

GroupMetrics RouterMetrics::ForGroup(const std::string& model, int group,
                                     const std::vector<std::string>& draft_sources) {
  const prometheus::Labels l = {{"model", model}, {"group", std::to_string(group)}};
  auto with = [&l](const char* key, const char* value) {
    prometheus::Labels x = l;
    x[key] = value;
    return x;
  };
  GroupMetrics m;
  m.time_to_first_token_s = &ttft_->Add(l, LatencyBuckets());
  m.inter_token_latency_s = &itl_->Add(l, LatencyBuckets());
  m.time_per_output_token_s = &tpot_->Add(l, LatencyBuckets());
  m.e2e_request_latency_s = &e2e_->Add(l, LatencyBuckets());
  m.requests_finished = &requests_->Add(with("outcome", "finished"));
  m.requests_failed = &requests_->Add(with("outcome", "failed"));
  m.requests_cancelled = &requests_->Add(with("outcome", "cancelled"));
  m.prompt_tokens = &prompt_tokens_->Add(l);
  m.cached_prompt_tokens = &cached_tokens_->Add(l);
  m.kv_block_copies = &block_copies_->Add(l);
  m.generation_tokens = &generation_tokens_->Add(l);
  m.requests_default_temperature = &default_temperature_->Add(l);
  m.constrained_choices = &constrained_choices_->Add(l);
  m.grammar_mask_s = &grammar_mask_->Add(l, MaskBuckets());
  m.loops_detected = &loops_detected_->Add(l);
  m.loops_stopped = &loops_stopped_->Add(l);
  m.finish_stop = &finished_choices_->Add(with("reason", "stop"));
  m.finish_length = &finished_choices_->Add(with("reason", "length"));
  m.finish_loop = &finished_choices_->Add(with("reason", "loop"));
  m.preemptions = &preemptions_->Add(l);
  m.rounds = &rounds_->Add(l);
  m.round_duration_s = &round_duration_->Add(l, LatencyBuckets());
  m.round_tokens = &round_tokens_->Add(l, RoundTokenBuckets());
  m.lanes_running = &lanes_running_->Add(l);
  m.lanes_waiting = &lanes_waiting_->Add(l);
  m.kv_blocks_used = &kv_used_->Add(l);
  m.kv_blocks_total = &kv_total_->Add(l);
  m.prefix_cache_hit_rate = &hit_rate_->Add(l);
  m.group_ready = &group_ready_->Add(l);
  m.group_epoch = &group_epoch_->Add(l);
  m.kvstore_offloaded_blocks = &kvstore_offloaded_->Add(l);
  m.kvstore_restores_hit = &kvstore_restores_->Add(with("outcome", "hit"));
  m.kvstore_restores_miss = &kvstore_restores_->Add(with("outcome", "miss"));
  m.kvstore_restored_tokens = &kvstore_restored_tokens_->Add(l);
  m.sampling_rows = &sampling_rows_->Add(l);
  for (const std::string& source : draft_sources) {
    std::array<SpecSeries, 2> by_temperature;
    for (int omitted = 0; omitted < 2; ++omitted) {
      prometheus::Labels x = l;
      x["drafter"] = source;
      x["temperature"] = omitted ? "omitted" : "given";
      by_temperature[omitted] = {&spec_drafted_->Add(x), &spec_accepted_->Add(x),
                                 &spec_rejected_->Add(x), &spec_verify_rows_->Add(x)};
    }
    m.spec.push_back(by_temperature);
    prometheus::Labels x = l;
    x["drafter"] = source;
    m.spec_accepted_per_step.push_back(&spec_accepted_per_step_->Add(x, DraftBuckets()));
  }
  if (!draft_sources.empty()) {
    m.spec_verify_rows_per_round = &spec_verify_rows_per_round_->Add(l, RoundTokenBuckets());
    m.spec_depth = &spec_depth_->Add(l, DraftBuckets());
    for (int on = 0; on < 2; ++on) {
      prometheus::Labels x = l;
      x["drafting"] = on ? "on" : "off";
      m.spec_rounds[on] = &spec_rounds_->Add(x);
    }
  }
  return m;
}

}  // namespace ringlane::router
