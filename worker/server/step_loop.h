// The step loop of one rank: the one thread that owns the group's current
// formation (its backend, and so the KV pool, and its communicator) and runs
// everything that touches it, taken from one FIFO queue in the order it was
// enqueued: install and teardown of a formation, rounds, KV block exports and
// imports. So an import enqueued after a round is applied after it, and an
// export sees the writes of every round enqueued before it.
//
// Owned by GroupMember, whose formation thread installs and tears down
// formations; WorkerService's gRPC handlers enqueue rounds and block moves
// and wait for their results. Thread-safe: the public methods may be called
// from any thread, and each blocks its caller until its operation has run (or
// was abandoned). Lock order: mu_ is never held while an operation runs, nor
// while the admission or failure callbacks are called (they take the owner's
// locks).
#ifndef RINGLANE_WORKER_SERVER_STEP_LOOP_H_
#define RINGLANE_WORKER_SERVER_STEP_LOOP_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ringlane/v1/worker.pb.h"
#include "worker/backend/backend.h"
#include "worker/collectives/timed_communicator.h"
#include "worker/kv_cache.h"
#include "worker/server/draft_runner.h"
#include "worker/server/round_executor.h"

namespace ringlane::worker {

class StepLoop {
 public:
  // Says whether an operation for epoch `epoch` (0: whichever is current) may
  // run while the formation of epoch `installed` (0: none) is installed: OK,
  // or Unavailable saying why not (still forming, broken, moved on).
  using AdmitFn = std::function<absl::Status(int64_t epoch, int64_t installed)>;
  // Called on the step thread when a round failed in a collective or the
  // backend (the formation is then broken).
  using FailureFn = std::function<void(const absl::Status&)>;
  // Polled (under no lock of the caller's) while an operation waits in the
  // queue; true abandons it there.
  using CancelledFn = std::function<bool()>;

  // `rank` is this rank's in its group (rank 0 fills round outputs). Starts
  // the thread.
  StepLoop(int rank, AdmitFn admit, FailureFn on_failure);
  ~StepLoop();  // Stop()s

  // Lets every operation enqueued so far run, drops the formation and ends the
  // thread; later operations are Unavailable. Idempotent.
  void Stop();

  // Makes `backend` (over `comm`, which it may use) the formation of `epoch`
  // and allocates its empty KV pool, on the step thread. On failure (the
  // pool's InvalidArgument or ResourceExhausted) both are dropped and there is
  // no formation. Unavailable after Stop().
  // `draft` (optional, rank 0) is an unsharded backend of a draft model: it
  // gets a pool of its own (DraftRunner) and proposes drafts for the rounds'
  // rows; when it cannot be set up the reason is logged and the formation
  // serves without it.
  absl::Status Install(int64_t epoch, std::unique_ptr<TimedCommunicator> comm,
                       std::unique_ptr<Backend> backend, const KvPoolSpec& pool,
                       std::unique_ptr<Backend> draft = nullptr);
  // Drops the formation and its KV contents, after every operation enqueued
  // before.
  void Teardown();

  // The epoch of the current formation, or Unavailable (the admission
  // callback's reason).
  absl::StatusOr<int64_t> CurrentEpoch();

  struct RoundOutcome {
    // Non-OK when the round failed inside a collective or the backend: the
    // failure callback has been told, `result` is empty and the group is
    // unusable.
    absl::Status failure;
    // The executor's answer (result.error set for a rejected plan), with
    // queue_time_us: from `arrived` until the round started to run.
    ringlane::v1::RoundResult result;
  };
  // Runs `plan` through `*exec` (a Rounds stream's lanes) on the formation of
  // `epoch`; `*exec` is made on the step thread at the stream's first round.
  // Once enqueued a round always runs: every rank of a group must run the same
  // plans, so a cancelled stream does not skip one. Unavailable when the epoch
  // has ended (or the group is not serving); the stream is then over.
  absl::StatusOr<RoundOutcome> RunRound(int64_t epoch, std::unique_ptr<RoundExecutor>* exec,
                                        const ringlane::v1::RoundPlan& plan,
                                        std::chrono::steady_clock::time_point arrived);

  // Copies KV block `block` of the current formation out / in. The backend's
  // errors (InvalidArgument for a bad id or size), Unavailable without a
  // formation, Cancelled when `cancelled` says so before the operation ran.
  absl::Status ExportBlock(int32_t block, std::vector<uint8_t>* out, const CancelledFn& cancelled);
  absl::Status ImportBlock(int32_t block, absl::Span<const uint8_t> data,
                           const CancelledFn& cancelled);
  // The same for a state checkpoint (Backend::ExportStateCheckpoint).
  absl::Status ExportCheckpoint(int32_t checkpoint, int64_t position, std::vector<uint8_t>* out,
                                const CancelledFn& cancelled);
  absl::Status ImportCheckpoint(int32_t checkpoint, int64_t position,
                                absl::Span<const uint8_t> data, const CancelledFn& cancelled);

  // Operations waiting behind the running one (tests order their submissions
  // with it).
  size_t QueueLengthForTesting();

 private:
  // One queued operation. `state` and `status` are guarded by the loop's mu_.
  struct Op {
    enum class State { kQueued, kRunning, kDone, kAbandoned };
    // Needs a formation admitted for `epoch`; false for install/teardown.
    bool needs_formation = true;
    int64_t epoch = 0;
    bool final = false;  // Stop()'s: the thread ends after it
    std::function<absl::Status()> run;
    State state = State::kQueued;
    absl::Status status;
  };

  // Enqueues an operation and waits for it; `cancelled` (optional) may
  // abandon it while it is queued.
  absl::Status Submit(std::shared_ptr<Op> op, const CancelledFn* cancelled);
  void Loop();
  void DropFormation();

  const int rank_;
  const AdmitFn admit_;
  const FailureFn on_failure_;

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Op>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;

  // The formation: touched only on the step thread, so unguarded. The backend
  // uses the communicator, so it is declared after it (destroyed first).
  int64_t epoch_ = 0;  // 0: none installed
  std::unique_ptr<TimedCommunicator> comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DraftRunner> draft_;

  std::thread thread_;  // last: starts once the fields above exist
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_STEP_LOOP_H_
