// The pure decisions of the round scheduler, apart from threads and RPCs so
// that tests can drive them: how long a round will take, how many prompt
// tokens a round may prefill, and which lane to preempt.
#ifndef RINGLANE_ROUTER_SCHEDULER_H_
#define RINGLANE_ROUTER_SCHEDULER_H_

#include <cstdint>
#include <optional>

#include "absl/types/span.h"

namespace ringlane::router {

// Predicts one group's round time from the number of tokens the round feeds:
//   round_us ~= fixed_us + per_token_us * tokens.
// A forward pass reads every weight once whatever the batch (the fixed part:
// weights, collectives, RPC) and then pays per fed token (matmul rows,
// attention). Context length matters too, but for the sizes served here the
// per-token term dominates, and a model with one more input would need many
// more rounds of varied shape before it could be fitted; the decay lets the
// fit follow context growth instead.
//
// The fit is weighted least squares over every observed round, older rounds
// weighted down by `decay` per round, so the model tracks load changes
// (other tenants on the cores, longer contexts) within a few dozen rounds.
// Not thread-safe; owned by a group's scheduler thread.
class RoundCostModel {
 public:
  explicit RoundCostModel(double decay = 0.97) : decay_(decay) {}

  void Observe(int64_t tokens, double round_us);

  // Rounds observed so far.
  int64_t samples() const { return samples_; }
  // Whether the fit has seen enough rounds of different sizes to predict.
  bool ready() const;
  double fixed_us() const;
  // 0 when the rounds seen do not show time growing with tokens.
  double per_token_us() const;
  double PredictUs(int64_t tokens) const { return fixed_us() + per_token_us() * tokens; }

 private:
  double decay_;
  int64_t samples_ = 0;
  // Decayed sums of weights, x, y, x^2 and xy (x = tokens, y = round time).
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

// How many prompt tokens one round may feed besides its decode rows.
//
// Without decoding lanes, nobody waits on the round: the whole token budget
// (less the decode rows) goes to prefill. With decoding lanes, every round is
// one inter-token gap for each of them, so the round is sized so that the
// model's predicted time stays under `itl_target_us`. The result is never
// below `min_chunk` (a long prompt must progress even when the target cannot
// be met, e.g. because decode rows alone exceed it), nor above the budget
// left after the decode rows; 0 only when decode rows use the whole budget.
int64_t PrefillTokenLimit(int64_t num_decode_rows, int64_t round_token_budget, double itl_target_us,
                          const RoundCostModel& model, int64_t min_chunk);

// A lane as the preemption choice sees it.
struct PreemptCandidate {
  // Admission order: larger is younger.
  uint64_t admit_seq = 0;
  // Already has a row in the round being planned: its KV must stay.
  bool in_plan = false;
  // Holds any blocks at all (a lane with none frees nothing).
  bool holds_blocks = true;
};

// The index of the lane to preempt when the pool runs out: the youngest one
// not already in the plan. The youngest has had the least work invested in
// it and the least time waited, so recomputing it costs the least and the
// oldest requests keep making progress (no livelock between two long lanes).
// nullopt when no lane qualifies.
std::optional<size_t> PickPreemptionVictim(absl::Span<const PreemptCandidate> lanes);

// Whether a request of `num_lanes` choices may join a waiting queue that
// holds `waiting` choices, with at most `max_waiting` waiting. A request
// larger than the whole limit is accepted when the queue is empty, so that
// max_waiting smaller than the largest allowed n cannot reject every such
// request.
bool AdmitToQueue(int64_t waiting, int64_t num_lanes, int64_t max_waiting);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHEDULER_H_
