// Runs RoundPlans on one rank: checks a plan against the lanes this rank
// knows, turns it into a backend round, samples every lane that asks for a
// token with the lane's own generator, and keeps each lane's sampler state
// and last sampled token. Every rank of a group runs the same plans through
// an executor of its own and so samples the same tokens; that is what lets a
// plan say "input = this lane's last sampled token" before the router has
// seen it.
//
// One per Rounds stream, used only on the step loop's thread (step_loop.h),
// which makes it at the stream's first round; the stream's handler reads the
// counters between rounds. Not thread-safe.
#ifndef RINGLANE_WORKER_SERVER_ROUND_EXECUTOR_H_
#define RINGLANE_WORKER_SERVER_ROUND_EXECUTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ringlane/v1/worker.pb.h"
#include "worker/backend/backend.h"
#include "worker/collectives/timed_communicator.h"
#include "worker/sampler.h"
#include "worker/server/draft_runner.h"

namespace ringlane::worker {

// The worker's sampling parameters for a plan's resolved ones.
// InvalidArgument when temperature or seed is missing or a value is out of
// range (ValidateSamplingParams).
absl::StatusOr<SamplingParams> FromProto(const ringlane::v1::SamplingParams& p);

class RoundExecutor {
 public:
  // `backend` is not owned and must outlive the executor. Rank 0 fills the
  // results' outputs; other ranks only keep state.
  // `timer` (optional, not owned) is the communicator the backend uses; its
  // time goes into the results' collective_time_us.
  // `draft` (optional, not owned; rank 0 only) feeds every round to the
  // draft model and answers rows' propose_drafts.
  RoundExecutor(Backend* backend, int rank, TimedCommunicator* timer = nullptr,
                DraftRunner* draft = nullptr);

  // Runs one plan. A plan that fails validation (here or in the backend) is
  // answered with result.error set (INVALID_ARGUMENT) and changes nothing. A
  // non-OK return is an execution failure (a collective or the device): the
  // executor's state is then undefined and the group unusable.
  absl::StatusOr<ringlane::v1::RoundResult> Run(const ringlane::v1::RoundPlan& plan);

  // Drops every lane (the stream that owned them ended).
  void Clear() {
    lanes_.clear();
    free_slots_.clear();
    slots_ready_ = false;
  }
  size_t num_lanes() const { return lanes_.size(); }
  // Tokens sampled and drafts accepted by the last Run (on every rank, not
  // only where they are reported).
  int64_t last_sampled() const { return last_sampled_; }
  int64_t last_accepted() const { return last_accepted_; }
  // Positions the last Run fed, and its rows that were void
  // (LaneStep.assume_accepted behind a rejected draft).
  int64_t last_fed() const { return last_fed_; }
  int64_t last_voided() const { return last_voided_; }
  // Recurrent models: tokens fed again by the last Run to rewind lanes'
  // states past rejected drafts.
  int64_t last_replayed() const { return last_replayed_; }
  // Draft tokens proposed by the last Run, and its time in the draft model.
  int64_t last_proposed() const { return last_proposed_; }
  int64_t last_draft_us() const { return last_draft_us_; }
  // Stale prefix tokens the last Run fed the draft model (DraftRunner).
  int64_t last_draft_prefix_fed() const { return last_draft_prefix_fed_; }

 private:
  struct Lane {
    Lane(const SamplingParams& p, uint32_t choice, absl::Span<const int32_t> earlier_output)
        : sampler(p, choice, earlier_output) {}
    Sampler sampler;
    bool has_last = false;
    int32_t last_sampled = 0;
    // Where last_sampled is fed: the position after the lane's last
    // accepted token (-1 before it sampled).
    int64_t next_position = -1;
    // Models with recurrent layers: the lane's state slot and the positions
    // [0, state_position) the state has consumed.
    int32_t state_slot = -1;
    int64_t state_position = 0;
  };

  // OK, or the reason the plan is rejected. Touches nothing.
  absl::Status Validate(const ringlane::v1::RoundPlan& plan) const;
  // An assume_accepted row behind a rejected draft (see worker.proto).
  bool Voided(const ringlane::v1::LaneStep& row) const;
  // The row's earlier_output_token_ids against the model's vocabulary and
  // context.
  absl::Status ValidateEarlierOutput(const ringlane::v1::LaneStep& row) const;
  // InvalidArgument naming `field` and the first id outside the vocabulary.
  absl::Status InVocabulary(absl::string_view field,
                            const google::protobuf::RepeatedField<int32_t>& ids) const;

  Backend* const backend_;
  const int rank_;
  TimedCommunicator* const timer_;
  DraftRunner* const draft_;
  std::map<uint64_t, std::unique_ptr<Lane>> lanes_;
  // Recurrent models: the backend's state slots no lane holds, lowest last
  // (so every rank hands out the same slot to the same lane). Filled at the
  // first Run after construction or Clear.
  std::vector<int32_t> free_slots_;
  bool slots_ready_ = false;
  // Per sequence of the running round: its lane's state before a verify
  // row (capacity kept between rounds).
  std::vector<std::vector<float>> rewind_;
  int64_t last_replayed_ = 0;
  int64_t last_sampled_ = 0;
  int64_t last_accepted_ = 0;
  int64_t last_fed_ = 0;
  int64_t last_voided_ = 0;
  int64_t last_proposed_ = 0;
  int64_t last_draft_us_ = 0;
  int64_t last_draft_prefix_fed_ = 0;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_ROUND_EXECUTOR_H_
