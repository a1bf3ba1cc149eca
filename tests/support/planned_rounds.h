// The router's own round loop for tests: lanes arrive as requests, the
// router's planner (router/sched/planner.h) plans every round over the real
// ledger (router/kv/kv_block_manager.h), a WorkerGroup runs it, and the
// router's applier (router/sched/applier.h) hands the sampled tokens back.
// RunLanes (in-process, one backend) and DriveLanes (a real worker group over
// gRPC) are both this loop, so the workers are validated by the driver the
// router uses and not by a scheduler of the tests' own.
//
// Chunk sizes come from the planner options: a lone prefilling lane gets the
// whole round_token_budget, and while other lanes decode a chunk is
// min_prefill_chunk tokens (the cost model is never fed measured times, so
// it stays unready and every rank of a TP group that runs this loop plans
// the same rounds). Small budgets and staggered arrivals give chunks of
// several sizes beside other lanes' decode rows.
//
// Single-threaded; the group is driven only from the calling thread.
#ifndef RINGLANE_TESTS_SUPPORT_PLANNED_ROUNDS_H_
#define RINGLANE_TESTS_SUPPORT_PLANNED_ROUNDS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ringlane/v1/common.pb.h"
#include "router/client/worker_group.h"
#include "router/sched/planner.h"

namespace ringlane::testing {

struct PlannedLane {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  ringlane::v1::SamplingParams sampling;  // temperature and seed must be set
  int choice_index = 0;
  // The lane is queued once this many rounds have been planned (or passed
  // with nothing to plan).
  int arrival_round = 0;
  // Ends the lane when sampled (kept as its last token); -1 = only max_tokens.
  int32_t stop_token = -1;
};

struct PlannedRoundsOptions {
  router::PlannerOptions planner;
  // Rounds sent before the oldest result is read (the router uses 2).
  int pipeline_depth = 1;
  // Lane ids the planner hands out start here (above lanes a test keeps on
  // the workers).
  uint64_t first_lane_id = 1;
};

struct PlannedLaneOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // Where each token came from: the round and the lane (a preempted choice
  // continues under a new lane id) whose row sampled it.
  std::vector<uint64_t> token_round_ids;
  std::vector<uint64_t> token_lane_ids;
  // The sizes of the prefill rows that fed the lane's prompt, in order, and
  // how many of them shared their round with another lane's decode row.
  std::vector<int64_t> prefill_chunks;
  int mixed_prefill_chunks = 0;
};

// Runs every lane to max_tokens or its stop token. Errors: Send/Receive
// failures as the group returns them; Internal for a round the workers
// rejected; a lane's request failure (a prompt larger than the pool) as the
// planner failed it.
absl::StatusOr<std::vector<PlannedLaneOutput>> RunPlannedRounds(
    router::WorkerGroup& group, const std::vector<PlannedLane>& lanes,
    const PlannedRoundsOptions& options);

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_PLANNED_ROUNDS_H_
