// The round planner: what the next round of one worker group feeds. A pure
// function of (lanes, ledger, cost model, options, drafter) to a RoundPlan:
// no I/O, and no clock or thread that changes what it plans (masks may run
// on options.mask_pool; their time goes to a metric); the group loop calls
// it under its mutex and the planner tests call it over a fake worker group.
//
// A plan, in order:
// - release rows of lanes that finished (pending_release) or whose request
//   died (cancelled, failed);
// - one decode row per decoding lane, oldest first, carrying the drafts the
//   drafter decides on (at most max_drafts, within the round's budget and
//   the lane's max_tokens); a lane that cannot grow
//   takes blocks from the youngest lane not yet in the round (preemption);
// - prefill chunks of running lanes, sized by PrefillTokenLimit so that the
//   decoding lanes' inter-token latency stays under the target;
// - admission of waiting choices while the round has prefill room, a lane is
//   free and the pool has the prompt's blocks (prefix hits start past their
//   cached positions).
//
// Pipelining: a lane whose row in round k samples gets a decode row
// (use_last_sampled) in k+1 before k's result arrives, unless the drafter
// says it waits for k's result (the workers' draft model proposes with
// it). That row may carry drafts too: the drafter continues the lane's
// sequence as if k's drafts are all accepted, its first proposed token
// standing in for k's last sample (which only the workers know). The row
// is marked assume_accepted: when k rejects a draft, the workers skip it
// and the applier voids it (PlannedRow::voided), and the lane's next row
// starts after k's accepted tokens.
#ifndef RINGLANE_ROUTER_SCHED_PLANNER_H_
#define RINGLANE_ROUTER_SCHED_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "ringlane/v1/worker.pb.h"
#include "router/kv/kv_block_manager.h"
#include "router/sched/lane.h"
#include "router/sched/scheduler.h"
#include "router/sched/task_pool.h"

namespace ringlane::router {

// What the planner tells a drafter about one decode row it is planning.
struct DraftContext {
  // Most drafts the row may carry: the round's token budget left and the
  // tokens the lane may still sample (a verify row samples drafts + 1).
  int max_drafts = 0;
  // Lanes that want a decode row this round (they share its cost).
  int64_t decoding_lanes = 1;
  // The lane's previous row has not returned: the row's first input is its
  // last sample, unknown here, and follows `assumed` (the drafts of the row
  // in flight, as if all are accepted). Drafts then continue the guess of
  // that sample; a source that can draft only after the result (the
  // workers' draft model) may ask to wait for it instead.
  bool row_in_flight = false;
  absl::Span<const int32_t> assumed;
  // The group's measured round cost (may not be ready).
  const RoundCostModel* cost = nullptr;
};

struct DraftDecision {
  // Drafts for positions lane.fed + 1 onwards; empty = a plain decode row.
  std::vector<int32_t> tokens;
  // Which of the drafter's sources proposed them (its own numbering).
  int source = -1;
  // With a row in flight: give the lane no row this round and draft once
  // its result is in.
  bool wait = false;
};

// The drafter's view of a planned round, handed back with its result.
struct DraftRoundTag {
  int tag = -1;
  // Whether the drafter let lanes draft in it (for the metrics).
  bool drafting_allowed = true;
};

// What the group loop saw of a round, for the drafter.
struct RoundObservation {
  // Sent while another round was in flight.
  bool pipelined = false;
  // Since the previous round's result, and of the workers' own time.
  double period_us = 0;
  double worker_us = 0;
  // Drafter::EndRound's tag when the round was planned (-1: none).
  int draft_tag = -1;
  // Tokens the round gave lanes (sampled and accepted); prompt tokens fed.
  int64_t tokens = 0;
  int64_t prefilled_tokens = 0;
};

// Speculative decoding's seam in the planner: decides per decode row whether
// to draft, how deep and from which source, and learns from what the
// workers accepted. Called on the group's thread only.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // The lane's seq ends with the token at position lane.fed when no row is
  // in flight (its last sampled token); else see DraftContext::assumed.
  virtual DraftDecision Plan(const Lane& lane, const DraftContext& context) = 0;
  // How many tokens the workers' draft model should propose after the row
  // of `lane` being planned, which samples (LaneStep.propose_drafts); 0 for
  // none. `max_drafts`: what the lane may still use.
  virtual int ProposeDepth(const Lane& lane, int max_drafts) { return 0; }
  // Whether the first row of `lane`, which starts past cached positions,
  // carries their tokens for the workers' draft model
  // (LaneStep.prefix_token_ids).
  virtual bool WantsPrefixTokens(const Lane& lane) { return false; }
  // The workers' draft model proposed `tokens` to follow the first
  // `seq_len` tokens of the lane's sequence.
  virtual void OnProposed(LaneId lane, int64_t seq_len, absl::Span<const int32_t> tokens) {}
  // A verify row of `lane` carried `drafted` drafts of `source`; the
  // workers accepted the first `accepted`.
  virtual void OnVerified(LaneId lane, int source, int drafted, int accepted) {}
  // A choice finished with `seq`, its prompt (the first `prompt_len`
  // tokens) and output.
  virtual void OnFinished(absl::Span<const int32_t> seq, int64_t prompt_len) {}
  // After a round is applied: drop what is kept for lanes no longer live.
  virtual void Sweep(const SchedState& state) {}
  // A round is being planned while `decoding_lanes` lanes are past their
  // prompt (whether or not they get a row in it): BeginRound comes before
  // any Plan or ProposeDepth call for it, EndRound after its decode rows.
  // EndRound's tag (-1: none) comes back in the round's RoundObservation.
  virtual void BeginRound(int64_t decoding_lanes) {}
  virtual DraftRoundTag EndRound() { return {}; }
  // A round's result is in (see RoundObservation).
  virtual void ObserveRound(const RoundObservation& round) {}
  // The workers' draft model spent `propose_us` proposing `tokens` draft
  // tokens in a round (beyond feeding it): the price of a proposed draft,
  // which the round-cost model leaves out.
  virtual void ObserveDraftCost(double propose_us, int64_t tokens) {}
};

