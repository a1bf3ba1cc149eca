// The router's engine: worker groups, each driven by its own GroupLoop
// (router/sched/), and the requests placed on them.
//
// Where a round lives: planned in router/sched/planner.cc, executed by the
// workers in worker/server/round_executor.cc, its result applied in
// router/sched/applier.cc. Requests are validated and tokenized in
// router/request/prepare.cc; tokens become client messages in
// router/request/choice_output.cc. The Router itself only places requests
// (session affinity, then the longest cached prefix, then load) and answers
// what the APIs ask about the model and the groups.
//
// Lock order: Router::mu_, then a GroupLoop's mutex, then Router::info_mu_;
// Router::log_mu_ is taken with none of them held.
#ifndef RINGLANE_ROUTER_ROUTER_H_
#define RINGLANE_ROUTER_ROUTER_H_

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ringlane/v1/generate.pb.h"
#include "ringlane/v1/worker.pb.h"
#include "router/request/chat_template.h"
#include "router/request/loop_watchdog.h"
#include "router/request/prepare.h"
#include "router/request/request_state.h"
#include "router/request/seed.h"
#include "router/router_metrics.h"
#include "router/sched/group_loop.h"
#include "router/sched/kv_tiering.h"
#include "router/sched/task_pool.h"
#include "router/spec/speculator.h"
#include "router/tokenizer/tokenizer.h"

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
  // Threads that compute the token masks of grammar-constrained rows, the
  // planning thread included (1 = that thread alone).
  int mask_threads = 1;
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
  // Input bounds of every request (HTTP and gRPC); see PrepareOptions.
  size_t max_request_id_bytes = 128;
  size_t max_session_id_bytes = 256;
  size_t max_stop_bytes = 1024;
  // How long one connection attempt to a group waits for it to be formed,
  // and the pause between attempts.
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds reconnect_pause{300};
  // Rounds of one group in flight at once: 1 = plan after each result, 2 =
  // plan and send the next round while the workers run the previous one.
  int pipeline_depth = 2;
  // The workers' kvstores, where they have one (sched/kv_tiering.h).
  KvTieringOptions kv_tiering;
  // Reuse the first positions of a cached block too (copy-on-write), so a
  // resend recomputes one token, not up to a block of them.
  bool partial_block_reuse = true;
  // Speculative decoding (spec/speculator.h); no sources = off.
  SpeculatorOptions speculation;
  // Longest wait for one round's results from every rank of a group; a rank
  // that misses it (frozen, partitioned) fails the group's lanes and the
  // group reconnects (WorkerGroupOptions::round_deadline).
  std::chrono::milliseconds round_deadline{15000};
  // When set, every round sent is appended to this file as one JSON line
  // (FormatRoundLog); for tests and traces, it costs a write per round.
  std::string round_log_path;
  // Renders chat requests (GenerateRequest.chat, TokenizeRequest.chat).
  ChatTemplate chat_template{ChatTemplateFamily::kPlain};
  // The loop watchdog of every choice; a request may turn it off or on
  // (GenerateRequest.loop_watchdog).
  LoopWatchdogOptions loop_watchdog;
  // How a group loop reaches its workers; empty = real gRPC
  // (WorkerGroupClient::Connect). Tests put a fake group here.
  WorkerGroupConnector connect;
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
  // The prompt ids of a conversation: rendered with the chat template (with
  // the assistant's generation prompt) and encoded. InvalidArgument naming
  // the message at fault.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ringlane::v1::ChatMessages& chat) const {
    return preparer_.EncodeChat(chat);
  }
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
  Router(RouterOptions options, std::unique_ptr<Tokenizer> tokenizer);
  // A group connected: checks it fits the tokenizer, records the model,
  // and returns the group's metric series.
  absl::StatusOr<GroupMetrics> OnGroupConnected(size_t index, const ringlane::v1::WorkerInfo& info);
  void WriteRoundLog(const std::string& line);
  // Why no group can take a request, for Unavailable messages.
  std::string WhyNotReady() const;

  // The token masker of grammar-constrained requests, built on the first
  // one (its vocabulary tables cost a few MB for a large vocabulary).
  absl::StatusOr<std::shared_ptr<const grammar::TokenMasker>> Masker(const ModelDescription& m);

  const RouterOptions options_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const RequestPreparer preparer_;
  const int64_t created_unix_s_;
  RouterMetrics metrics_;
  // One per group when speculation is on, before the loops that use them;
  // the global suffix cache is the model's, shared by every group.
  std::shared_ptr<SuffixCache> suffix_cache_;
  std::vector<std::unique_ptr<Speculator>> speculators_;
  // Shared by every group's planner (their mask loops take turns); outlives
  // the groups.
  std::unique_ptr<TaskPool> mask_pool_;
  std::vector<std::unique_ptr<GroupLoop>> groups_;

  mutable absl::Mutex mu_;
  // Session id -> group index, while that group stays ready.
  std::map<std::string, size_t> sessions_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex info_mu_;
  std::optional<ModelDescription> model_ ABSL_GUARDED_BY(info_mu_);

  absl::Mutex masker_mu_;
  std::shared_ptr<const grammar::TokenMasker> masker_ ABSL_GUARDED_BY(masker_mu_);

  // Taken alone (never with another mutex held), by every group's thread.
  absl::Mutex log_mu_;
  std::ofstream round_log_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_ROUTER_H_
