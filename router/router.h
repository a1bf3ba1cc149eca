// The router's engine: worker groups, each driven by one scheduler thread,
// and the requests placed on them.
//
// A request (one GenerateRequest, validated and tokenized by Prepare) has n
// choices; a choice runs as a lane on one group. A lane is the worker's unit:
// it has its own lane id, its KV blocks in the group's ledger and its sampler
// on every rank. A choice outlives its lanes: preemption releases a lane and
// later starts a new one over the prompt plus the tokens generated so far,
// which (sampling being keyed by absolute position) continues the same text.
//
// Rounds. Each group's thread loops: plan a round under the group's mutex
// (release rows of finished or cancelled lanes, one decode row per decoding
// lane, prefill chunks within the token budget, then admission of waiting
// choices), send it to the workers without the mutex, and, once
// pipeline_depth rounds are in flight (or nothing is left to plan), receive
// the oldest result and apply it under the mutex (tokens to their choices,
// full blocks committed, the cost model fed).
//
// Pipelining (pipeline_depth 2). Round k+1 is planned and sent before round
// k's result arrives, so the workers start it the moment k ends instead of
// idling while the router applies k and plans. Every rank knows each lane's
// last sampled token, so a lane whose row in k samples gets a decode row
// (use_last_sampled) in k+1; its KV blocks are appended when k+1 is planned.
// What this changes:
// - A lane that finishes in k (stop string or id, EOS) already has a row in
//   k+1: the token k+1 samples for it is discarded, and its release row goes
//   into the next plan. A lane whose planned rows already sample max_tokens
//   gets no further row.
// - Full blocks are committed only for the positions of rounds whose result
//   arrived (each round remembers how far it fed each lane), so a block is
//   registered for reuse only once its KV is written.
// - Preemption, cancellation and finished lanes release their blocks while a
//   round that writes them may still be in flight. That is safe because the
//   workers run plans in order: a block handed out again is first used by a
//   later plan, which runs after the in-flight round, and a lane writes
//   every position before it reads it. A registered block is never written
//   by an in-flight round (rounds write past a lane's committed blocks). A
//   preempted lane's in-flight token is discarded; its restart samples the
//   same token at the same position.
// Depth 1 keeps the old plan-run-apply loop, for comparison and debugging.
//
// Lock order: Router::mu_, then Group::mu_, then Router::info_mu_;
// Router::log_mu_ is taken with none of them held.
#ifndef RINGLANE_ROUTER_ROUTER_H_
#define RINGLANE_ROUTER_ROUTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringlane/v1/generate.pb.h"
#include "ringlane/v1/worker.pb.h"
#include "router/chat_template.h"
#include "router/kv_block_manager.h"
#include "router/loop_watchdog.h"
#include "router/router_metrics.h"
#include "router/scheduler.h"
#include "router/seed.h"
#include "router/stop_matcher.h"
#include "router/tokenizer/incremental_decoder.h"
#include "router/tokenizer/tokenizer.h"
#include "router/worker_group.h"

namespace ringlane::router {

struct RouterOptions {
  // Worker addresses of each group, in rank order.
  std::vector<std::vector<std::string>> groups;
  // The served model id; empty = the workers' model_id.
  std::string model_id;
  // Temperature of requests that give none.
  float default_temperature = 0;
  SeedPolicy seed_policy = SeedPolicy::kDerived;
  // Choices waiting for a lane, per group; more is RESOURCE_EXHAUSTED.
  int max_waiting = 256;
  // Lanes running at once per group (< round_token_budget).
  int max_lanes = 32;
  // Tokens fed per round, decode rows and prefill chunks together.
  int round_token_budget = 512;
  // Target inter-token latency of decoding lanes while prompts prefill; 0 =
  // no target (prefill takes the whole budget).
  double itl_target_ms = 50;
  // Prefill tokens a round gives a prompt even when the target cannot be met.
  int min_prefill_chunk = 16;
  // Largest n per request.
  int max_choices = 16;
  // Default max_tokens when a request gives none; 0 = up to the context.
  int max_tokens_default = 0;
  // How long one connection attempt to a group waits for it to be formed,
  // and the pause between attempts.
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds reconnect_pause{300};
  // Rounds of one group in flight at once: 1 = plan after each result, 2 =
  // plan and send the next round while the workers run the previous one.
  int pipeline_depth = 2;
  // When set, every round sent is appended to this file as one JSON line
  // (FormatRoundLog); for tests and traces, it costs a write per round.
  std::string round_log_path;
  // Renders chat requests (GenerateRequest.chat, TokenizeRequest.chat).
  ChatTemplate chat_template{ChatTemplateFamily::kPlain};
  // The loop watchdog of every choice; a request may turn it off or on
  // (GenerateRequest.loop_watchdog).
  LoopWatchdogOptions loop_watchdog;
};

// A GenerateRequest after validation, tokenization and sampling policy.
struct PreparedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  // Resolved: temperature and seed always set; logprobs/top_logprobs as asked.
  ringlane::v1::SamplingParams sampling;
  int n = 1;
  // Most tokens per choice, already capped by the context.
  int max_tokens = 1;
  bool ignore_eos = false;
  bool logprobs = false;
  bool echo = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::string session_id;
  // The request gave no temperature (counted in metrics).
  bool default_temperature = false;
  bool loop_watchdog = true;
};

