// The result applier: what a round's result does to the lanes and the ledger.
// A pure function of (planned round, result, lanes, ledger) to per-choice
// token events: no I/O, no clock; the events go to a ResultSink (the group
// loop's turns them into client messages; the planner tests record them).
//
// For each row of the round, in plan order:
// - a verify row's rejected drafts are rolled back: the lane continues at
//   start + 1 + accepted, and the ledger gives back the blocks past it; the
//   lane's rows in later rounds still in flight, planned assuming those
//   drafts accepted, are voided (the workers skip them too);
// - a voided row changes nothing;
// - full blocks up to what the round wrote are committed for prefix reuse
//   (before any token can finish the lane, so a finished request's blocks
//   stay cached for a resend; never past what this round wrote, as a later
//   round in flight has not written its positions yet);
// - sampled tokens are appended to the lane's sequence and handed to the
//   sink one by one until one finishes the choice, which releases the lane.
#ifndef RINGLANE_ROUTER_SCHED_APPLIER_H_
#define RINGLANE_ROUTER_SCHED_APPLIER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "ringlane/v1/worker.pb.h"
#include "router/kv/kv_block_manager.h"
#include "router/sched/lane.h"
#include "router/sched/planner.h"

namespace ringlane::router {

class ResultSink {
 public:
  virtual ~ResultSink() = default;
  // The round's rows that sampled, before any of their tokens reaches a
  // client (a client that has its last token reads counters that include
  // its rows).
  virtual void OnSamplingRows(int64_t rows) {}
  // Drafts each row of the planned round kept (PlannedRound::rows order; 0
  // for rows without drafts), also before any token reaches a client.
  virtual void OnVerified(absl::Span<const int64_t> accepted_by_row) {}
  // `count` tokens of `lane` arrived together (before OnToken for each).
  virtual void OnLaneTokens(Lane& lane, int count) {}
  // One sampled token; true when it finished the lane's choice.
  virtual bool OnToken(Lane& lane, const ringlane::v1::SampledToken& token) = 0;
};

struct AppliedRound {
  // Positions the round fed and the attention pairs they attended (the cost
  // model's inputs).
  int64_t tokens = 0;
  double attended = 0;
  // Per row of the planned round (PlannedRound::rows): drafts accepted
  // (PlannedRow::drafts says how many it carried).
  std::vector<int64_t> accepted_by_row;
  // Rows that sampled (a prompt's last chunk, decode and verify rows).
  int64_t sampling_rows = 0;
};

// Applies `result` of `round`. A rejected plan (result.error set) fails the
// requests of every lane it fed: the lanes were advanced here and cannot
// continue consistently.
// `later`: the rounds sent after this one and still in flight, whose rows
// behind a verify row that rejected a draft are voided here.
AppliedRound ApplyRoundResult(const PlannedRound& round, const ringlane::v1::RoundResult& result,
                              SchedState& state, KvBlockManager& kv, ResultSink& sink,
                              absl::Span<PlannedRound* const> later);

// Releases a lane whose choice finished: its blocks go back to the ledger
// (cached ones stay registered) and a release row goes into the next plan.
void ReleaseLane(SchedState& state, KvBlockManager& kv, Lane& lane);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_APPLIER_H_
