// Drives lanes through a worker group the way the router will: each lane
// gets its own run of KV blocks, prefills its prompt in chunks and then
// decodes one token per round from its last sampled token, every lane
// starting at a round of its own so that rounds mix prefill chunks and
// decode rows of several lanes.
#ifndef RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_
#define RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ringlane/v1/worker.pb.h"
#include "router/client/worker_group.h"

namespace ringlane::testing {

struct DriverLane {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  ringlane::v1::SamplingParams sampling;  // temperature and seed set
  int choice_index = 0;
  int first_round = 0;    // the round in which the lane's prompt starts
  int prefill_chunk = 0;  // prompt tokens per round; 0 = all at once
};

struct DriverOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Runs every lane to max_tokens (stop ids are not honoured: golden outputs
// run past them). Lane ids start at `first_lane_id`. Errors: the first
// failed round, or a round the workers rejected.
absl::StatusOr<std::vector<DriverOutput>> DriveLanes(router::WorkerGroupClient& group,
                                                     const std::vector<DriverLane>& lanes,
                                                     uint64_t first_lane_id = 1);

// Greedy parameters (temperature 0, seed 0).
ringlane::v1::SamplingParams Greedy();

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_GROUP_DRIVER_H_