// The messages of one Generate call, from the scheduler thread to the RPC
// handler. Thread-safe.
class ResponseQueue {
 public:
  void Push(ringlane::v1::GenerateResponse msg);
  // The call is over: `status` OK after the last message, else why it failed.
  void Finish(absl::Status status);
  // Waits up to `timeout` for messages or the end; moves the messages out.
  // True when the call is over (then *status is its outcome and every
  // message has been taken).
  bool Take(absl::Duration timeout, std::vector<ringlane::v1::GenerateResponse>* out,
            absl::Status* status);
  // The client went away: the scheduler drops the request's lanes.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool finished() const;

 private:
  mutable absl::Mutex mu_;
  std::deque<ringlane::v1::GenerateResponse> msgs_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

// What the served model is, from the first group that connected.
struct ModelDescription {
  std::string model_id;
  int32_t max_context_tokens = 0;
  int32_t vocab_size = 0;
  std::vector<int32_t> eos_ids;  // EOS ids that stop generation (unless ignore_eos)
};

struct GroupState {
  bool ready = false;
  std::string status;  // why not ready
  int64_t epoch = 0;
  int lanes = 0;
  int waiting = 0;
  // Prompt tokens fed by prefill rows since start (not reset on reconnect).
  int64_t prefilled_tokens = 0;
  KvBlockStats kv;
};

// OK, or InvalidArgument naming `field` when `text` is not valid UTF-8 (text
// fields travel as bytes, so that this check, not the protobuf parser,
// answers).
absl::Status CheckUtf8(const std::string& field, std::string_view text);

class Router {
 public:
  // Starts one scheduler thread per group; they connect in the background
  // and keep retrying. InvalidArgument for options that cannot work.
  static absl::StatusOr<std::unique_ptr<Router>> Create(RouterOptions options,
                                                        std::unique_ptr<Tokenizer> tokenizer);
  ~Router();  // fails what is in flight with UNAVAILABLE and joins the threads

  // Validates and tokenizes a request. InvalidArgument naming the field;
  // Unavailable while no group has ever connected (the context is unknown).
  absl::StatusOr<PreparedRequest> Prepare(const ringlane::v1::GenerateRequest& request) const;

  // Places the request on a group and queues its choices; messages arrive on
  // `queue`. Unavailable when no group is ready, ResourceExhausted when the
  // chosen group's waiting queue is full.
  absl::Status Submit(PreparedRequest request, std::shared_ptr<ResponseQueue> queue);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  std::optional<ModelDescription> model() const;
  // The prompt ids of a conversation: rendered with the chat template (with
  // the assistant's generation prompt) and encoded. InvalidArgument naming
  // the message at fault.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ringlane::v1::ChatMessages& chat) const;
  // The Tokenize API: text (with or without the tokenizer's special
  // tokens) or a conversation, for the served model.
  absl::StatusOr<ringlane::v1::TokenizeResponse> Tokenize(
      const ringlane::v1::TokenizeRequest& request) const;
  const ChatTemplate& chat_template() const { return options_.chat_template; }
  // The registry of every router metric (the gateway adds its own and
  // serves it on /metrics).
  std::shared_ptr<prometheus::Registry> metrics_registry() const { return metrics_.registry(); }
  std::vector<GroupState> groups() const;
  bool any_ready() const;
  int64_t created_unix_s() const { return created_unix_s_; }

 private:
  class Group;
  Router(RouterOptions options, std::unique_ptr<Tokenizer> tokenizer);
  void SetModel(const ringlane::v1::WorkerInfo& info);
  void WriteRoundLog(const std::string& line);

  const RouterOptions options_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const int64_t created_unix_s_;
  RouterMetrics metrics_;
  std::vector<std::unique_ptr<Group>> groups_;

  mutable absl::Mutex mu_;
  // Session id -> group index, while that group stays ready.
  std::map<std::string, size_t> sessions_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> next_request_id_{1};

  mutable absl::Mutex info_mu_;
  std::optional<ModelDescription> model_ ABSL_GUARDED_BY(info_mu_);

  // Taken alone (never with another mutex held), by every group's thread.
  absl::Mutex log_mu_;
  std::ofstream round_log_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_ROUTER_H_
