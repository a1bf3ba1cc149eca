// The round planner: what the next round of one worker group feeds. A pure
// function of (lanes, ledger, cost model, options, drafter) to a RoundPlan:
// no I/O, no clock, no threads; the group loop calls it under its mutex and
// the planner tests call it over a fake worker group.
//
// A plan, in order:
// - release rows of lanes that finished (pending_release) or whose request
//   died (cancelled, failed);
// - one decode row per decoding lane, oldest first, carrying up to
//   max_drafts draft tokens from the drafter (with speculation on, a lane
//   with a row in flight waits for its result: a draft must follow a known
//   token); a lane that cannot grow
//   takes blocks from the youngest lane not yet in the round (preemption);
// - prefill chunks of running lanes, sized by PrefillTokenLimit so that the
//   decoding lanes' inter-token latency stays under the target;
// - admission of waiting choices while the round has prefill room, a lane is
//   free and the pool has the prompt's blocks (prefix hits start past their
//   cached positions).
//
// Pipelining: a lane whose row in round k samples gets a decode row
// (use_last_sampled) in k+1 before k's result arrives, unless speculation
// is on: after a row with drafts (awaiting_verify) its next position is
// known only once the result says how many were accepted.
#ifndef RINGLANE_ROUTER_SCHED_PLANNER_H_
#define RINGLANE_ROUTER_SCHED_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "ringlane/v1/worker.pb.h"
#include "router/kv/kv_block_manager.h"
#include "router/sched/lane.h"
#include "router/sched/scheduler.h"

namespace ringlane::router {

// Proposes draft tokens to follow a lane's last token (speculative
// decoding). Called by the planner on the group's thread.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max_drafts` tokens for positions lane.fed + 1 onwards; the lane's
  // seq ends with the token at position lane.fed (its last sampled token).
  virtual std::vector<int32_t> Propose(const Lane& lane, int max_drafts) = 0;
};

struct PlannerOptions {
  int round_token_budget = 512;
  double itl_target_ms = 50;
  int min_prefill_chunk = 16;
  int max_lanes = 32;
  // Drafts per decode row at most (0 = no speculative decoding).
  int max_drafts = 0;
  // For messages: which group this is.
  size_t group_index = 0;
};

// One lane's row in a planned round, for the applier.
struct PlannedRow {
  LaneId lane = 0;
  int64_t start = 0;
  // Positions the row feeds and the lane's planned positions after it.
  int64_t tokens = 0;
  int64_t fed_after = 0;
  int64_t drafts = 0;
  // Index of the row in the plan.
  int plan_row = 0;
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
};

// Plans the next round into `out`. An empty plan (no rows) means nothing to
// do; only plans with rows take a round id, so ids on a stream stay
// consecutive. `drafter` may be null.
void PlanRound(SchedState& state, KvBlockManager& kv, const RoundCostModel& cost,
               const PlannerOptions& options, Drafter* drafter, PlannedRound* out);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_PLANNER_H_
