// A fake worker group for the scheduler's tests (planner_test,
// group_loop_test): a model of what the workers keep, a KV pool whose slots
// hold a hash of the whole prefix written there, and per lane the positions
// it has written and its last sampled token. Its "model" samples from that
// hash, so a lane that reads a wrong block, a stale slot or a position never
// written produces different tokens than a solo run (FakeReference). The
// sample also depends on the sum of the output tokens the lane's worker
// state knows (as penalties do), so a lane re-admitted after a preemption
// diverges unless its first row carries the choice's earlier output.
//
// Thread-safe: the group loop sends and receives on its thread while a test
// reads the observers and injects faults; every member takes mu_.
#ifndef RINGLANE_ROUTER_SCHED_FAKE_WORKER_GROUP_H_
#define RINGLANE_ROUTER_SCHED_FAKE_WORKER_GROUP_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ringlane/v1/worker.pb.h"
#include "router/client/round_builder.h"
#include "router/client/worker_group.h"
#include "router/kv/kv_block_manager.h"

namespace ringlane::router {

inline constexpr int32_t kFakeVocab = 64;

inline uint64_t FakeMix(uint64_t h, int32_t token) {
  uint64_t x = h ^ (static_cast<uint64_t>(token) + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// The token the model samples after a prefix whose hash is `h`, for a lane
// whose earlier output tokens sum to `output_sum`.
inline int32_t FakeNextToken(uint64_t h, int64_t output_sum) {
  return 3 + static_cast<int32_t>(FakeMix(h, static_cast<int32_t>(output_sum)) % (kFakeVocab - 3));
}

// What a solo run of the model generates after `prompt`.
inline std::vector<int32_t> FakeReference(const std::vector<int32_t>& prompt, int max_tokens) {
  uint64_t h = 0;
  for (int32_t t : prompt) h = FakeMix(h, t);
  std::vector<int32_t> out;
  int64_t sum = 0;
  for (int i = 0; i < max_tokens; ++i) {
    out.push_back(FakeNextToken(h, sum));
    sum += out.back();
    h = FakeMix(h, out.back());
  }
  return out;
}

// The workers of one group, in one object: checks every row against what it
// holds and answers in plan order.
class FakeWorkerGroup final : public WorkerGroup {
 public:
  FakeWorkerGroup(int num_blocks, int block_size) : block_size_(block_size), pool_(num_blocks) {
    for (auto& b : pool_) b.assign(block_size, std::nullopt);
    info_.set_kv_pool_blocks(num_blocks);
    info_.set_block_size_tokens(block_size);
    info_.set_model_id("fake");
    info_.set_tp_world_size(1);
    info_.set_group_epoch(1);
  }

  const ringlane::v1::WorkerInfo& info() const override { return info_; }
  absl::Status Send(const ringlane::v1::RoundPlan& plan) override {
    absl::MutexLock l(&mu_);
    if (fail_send_after_ && sent_ >= *fail_send_after_) return failure_;
    ++sent_;
    results_.push_back(Run(plan));
    return absl::OkStatus();
  }
  absl::StatusOr<ringlane::v1::RoundResult> Receive() override {
    std::chrono::microseconds delay;
    {
      absl::MutexLock l(&mu_);
      delay = round_delay_;
    }
    // A round takes time, so that a test can act while requests run.
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    absl::MutexLock l(&mu_);
    if (fail_receive_after_ && received_ >= *fail_receive_after_) return failure_;
    if (results_.empty()) return absl::FailedPreconditionError("nothing sent");
    ++received_;
    ringlane::v1::RoundResult r = std::move(results_.front());
    results_.pop_front();
    return r;
  }
  absl::Status Check(std::chrono::milliseconds) override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

  // A kvstore beside the fake workers: offloads copy a block's slots under
  // its hash, restores copy them back, so a restored block that is wrong (or
  // lands where a live lane reads) changes tokens or shows in errors().
  void EnableKvstore() {
    absl::MutexLock l(&mu_);
    info_.set_kvstore_address("fake-kvstore");
  }
  // The store loses everything (restarted empty).
  void ClearStore() {
    absl::MutexLock l(&mu_);
    store_.clear();
  }
  // While true, restores bring nothing back (a store that is down).
  void set_store_down(bool down) {
    absl::MutexLock l(&mu_);
    store_down_ = down;
  }
  int RestoreKvBlocks(const ringlane::v1::RestoreKvBlocksRequest& req,
                      std::chrono::milliseconds) override {
    absl::MutexLock l(&mu_);
    ++restore_calls_;
    if (store_down_) return 0;
    int n = 0;
    for (const ringlane::v1::KvBlockRef& b : req.blocks()) {
      auto it = store_.find(b.prefix_hash());
      if (it == store_.end()) break;
      for (int64_t slot = 0; slot < block_size_; ++slot) {
        if (auto r = Reader(0, b.block_id(), slot)) {
          errors_.push_back(
              absl::StrCat("restore into block ", b.block_id(), " that lane ", *r, " reads"));
        }
      }
      pool_[b.block_id()] = it->second;
      ++n;
    }
    restored_blocks_ += n;
    return n;
  }
  int64_t offloads_seen() const {
    absl::MutexLock l(&mu_);
    return offloads_seen_;
  }
  // First rows that carried prefix tokens (all checked against the pool).
  int64_t prefix_rows() const {
    absl::MutexLock l(&mu_);
    return prefix_rows_;
  }
  int64_t restored_blocks() const {
    absl::MutexLock l(&mu_);
    return restored_blocks_;
  }
  int64_t restore_calls() const {
    absl::MutexLock l(&mu_);
    return restore_calls_;
  }

  // Fault injection: once `rounds` calls have succeeded, every Send (or
  // Receive) returns `status`, as a client whose rank's stream ended does.
  void FailSendAfter(int64_t rounds, absl::Status status) {
    absl::MutexLock l(&mu_);
    fail_send_after_ = rounds;
    failure_ = std::move(status);
  }
  void FailReceiveAfter(int64_t rounds, absl::Status status) {
    absl::MutexLock l(&mu_);
    fail_receive_after_ = rounds;
    failure_ = std::move(status);
  }
  // How long each Receive waits before it answers.
  void set_round_delay(std::chrono::microseconds d) {
    absl::MutexLock l(&mu_);
    round_delay_ = d;
  }

  // Positions whose KV lane `id` has written or inherited; -1 if unknown.
  int64_t positions(LaneId id) const {
    absl::MutexLock l(&mu_);
    auto it = lanes_.find(id);
    return it == lanes_.end() ? -1 : it->second.valid;
  }
  // Lanes whose state the workers hold (created and not released).
  int64_t live_lanes() const {
    absl::MutexLock l(&mu_);
    return static_cast<int64_t>(lanes_.size());
  }
  // Release rows that dropped a lane the workers held.
  int64_t released_lanes() const {
    absl::MutexLock l(&mu_);
    return released_;
  }
  int64_t rounds_received() const {
    absl::MutexLock l(&mu_);
    return received_;
  }
  std::vector<std::string> errors() const {
    absl::MutexLock l(&mu_);
    return errors_;
  }
  int64_t drafts_seen() const {
    absl::MutexLock l(&mu_);
    return drafts_seen_;
  }
  int64_t rows_voided() const {
    absl::MutexLock l(&mu_);
    return voided_;
  }
  int64_t drafts_accepted() const {
    absl::MutexLock l(&mu_);
    return drafts_accepted_;
  }

 private:
  struct LaneState {
    int64_t valid = 0;
    std::optional<int32_t> last;
    std::vector<int32_t> blocks;  // the table of its last row
    int64_t output_sum = 0;       // the sampler state: earlier output plus samples
  };

  // Another live lane whose written positions include slot `slot` of
  // `block`: a write there would change what that lane reads.
  std::optional<LaneId> Reader(LaneId writer, int32_t block, int64_t slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, l] : lanes_) {
      if (id == writer) continue;
      for (size_t i = 0; i < l.blocks.size(); ++i) {
        if (l.blocks[i] == block && static_cast<int64_t>(i) * block_size_ + slot < l.valid) {
          return id;
        }
      }
    }
    return std::nullopt;
  }

  std::optional<uint64_t>& Slot(const ringlane::v1::LaneStep& row, int64_t p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pool_[row.block_ids(static_cast<int>(p / block_size_))][p % block_size_];
  }

  ringlane::v1::RoundResult Run(const ringlane::v1::RoundPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ringlane::v1::RoundResult result;
    result.set_round_id(plan.round_id());
    auto fail = [&](const std::string& why) {
      errors_.push_back(absl::StrCat("round ", plan.round_id(), ": ", why));
    };
    // Before the forward pass, as the workers do.
    for (const ringlane::v1::KvBlockRef& o : plan.offloads()) {
      ++offloads_seen_;
      if (o.block_id() < 0 || o.block_id() >= static_cast<int32_t>(pool_.size())) {
        fail(absl::StrCat("offload of block ", o.block_id(), " outside the pool"));
        continue;
      }
      auto& stored = store_[o.prefix_hash()];
      if (!stored.empty() && stored != pool_[o.block_id()]) {
        fail(absl::StrCat("block ", o.block_id(), " offloaded under a hash stored with other KV"));
      }
      stored = pool_[o.block_id()];
    }
    for (const ringlane::v1::LaneStep& row : plan.rows()) {
      const int64_t n = RowTokens(row);
      auto it = lanes_.find(row.lane_id());
      if (it == lanes_.end()) {
        if (n == 0) continue;  // a release of a lane that never ran here
        if (!row.has_sampling()) fail(absl::StrCat("lane ", row.lane_id(), " without params"));
        it = lanes_.emplace(row.lane_id(), LaneState{.valid = row.start_position()}).first;
        for (int32_t t : row.earlier_output_token_ids()) it->second.output_sum += t;
      }
      LaneState& lane = it->second;
      // Planned behind a verify row that rejected a draft: skipped, as the
      // workers do (LaneStep.assume_accepted).
      const bool voided = row.assume_accepted() && row.start_position() != lane.valid;
      if (voided) ++voided_;
      if (row.assume_accepted() && !row.use_last_sampled()) {
        fail(absl::StrCat("lane ", row.lane_id(), ": assume_accepted without use_last_sampled"));
      }
      if (n > 0 && !voided) {
        if (row.start_position() != lane.valid) {
          fail(absl::StrCat("lane ", row.lane_id(), " starts at ", row.start_position(),
                            " where its KV ends at ", lane.valid));
        }
        if (row.block_ids_size() * int64_t{block_size_} < row.start_position() + n) {
          fail(absl::StrCat("lane ", row.lane_id(), ": blocks do not cover the row"));
          continue;
        }
        // The prefix hash read back from the slot before the row: a slot
        // never written (or a wrong block) shows up as a missing value.
        uint64_t h = 0;
        if (row.start_position() > 0) {
          std::optional<uint64_t> prev = Slot(row, row.start_position() - 1);
          if (!prev) {
            fail(absl::StrCat("lane ", row.lane_id(), " reads an empty slot"));
            continue;
          }
          h = *prev;
        }
        if (row.prefix_token_ids_size() > 0) {
          // The draft model's copy of the prefix: the tokens whose KV the
          // lane reads, so they hash to what its last cached slot holds.
          uint64_t ph = 0;
          for (int32_t t : row.prefix_token_ids()) ph = FakeMix(ph, t);
          if (!row.has_sampling() || row.prefix_token_ids_size() != row.start_position() ||
              ph != h) {
            fail(absl::StrCat("lane ", row.lane_id(), ": prefix tokens that are not its prefix"));
          }
          ++prefix_rows_;
        }
        std::vector<int32_t> inputs;
        if (row.use_last_sampled()) {
          if (!lane.last) fail(absl::StrCat("lane ", row.lane_id(), " has no last token"));
          inputs.push_back(lane.last.value_or(0));
        }
        inputs.insert(inputs.end(), row.token_ids().begin(), row.token_ids().end());
        std::vector<uint64_t> hashes;
        for (size_t i = 0; i < inputs.size(); ++i) {
          h = FakeMix(h, inputs[i]);
          const int64_t p = row.start_position() + static_cast<int64_t>(i);
          if (auto r = Reader(row.lane_id(), row.block_ids(static_cast<int>(p / block_size_)),
                              p % block_size_)) {
            fail(absl::StrCat("lane ", row.lane_id(), " writes position ", p, " into a block lane ",
                              *r, " reads"));
          }
          Slot(row, p) = h;
          hashes.push_back(h);
        }
        lane.valid = row.start_position() + n;
        lane.blocks.assign(row.block_ids().begin(), row.block_ids().end());
        ringlane::v1::LaneOutput out;
        out.set_lane_id(row.lane_id());
        if (row.verify_offsets_size() > 0) {
          int accepted = 0;
          for (int o = 0; o < row.verify_offsets_size(); ++o) {
            const int32_t t = FakeNextToken(hashes[o], lane.output_sum);
            out.add_tokens()->set_token_id(t);
            lane.last = t;
            lane.output_sum += t;
            if (o + 1 < static_cast<int>(inputs.size()) && inputs[o + 1] == t) {
              ++accepted;
              continue;
            }
            break;
          }
          out.set_accepted_draft_count(accepted);
          drafts_seen_ += row.token_ids_size();
          drafts_accepted_ += accepted;
          // Positions past the last accepted draft hold garbage: the next
          // row of the lane starts right after the accepted ones.
          lane.valid = row.start_position() + 1 + accepted;
          *result.add_outputs() = out;
        } else if (row.sample_last()) {
          const int32_t t = FakeNextToken(hashes.back(), lane.output_sum);
          out.add_tokens()->set_token_id(t);
          lane.last = t;
          lane.output_sum += t;
          *result.add_outputs() = out;
        }
      }
      if (row.release_lane()) released_ += static_cast<int64_t>(lanes_.erase(row.lane_id()));
    }
    return result;
  }

  // Fixed at construction.
  const int block_size_;
  ringlane::v1::WorkerInfo info_;

  mutable absl::Mutex mu_;
  std::vector<std::vector<std::optional<uint64_t>>> pool_ ABSL_GUARDED_BY(mu_);
  std::map<LaneId, LaneState> lanes_ ABSL_GUARDED_BY(mu_);
  std::deque<ringlane::v1::RoundResult> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  int64_t drafts_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t drafts_accepted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t voided_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<std::optional<uint64_t>>> store_ ABSL_GUARDED_BY(mu_);
  bool store_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t offloads_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t restored_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t restore_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_rows_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> fail_send_after_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> fail_receive_after_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::chrono::microseconds round_delay_ ABSL_GUARDED_BY(mu_){0};
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_FAKE_WORKER_GROUP_H_
