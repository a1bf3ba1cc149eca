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
// choices), run it on the workers without the mutex, then apply the result
// under the mutex (tokens to their choices, full blocks committed, the cost
// model fed). Rounds are not pipelined: the next plan is built after the
// previous result arrived. The workers idle while the router plans, which
// for the bundled model costs microseconds per round against milliseconds of
// compute; pipelining (decode rows with use_last_sampled sent ahead) is left
// for when planning shows up in profiles.
//
// Lock order: Router::mu_, then Group::mu_, then Router::info_mu_.
#ifndef RINGLANE_ROUTER_ROUTER_H_
#define RINGLANE_ROUTER_ROUTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
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
#include "router/kv_block_manager.h"
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
  std::vector<GroupState> groups() const;
  bool any_ready() const;
  int64_t created_unix_s() const { return created_unix_s_; }

 private:
  class Group;
  Router(RouterOptions options, std::unique_ptr<Tokenizer> tokenizer);
  void SetModel(const ringlane::v1::WorkerInfo& info);

  const RouterOptions options_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const int64_t created_unix_s_;
  std::vector<std::unique_ptr<Group>> groups_;

  mutable absl::Mutex mu_;
  // Session id -> group index, while that group stays ready.
  std::map<std::string, size_t> sessions_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> next_request_id_{1};

  mutable absl::Mutex info_mu_;
  std::optional<ModelDescription> model_ ABSL_GUARDED_BY(info_mu_);
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_ROUTER_H_
