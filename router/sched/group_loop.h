// One worker group and its scheduler thread. The thread loops: plan a round
// under the group's mutex (PlanRound), send it to the workers without the
// mutex, and, once pipeline_depth rounds are in flight (or nothing is left
// to plan), receive the oldest result and apply it under the mutex
// (ApplyRoundResult; tokens become client messages through choice_output).
//
// Pipelining (pipeline_depth 2). Round k+1 is planned and sent before round
// k's result arrives, so the workers start it the moment k ends instead of
// idling while the router applies k and plans. What this changes:
// - A lane that finishes in k (stop string or id, EOS) already has a row in
//   k+1: the token k+1 samples for it is discarded, and its release row goes
//   into the next plan. A lane whose planned rows already sample max_tokens
//   gets no further row.
// - Full blocks are committed only for the positions of rounds whose result
//   arrived, so a block is registered for reuse only once its KV is written.
// - Preemption, cancellation and finished lanes release their blocks while a
//   round that writes them may still be in flight. That is safe because the
//   workers run plans in order: a block handed out again is first used by a
//   later plan, which runs after the in-flight round, and a lane writes
//   every position before it reads it. A registered block is never written
//   by an in-flight round (rounds write past a lane's committed blocks). A
//   preempted lane's in-flight token is discarded; its restart samples the
//   same token at the same position.
// Depth 1 keeps the plain plan-run-apply loop, for comparison and debugging.
//
// Everything the loop needs comes from outside (options, tokenizer, how to
// connect, what to do with a connected group's info, where the round log
// goes), so that it never reaches into its owner. Thread-safe: Enqueue,
// ProbePrefix and State may be called from any thread.
#ifndef RINGLANE_ROUTER_SCHED_GROUP_LOOP_H_
#define RINGLANE_ROUTER_SCHED_GROUP_LOOP_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/client/worker_group.h"
#include "router/kv/kv_block_manager.h"
#include "router/request/request_state.h"
#include "router/router_metrics.h"
#include "router/sched/applier.h"
#include "router/sched/kv_tiering.h"
#include "router/sched/lane.h"
#include "router/sched/planner.h"
#include "router/sched/scheduler.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

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

struct GroupLoopOptions {
  size_t index = 0;
  std::vector<std::string> addresses;
  PlannerOptions planner;
  int max_waiting = 256;
  int pipeline_depth = 2;
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds reconnect_pause{300};
  // Offload to and restore from the workers' kvstores, when they have them.
  KvTieringOptions kv_tiering;
  // Token-granular prefix hits (KvBlockManager::Options::reuse_partial_blocks),
  // where every rank runs block copies.
  bool partial_block_reuse = true;
};

// Connects to the group at `addresses`, waiting up to `timeout`.
using WorkerGroupConnector = std::function<absl::StatusOr<std::unique_ptr<WorkerGroup>>(
    const std::vector<std::string>& addresses, std::chrono::milliseconds timeout)>;

struct GroupLoopHooks {
  WorkerGroupConnector connect;
  // A group connected with this info: OK and its metric series, or why the
  // router cannot use it (wrong tokenizer, say).
  std::function<absl::StatusOr<GroupMetrics>(const ringlane::v1::WorkerInfo&)> on_connected;
  // Receives one line per round sent (FormatRoundLog); null = no log.
  std::function<void(const std::string&)> round_log;
  // Proposes drafts for decode rows; null = no speculative decoding.
  Drafter* drafter = nullptr;
};

class GroupLoop {
 public:
  // `tokenizer` is not owned and must outlive the loop.
  GroupLoop(GroupLoopOptions options, GroupLoopHooks hooks, const Tokenizer* tokenizer);
  ~GroupLoop();  // Stop()s

  void Start();
  // Fails what is queued or running with UNAVAILABLE and joins the thread.
  void Stop();

  struct Probe {
    bool ready = false;
    int64_t cached_tokens = 0;  // in whole blocks of the prompt
    int64_t load = 0;
  };
  // Readiness, cached prefix of `prompt` and load, for placement.
  Probe ProbePrefix(absl::Span<const int32_t> prompt) const;
  // Queues the request's choices. Unavailable when not ready,
  // ResourceExhausted when the waiting queue is full.
  absl::Status Enqueue(std::shared_ptr<RequestState> req);
  GroupState State() const;
  // Why the group is not ready (for error messages).
  std::string Describe() const;

 private:
  struct InFlight {
    PlannedRound round;
    Clock::time_point sent;
    // Sent while another round was in flight; sent right after the loop
    // waited for work (its result-to-result time is not a round period).
    bool pipelined = false;
    bool after_idle = false;
  };
  class Sink;

  void Loop();
  bool Connect();
  void OnGroupFailure(const absl::Status& status);
  // `observed`, when set, goes to the drafter with the round's tokens.
  void Apply(const InFlight& round, const ringlane::v1::RoundResult& result, double busy_us,
             RoundObservation* observed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordPlan(const PlannedRound& round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the workers' draft-model proposals of `result` to the drafter.
  void DeliverProposals(const ringlane::v1::RoundResult& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordVerify(const PlannedRound& round, const AppliedRound& applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The speculation counters of a round's verify rows (from the sink, before
  // any of the round's tokens reaches a client).
  void RecordVerifyMetrics(const PlannedRound& round, absl::Span<const int64_t> accepted_by_row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LogLine(const PlannedRound& round, int64_t in_flight) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAll(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NotReadyMessage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_ || !s_.lanes.empty() || !s_.pending_release.empty()) return true;
    // A choice whose blocks come back from the kvstore waits for that, not
    // for a round.
    for (const Waiting& w : s_.waiting) {
      if (!w.restoring) return true;
    }
    return tiering_.HasWork(s_.round_id, last_applied_round_);
  }

  const GroupLoopOptions options_;
  const GroupLoopHooks hooks_;
  const Tokenizer* const tokenizer_;
  std::thread thread_;
  // Only the loop's thread uses the client and the in-flight rounds.
  std::shared_ptr<WorkerGroup> client_;  // shared with the kvstore tier's restores
  std::deque<InFlight> in_flight_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string status_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<KvBlockManager> kv_ ABSL_GUARDED_BY(mu_);
  SchedState s_ ABSL_GUARDED_BY(mu_);
  RoundCostModel cost_ ABSL_GUARDED_BY(mu_);
  // options_.planner as the connected workers allow it (set by Connect).
  PlannerOptions planner_ ABSL_GUARDED_BY(mu_);
  int64_t prefilled_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_applied_round_ ABSL_GUARDED_BY(mu_) = 0;
  // Series of this group; set at the first connection (the model id comes
  // from the workers), before any request can be queued here.
  GroupMetrics metrics_ ABSL_GUARDED_BY(mu_);
  // After the state it reads; its restorer thread takes mu_.
  KvTiering tiering_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_GROUP_LOOP_H_
