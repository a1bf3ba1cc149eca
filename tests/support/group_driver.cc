#include "tests/support/group_driver.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "router/client/round_builder.h"

namespace ringlane::testing {

namespace v1 = ringlane::v1;
using router::AddDecodeRow;
using router::AddPrefillRow;
using router::AddReleaseRow;
using router::SetLaneParams;

v1::SamplingParams Greedy() {
  v1::SamplingParams p;
  p.set_temperature(0);
  p.set_seed(0);
  return p;
}

absl::StatusOr<std::vector<DriverOutput>> DriveLanes(router::WorkerGroupClient& group,
                                                     const std::vector<DriverLane>& lanes,
                                                     uint64_t first_lane_id) {
  const int bs = group.info().block_size_tokens();
  struct State {
    int64_t fed = 0;  // positions written
    bool started = false, finished = false, released = false;
    std::vector<int32_t> blocks;
  };
  std::vector<State> st(lanes.size());
  int next_block = 0;
  for (size_t i = 0; i < lanes.size(); ++i) {
    const int64_t total = static_cast<int64_t>(lanes[i].prompt.size()) + lanes[i].max_tokens;
    const int n = static_cast<int>((total + bs - 1) / bs);
    for (int b = 0; b < n; ++b) st[i].blocks.push_back(next_block++);
  }
  if (next_block > group.info().kv_pool_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("lanes need ", next_block, " blocks"));
  }
  std::vector<DriverOutput> out(lanes.size());
  uint64_t round_id = 0;
  for (int round = 0;; ++round) {
    v1::RoundPlan plan;
    plan.set_round_id(++round_id);
    bool pending = false;
    for (size_t i = 0; i < lanes.size(); ++i) {
      const DriverLane& l = lanes[i];
      State& s = st[i];
      if (s.released) continue;
      pending = true;
      if (round < l.first_round) continue;
      const uint64_t id = first_lane_id + i;
      if (s.finished) {
        AddReleaseRow(&plan, id);
        s.released = true;
        continue;
      }
      const int64_t prompt = static_cast<int64_t>(l.prompt.size());
      v1::LaneStep* row;
      int64_t n = 1;
      if (s.fed < prompt) {
        const int64_t chunk = l.prefill_chunk > 0 ? l.prefill_chunk : prompt;
        n = std::min(chunk, prompt - s.fed);
        row = AddPrefillRow(&plan, id, s.fed,
                            absl::MakeConstSpan(l.prompt.data() + s.fed, static_cast<size_t>(n)),
                            s.fed + n == prompt, s.blocks, bs);
      } else {
        row = AddDecodeRow(&plan, id, s.fed, {}, s.blocks, bs);
      }
      if (!s.started) {
        SetLaneParams(row, l.sampling, l.choice_index);
        s.started = true;
      }
      s.fed += n;
    }
    if (!pending) break;
    if (plan.rows_size() == 0) continue;
    absl::StatusOr<v1::RoundResult> r = group.Run(plan);
    if (!r.ok()) return r.status();
    if (r->error().code() != 0) {
      return absl::InternalError(
          absl::StrCat("round ", r->round_id(), " rejected: ", r->error().message()));
    }
    for (const v1::LaneOutput& o : r->outputs()) {
      const size_t i = o.lane_id() - first_lane_id;
      for (const v1::SampledToken& t : o.tokens()) {
        out[i].tokens.push_back(t.token_id());
        out[i].logprobs.push_back(t.logprob());
      }
      if (static_cast<int>(out[i].tokens.size()) >= lanes[i].max_tokens) st[i].finished = true;
    }
  }
  return out;
}

}  // namespace ringlane::testing
