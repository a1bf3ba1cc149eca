#include "tests/support/planned_rounds.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "router/client/round_builder.h"
#include "router/kv/kv_block_manager.h"
#include "router/request/request_state.h"
#include "router/sched/applier.h"
#include "router/sched/lane.h"
#include "router/sched/scheduler.h"

namespace ringlane::testing {

namespace v1 = ringlane::v1;

namespace {

// Ends a choice at max_tokens or its stop token (as choice_output does
// without text) and records each kept token with where it came from.
class CollectingSink final : public router::ResultSink {
 public:
  CollectingSink(const std::vector<PlannedLane>& lanes,
                 const std::map<const router::RequestState*, size_t>& index,
                 std::vector<PlannedLaneOutput>* out)
      : lanes_(lanes), index_(index), out_(out) {}

  void set_round_id(uint64_t id) { round_id_ = id; }

  bool OnToken(router::Lane& lane, const v1::SampledToken& t) override {
    router::Choice& c = lane.req->choices[lane.choice];
    if (c.finished) return false;
    const size_t i = index_.at(lane.req.get());
    c.generated.push_back(t.token_id());
    PlannedLaneOutput& o = (*out_)[i];
    o.tokens.push_back(t.token_id());
    o.logprobs.push_back(t.logprob());
    o.token_round_ids.push_back(round_id_);
    o.token_lane_ids.push_back(lane.id);
    if (static_cast<int>(c.generated.size()) >= lanes_[i].max_tokens ||
        t.token_id() == lanes_[i].stop_token) {
      c.finished = true;
      return true;
    }
    return false;
  }

 private:
  const std::vector<PlannedLane>& lanes_;
  const std::map<const router::RequestState*, size_t>& index_;
  std::vector<PlannedLaneOutput>* const out_;
  uint64_t round_id_ = 0;
};

// Notes each prefill row's size, and whether another lane decodes beside it.
void RecordChunks(const router::PlannedRound& round,
                  const std::map<router::LaneId, size_t>& lane_of,
                  std::vector<PlannedLaneOutput>* out) {
  std::vector<router::LaneId> decoders;
  for (const v1::LaneStep& row : round.plan.rows()) {
    if (row.use_last_sampled()) decoders.push_back(row.lane_id());
  }
  for (const v1::LaneStep& row : round.plan.rows()) {
    if (row.use_last_sampled() || row.token_ids_size() == 0) continue;
    auto it = lane_of.find(row.lane_id());
    if (it == lane_of.end()) continue;
    PlannedLaneOutput& o = (*out)[it->second];
    o.prefill_chunks.push_back(row.token_ids_size());
    for (router::LaneId d : decoders) {
      if (d != row.lane_id()) {
        ++o.mixed_prefill_chunks;
        break;
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<PlannedLaneOutput>> RunPlannedRounds(
    router::WorkerGroup& group, const std::vector<PlannedLane>& lanes,
    const PlannedRoundsOptions& options) {
  const v1::WorkerInfo& info = group.info();
  router::KvBlockManager::Options ko;
  ko.num_blocks = info.kv_pool_blocks();
  ko.identity.model_id = info.model_id().empty() ? "test" : info.model_id();
  ko.identity.kv_dtype = absl::StrCat("dtype", static_cast<int>(info.kv_dtype()));
  ko.identity.block_size_tokens = info.block_size_tokens();
  ko.identity.tp_world_size = std::max(1, info.tp_world_size());
  ko.linear_chunk = info.linear_chunk();
  absl::StatusOr<std::unique_ptr<router::KvBlockManager>> kv = router::KvBlockManager::Create(ko);
  if (!kv.ok()) return kv.status();

  std::vector<std::shared_ptr<router::RequestState>> reqs;
  std::map<const router::RequestState*, size_t> index;
  for (size_t i = 0; i < lanes.size(); ++i) {
    auto r = std::make_shared<router::RequestState>();
    r->queue = std::make_shared<router::ResponseQueue>();
    r->p.request_id = absl::StrCat("lane-", i);
    r->p.prompt = lanes[i].prompt;
    r->p.max_tokens = lanes[i].max_tokens;
    r->p.sampling = lanes[i].sampling;
    r->choices.resize(1);
    r->choices[0].index = lanes[i].choice_index;
    r->choices_left = 1;
    index[r.get()] = i;
    reqs.push_back(std::move(r));
  }
  std::vector<PlannedLaneOutput> out(lanes.size());
  CollectingSink sink(lanes, index, &out);
  router::SchedState state;
  state.next_lane_id = options.first_lane_id;
  // Never observed: an unready model sizes chunks by min_prefill_chunk alone,
  // the same on every rank and every run.
  const router::RoundCostModel cost;
  std::deque<router::PlannedRound> in_flight;
  std::vector<bool> arrived(lanes.size(), false);
  size_t num_arrived = 0;
  std::map<router::LaneId, size_t> lane_of;

  // A bound on the loop, so that a planner that stops making progress fails
  // the test instead of hanging it.
  int64_t max_steps = 1000;
  for (const PlannedLane& l : lanes) {
    max_steps += l.arrival_round + 4 * (static_cast<int64_t>(l.prompt.size()) + l.max_tokens);
  }
  const size_t depth = static_cast<size_t>(std::max(1, options.pipeline_depth));
  int64_t round = 0;
  for (int64_t step = 0;; ++step) {
    if (step > max_steps) {
      return absl::InternalError(absl::StrCat("no progress after ", step, " steps"));
    }
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (arrived[i] || lanes[i].arrival_round > round) continue;
      arrived[i] = true;
      ++num_arrived;
      state.waiting.push_back({reqs[i], 0});
    }
    if (num_arrived == lanes.size() && state.lanes.empty() && state.waiting.empty() &&
        state.pending_release.empty() && in_flight.empty()) {
      break;
    }
    if (in_flight.size() < depth) {
      router::PlannedRound planned;
      router::PlanRound(state, **kv, cost, options.planner, nullptr, &planned);
      ++round;
      if (planned.plan.rows_size() > 0) {
        for (const auto& lane : state.lanes) lane_of[lane->id] = index.at(lane->req.get());
        RecordChunks(planned, lane_of, &out);
        if (absl::Status st = group.Send(planned.plan); !st.ok()) return st;
        in_flight.push_back(std::move(planned));
        if (in_flight.size() < depth) continue;
      }
      if (in_flight.empty()) continue;  // waiting for an arrival
    }
    absl::StatusOr<v1::RoundResult> result = group.Receive();
    if (!result.ok()) return result.status();
    if (result->error().code() != 0) {
      return absl::InternalError(
          absl::StrCat("round ", result->round_id(), " rejected: ", result->error().message()));
    }
    sink.set_round_id(result->round_id());
    // No drafter here, so no row is ever voided: nothing later to mark.
    router::ApplyRoundResult(in_flight.front(), *result, state, **kv, sink, {});
    in_flight.pop_front();
  }
  for (const auto& r : reqs) {
    if (!r->failed) continue;
    std::vector<v1::GenerateResponse> msgs;
    absl::Status st;
    r->queue->Take(absl::ZeroDuration(), &msgs, &st);
    return st;
  }
  return out;
}

}  // namespace ringlane::testing
