// Drives lanes through a real worker group the way the router does: the
// router's planner, ledger and applier (tests/support/planned_rounds.h) plan
// every round and read every result, over a WorkerGroupClient. Staggered
// arrivals and small token budgets make rounds mix prefill chunks of several
// sizes with other lanes' decode rows.
#ifndef RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_
#define RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ringlane/v1/worker.pb.h"
#include "router/client/worker_group.h"
#include "router/sched/planner.h"

namespace ringlane::testing {

struct DriverLane {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  ringlane::v1::SamplingParams sampling;  // temperature and seed set
  int choice_index = 0;
  int arrival_round = 0;  // the round in which the lane is queued
};

struct DriveOptions {
  // Chunk sizes: a lone prefill gets the whole budget, one beside decode
  // rows min_prefill_chunk tokens.
  router::PlannerOptions planner;
  // Rounds sent ahead of the oldest result, as the router's loop does.
  int pipeline_depth = 2;
};

struct DriverOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // The prompt's prefill row sizes, and how many shared a round with
  // another lane's decode row.
  std::vector<int64_t> prefill_chunks;
  int mixed_prefill_chunks = 0;
};

// Runs every lane to max_tokens (stop ids are not honoured: golden outputs
// run past them). Lane ids start at `first_lane_id`. Errors: the first
// failed round, or a round the workers rejected; with rounds pipelined, a
// later one may then still be in flight, so the caller reconnects before
// driving the group again.
absl::StatusOr<std::vector<DriverOutput>> DriveLanes(router::WorkerGroupClient& group,
                                                     const std::vector<DriverLane>& lanes,
                                                     uint64_t first_lane_id = 1,
                                                     const DriveOptions& options = {});

// Greedy parameters (temperature 0, seed 0).
ringlane::v1::SamplingParams Greedy();

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_
