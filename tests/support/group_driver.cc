#include "tests/support/group_driver.h"

#include <utility>

#include "tests/support/planned_rounds.h"

namespace ringlane::testing {

namespace v1 = ringlane::v1;

v1::SamplingParams Greedy() {
  v1::SamplingParams p;
  p.set_temperature(0);
  p.set_seed(0);
  return p;
}

absl::StatusOr<std::vector<DriverOutput>> DriveLanes(router::WorkerGroupClient& group,
                                                     const std::vector<DriverLane>& lanes,
                                                     uint64_t first_lane_id,
                                                     const DriveOptions& options) {
  std::vector<PlannedLane> planned;
  for (const DriverLane& l : lanes) {
    planned.push_back({.prompt = l.prompt,
                       .max_tokens = l.max_tokens,
                       .sampling = l.sampling,
                       .choice_index = l.choice_index,
                       .arrival_round = l.arrival_round});
  }
  absl::StatusOr<std::vector<PlannedLaneOutput>> out =
      RunPlannedRounds(group, planned,
                       {.planner = options.planner,
                        .pipeline_depth = options.pipeline_depth,
                        .first_lane_id = first_lane_id});
  if (!out.ok()) return out.status();
  std::vector<DriverOutput> results(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    PlannedLaneOutput& o = (*out)[i];
    results[i] = {.tokens = std::move(o.tokens),
                  .logprobs = std::move(o.logprobs),
                  .prefill_chunks = std::move(o.prefill_chunks),
                  .mixed_prefill_chunks = o.mixed_prefill_chunks};
  }
  return results;
}

}  // namespace ringlane::testing
