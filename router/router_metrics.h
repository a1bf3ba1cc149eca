// The router's Prometheus metrics, served by the gateway's /metrics. Each
// worker group gets its own label set {model, group} once it first connects
// (the model id comes from the workers); request-level series are recorded
// on the group that ran the request, so every front door (HTTP and gRPC)
// is counted the same way.
#ifndef RINGLANE_ROUTER_ROUTER_METRICS_H_
#define RINGLANE_ROUTER_ROUTER_METRICS_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ringlane::router {

// Speculative decoding's counters of one draft source and one kind of
// request (temperature given or omitted: clients that omit it get the
// server default, and an operator must see if that makes drafting collapse).
struct SpecSeries {
  prometheus::Counter* drafted = nullptr;
  prometheus::Counter* accepted = nullptr;
  prometheus::Counter* rejected = nullptr;     // drafted - accepted
  prometheus::Counter* verify_rows = nullptr;  // decode rows that carried drafts
};

// The series of one worker group. Pointers into the registry, which
// outlives them.
struct GroupMetrics {
  // Per request (all choices): submit to the first token of any choice.
  prometheus::Histogram* time_to_first_token_s = nullptr;
  // Per token after a choice's first: the gap since that choice's previous
  // token (tokens that arrive in one round share it).
  prometheus::Histogram* inter_token_latency_s = nullptr;
  // Per choice with >= 2 tokens: (last token - first token) / (tokens - 1).
  prometheus::Histogram* time_per_output_token_s = nullptr;
  // Per request: submit to its last choice finishing (or failing).
  prometheus::Histogram* e2e_request_latency_s = nullptr;
  prometheus::Counter* requests_finished = nullptr;
  prometheus::Counter* requests_failed = nullptr;     // after they were queued
  prometheus::Counter* requests_cancelled = nullptr;  // client went away
  prometheus::Counter* prompt_tokens = nullptr;       // per request, once
  prometheus::Counter* cached_prompt_tokens = nullptr;
  prometheus::Counter* generation_tokens = nullptr;
  prometheus::Counter* requests_default_temperature = nullptr;
  // Choices decoded under a grammar (response_format, tool_choice), and
  // the time the planner spends computing their token masks per row.
  prometheus::Counter* constrained_choices = nullptr;
  prometheus::Histogram* grammar_mask_s = nullptr;
  prometheus::Counter* loops_detected = nullptr;
  prometheus::Counter* loops_stopped = nullptr;
  prometheus::Counter* finish_stop = nullptr;
  prometheus::Counter* finish_length = nullptr;
  prometheus::Counter* finish_loop = nullptr;
  prometheus::Counter* preemptions = nullptr;
  prometheus::Counter* rounds = nullptr;
  prometheus::Histogram* round_duration_s = nullptr;  // send to result
  prometheus::Histogram* round_tokens = nullptr;      // tokens fed per round
  prometheus::Gauge* lanes_running = nullptr;
  prometheus::Gauge* lanes_waiting = nullptr;  // choices waiting for a lane
  prometheus::Gauge* kv_blocks_used = nullptr;
  prometheus::Gauge* kv_blocks_total = nullptr;
  // cached_prompt_tokens / prompt_tokens since start.
  prometheus::Gauge* prefix_cache_hit_rate = nullptr;
  prometheus::Gauge* group_ready = nullptr;
  prometheus::Gauge* group_epoch = nullptr;
  // The kvstore tier (sched/kv_tiering.h): blocks the plans offloaded,
  // restores tried and their outcome, and the prompt tokens they brought
  // back into the pool.
  prometheus::Counter* kvstore_offloaded_blocks = nullptr;
  prometheus::Counter* kvstore_restores_hit = nullptr;
  prometheus::Counter* kvstore_restores_miss = nullptr;
  prometheus::Counter* kvstore_restored_tokens = nullptr;
  // Copy-on-write copies of a cached block whose first positions a prompt
  // reused (KvBlockManager's partial-block hits).
  prometheus::Counter* kv_block_copies = nullptr;
  // Rows that sampled: a prompt's last chunk, decode and verify rows
  // (generation tokens / this = tokens per step).
  prometheus::Counter* sampling_rows = nullptr;
  // Speculative decoding, per draft source: [source][0 given, 1 omitted].
  std::vector<std::array<SpecSeries, 2>> spec;
  // Per verify row, drafts accepted, per source.
  std::vector<prometheus::Histogram*> spec_accepted_per_step;
  // Per round with speculation on: verify rows; per decode row: drafts.
  prometheus::Histogram* spec_verify_rows_per_round = nullptr;
  prometheus::Histogram* spec_depth = nullptr;
  // Rounds planned with speculation on: [0] drafting gated off, [1] on.
  std::array<prometheus::Counter*, 2> spec_rounds = {nullptr, nullptr};
};

class RouterMetrics {
 public:
  RouterMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The series of group `group` serving `model`, with speculative
  // decoding's for each of `draft_sources`; the same pointers for the same
  // labels. Thread-safe.
  GroupMetrics ForGroup(const std::string& model, int group,
                        const std::vector<std::string>& draft_sources = {});

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* ttft_;
  prometheus::Family<prometheus::Histogram>* itl_;
  prometheus::Family<prometheus::Histogram>* tpot_;
  prometheus::Family<prometheus::Histogram>* e2e_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* prompt_tokens_;
  prometheus::Family<prometheus::Counter>* cached_tokens_;
  prometheus::Family<prometheus::Counter>* block_copies_;
  prometheus::Family<prometheus::Counter>* generation_tokens_;
  prometheus::Family<prometheus::Counter>* default_temperature_;
  prometheus::Family<prometheus::Counter>* constrained_choices_;
  prometheus::Family<prometheus::Histogram>* grammar_mask_;
  prometheus::Family<prometheus::Counter>* loops_detected_;
  prometheus::Family<prometheus::Counter>* loops_stopped_;
  prometheus::Family<prometheus::Counter>* finished_choices_;
  prometheus::Family<prometheus::Counter>* preemptions_;
  prometheus::Family<prometheus::Counter>* rounds_;
  prometheus::Family<prometheus::Histogram>* round_duration_;
  prometheus::Family<prometheus::Histogram>* round_tokens_;
  prometheus::Family<prometheus::Gauge>* lanes_running_;
  prometheus::Family<prometheus::Gauge>* lanes_waiting_;
  prometheus::Family<prometheus::Gauge>* kv_used_;
  prometheus::Family<prometheus::Gauge>* kv_total_;
  prometheus::Family<prometheus::Gauge>* hit_rate_;
  prometheus::Family<prometheus::Gauge>* group_ready_;
  prometheus::Family<prometheus::Gauge>* group_epoch_;
  prometheus::Family<prometheus::Counter>* kvstore_offloaded_;
  prometheus::Family<prometheus::Counter>* kvstore_restores_;
  prometheus::Family<prometheus::Counter>* kvstore_restored_tokens_;
  prometheus::Family<prometheus::Counter>* sampling_rows_;
  prometheus::Family<prometheus::Counter>* spec_drafted_;
  prometheus::Family<prometheus::Counter>* spec_accepted_;
  prometheus::Family<prometheus::Counter>* spec_rejected_;
  prometheus::Family<prometheus::Counter>* spec_verify_rows_;
  prometheus::Family<prometheus::Histogram>* spec_accepted_per_step_;
  prometheus::Family<prometheus::Histogram>* spec_verify_rows_per_round_;
  prometheus::Family<prometheus::Histogram>* spec_depth_;
  prometheus::Family<prometheus::Counter>* spec_rounds_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_ROUTER_METRICS_H_