struct PlannerOptions {
  int round_token_budget = 512;
  double itl_target_ms = 50;
  int min_prefill_chunk = 16;
  int max_lanes = 32;
  // Drafts per decode row at most (0 = no speculative decoding, whatever
  // the drafter).
  int max_drafts = 0;
  // For messages: which group this is.
  size_t group_index = 0;
  // Runs the token masks of grammar-constrained rows side by side; null:
  // one after another on the planning thread. The plan is the same.
  TaskPool* mask_pool = nullptr;
};

// One lane's row in a planned round, for the applier.
struct PlannedRow {
  LaneId lane = 0;
  int64_t start = 0;
  // Positions the row feeds and the lane's planned positions after it.
  int64_t tokens = 0;
  int64_t fed_after = 0;
  int64_t drafts = 0;
  // The drafter's source of the drafts; whether the row is a decode row.
  int draft_source = -1;
  bool decode = false;
  // The request gave no temperature (speculation metrics split on it).
  bool temperature_omitted = false;
  // Index of the row in the plan.
  int plan_row = 0;
  // Planned behind a verify row of the lane that then rejected a draft:
  // the workers skip it, and its result changes nothing (set by the
  // applier of that earlier round).
  bool voided = false;
};

struct PlannedRound {
  ringlane::v1::RoundPlan plan;
  std::vector<PlannedRow> rows;
  // What planning did, for metrics.
  int64_t prefilled_tokens = 0;
  int64_t preemptions = 0;
  // Prompt tokens of requests admitted for the first time, and of those the
  // ones found in the cache.
  int64_t admitted_prompt_tokens = 0;
  int64_t admitted_cached_tokens = 0;
  bool admitted_any = false;
  // Drafter::EndRound's answer (tag -1: not asked).
  DraftRoundTag draft;
};

// Plans the next round into `out`. An empty plan (no rows) means nothing to
// do; only plans with rows take a round id, so ids on a stream stay
// consecutive. `drafter` may be null.
void PlanRound(SchedState& state, KvBlockManager& kv, const RoundCostModel& cost,
               const PlannerOptions& options, Drafter* drafter, PlannedRound* out);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_PLANNER_H_
