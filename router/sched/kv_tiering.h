// The kvstore tier of one worker group, driven by its group loop: the
// write-through of every block the ledger registers, and the restore of a
// waiting prompt's uncached blocks before it is admitted.
//
// Offload. Each plan carries (up to a bound) the blocks its own planning
// evicted that were never offloaded (a write-back: the copy runs before the
// forward pass that overwrites them), then the blocks registered since,
// under their chain hashes; the workers copy them before the plan's forward
// pass and upload them in the background. A hash offloaded recently (or
// restored) is not sent again.
//
// Restore. For a waiting choice whose prompt has full blocks past the pool's
// cached prefix, a placeholder lane takes blocks for them in the ledger.
// Once every round planned before that has returned (an in-flight round may
// still write a block freed just before), the restorer thread asks every
// rank to restore the chain from its kvstore (WorkerGroup::RestoreKvBlocks).
// The leading blocks every rank wrote are registered as cached, the
// placeholder is released, and the choice is admitted as usual: it then
// finds them as a prefix hit. Meanwhile the choice keeps its place in the
// queue and the rounds go on; a store that is down or slow costs the
// deadline and a recomputation, never an error or a stalled round.
//
// Models with recurrent layers: a block that ends at a state checkpoint
// position is offloaded with its checkpoint (KvBlockRef.state_checkpoint),
// or not at all when the ledger has handed the slot on; a restore asks for
// the chain up to the last checkpoint position only, with pinned slots for
// the checkpoints it brings back, which the ledger then holds as those of
// the restored blocks.
//
// Not thread-safe by itself: every method is called with the group loop's
// mutex held (passed in), which the restorer thread also takes to hand back
// its results.
#ifndef RINGLANE_ROUTER_SCHED_KV_TIERING_H_
#define RINGLANE_ROUTER_SCHED_KV_TIERING_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ringlane/v1/worker.pb.h"
#include "router/client/worker_group.h"
#include "router/kv/kv_block_manager.h"
#include "router/router_metrics.h"
#include "router/sched/lane.h"

namespace ringlane::router {

struct KvTieringOptions {
  bool offload = true;
  bool restore = true;
  // Offload entries per plan; more wait for the next plan.
  int max_offloads_per_round = 256;
  // Registered blocks waiting to be offloaded; older ones beyond it are
  // skipped (they are recomputed if ever wanted).
  size_t max_pending_offloads = 4096;
  // Hashes remembered as stored, so that a prefix resent often is offloaded
  // once.
  size_t remembered_hashes = 1 << 16;
  // Restores prepared or running at once.
  int max_restores = 4;
  // Deadline of one restore call to the ranks.
  std::chrono::milliseconds restore_deadline{1000};
};

class KvTiering {
 public:
  // `mu` is the group loop's mutex: every call below holds it.
  KvTiering(KvTieringOptions options, absl::Mutex* mu);
  ~KvTiering();  // joins the restorer thread (without `mu` held)

  KvTiering(const KvTiering&) = delete;
  KvTiering& operator=(const KvTiering&) = delete;

  // A group (re)connected: `group` serves restores from now on (null: none),
  // and everything planned for the previous connection is forgotten.
  // `enabled` says whether the group's workers have kvstores.
  void Connected(std::shared_ptr<WorkerGroup> group, bool enabled, GroupMetrics* metrics)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

  // Right after planning: adds to `plan` the write-back of the registered
  // blocks its planning evicted, then the pending offloads (a plan without
  // rows is not sent and gets none).
  void AddOffloads(KvBlockManager& kv, ringlane::v1::RoundPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

  // Between rounds: applies finished restores, dispatches prepared ones
  // whose rounds have returned (results applied up to `last_applied_round`;
  // `last_planned_round` is the newest id planned), and prepares restores
  // for waiting choices not yet probed.
  void Poll(SchedState& s, KvBlockManager& kv, uint64_t last_planned_round,
            uint64_t last_applied_round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

  // Whether Poll has something to do now (a finished restore to apply, or
  // a prepared one to dispatch when no round is in flight).
  bool HasWork(uint64_t last_planned_round, uint64_t last_applied_round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

 private:
  struct Job {
    uint64_t connection = 0;  // Connected() count when prepared
    std::shared_ptr<RequestState> req;
    int choice = 0;
    LaneId placeholder = 0;
    std::vector<int32_t> tokens;  // the prompt's first (first_block + blocks) blocks
    int64_t first_block = 0;      // blocks already cached when prepared
    std::vector<int32_t> pins;    // checkpoint slots the restore writes (recurrent layers)
    uint64_t after_round = 0;     // dispatch once results up to this one are applied
    ringlane::v1::RestoreKvBlocksRequest request;
    enum class State { kPrepared, kRunning, kDone } state = State::kPrepared;
    int restored = 0;
  };

  void Prepare(SchedState& s, KvBlockManager& kv, Waiting& w, uint64_t last_planned_round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  void Finish(SchedState& s, KvBlockManager& kv, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  void Remember(const std::string& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // The store turned out not to hold `hash` (a restore stopped there): offer
  // it again when a block registers it.
  void Forget(const std::string& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  void RestoreLoop();

  const KvTieringOptions options_;
  absl::Mutex* const mu_;
  std::shared_ptr<WorkerGroup> group_ ABSL_GUARDED_BY(*mu_);
  bool enabled_ ABSL_GUARDED_BY(*mu_) = false;
  GroupMetrics* metrics_ ABSL_GUARDED_BY(*mu_) = nullptr;
  uint64_t connection_ ABSL_GUARDED_BY(*mu_) = 0;
  std::deque<BlockId> pending_ ABSL_GUARDED_BY(*mu_);
  std::list<std::string> remembered_ ABSL_GUARDED_BY(*mu_);  // oldest first
  std::unordered_map<std::string, std::list<std::string>::iterator> remembered_set_
      ABSL_GUARDED_BY(*mu_);
  std::list<Job> jobs_ ABSL_GUARDED_BY(*mu_);
  LaneId next_placeholder_ ABSL_GUARDED_BY(*mu_);
  bool stop_ ABSL_GUARDED_BY(*mu_) = false;
  std::thread restorer_;  // last: starts once the fields above exist
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_KV_TIERING_H_
