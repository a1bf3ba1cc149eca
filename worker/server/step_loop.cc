#include "worker/server/step_loop.h"

#include <utility>

#include "absl/time/time.h"
#include "services/log.h"

namespace ringlane::worker {

namespace v1 = ringlane::v1;

namespace {

// How often a waiting handler looks at its cancellation; a queued operation
// waits behind at most a few rounds, so this only bounds how late an abandoned
// KV move leaves the queue.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

}  // namespace

StepLoop::StepLoop(int rank, AdmitFn admit, FailureFn on_failure)
    : rank_(rank), admit_(std::move(admit)), on_failure_(std::move(on_failure)) {
  thread_ = std::thread([this] { Loop(); });
}

StepLoop::~StepLoop() { Stop(); }

void StepLoop::Stop() {
  auto op = std::make_shared<Op>();
  op->needs_formation = false;
  op->final = true;
  op->run = [this] {
    DropFormation();
    return absl::OkStatus();
  };
  // Submit refuses once stopped_ is set, so a second Stop() only joins.
  (void)Submit(op, nullptr);
  if (thread_.joinable()) thread_.join();
}

size_t StepLoop::QueueLengthForTesting() {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void StepLoop::DropFormation() {
  draft_.reset();
  backend_.reset();
  comm_.reset();
  epoch_ = 0;
}

absl::Status StepLoop::Submit(std::shared_ptr<Op> op, const CancelledFn* cancelled) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the worker is stopping");
  // Nothing may follow the final operation: its thread is gone after it.
  if (op->final) stopped_ = true;
  queue_.push_back(op);
  auto done = [&op] { return op->state == Op::State::kDone; };
  if (cancelled == nullptr || !*cancelled) {
    mu_.Await(absl::Condition(&done));
    return op->status;
  }
  while (!mu_.AwaitWithTimeout(absl::Condition(&done), kCancelPoll)) {
    // Only a queued operation can be abandoned: a running one borrows the
    // caller's buffers until it is done.
    if (op->state == Op::State::kQueued && (*cancelled)()) {
      op->state = Op::State::kAbandoned;
      return absl::CancelledError("cancelled while waiting for the step loop");
    }
  }
  return op->status;
}

void StepLoop::Loop() {
  for (;;) {
    std::shared_ptr<Op> op;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<std::shared_ptr<Op>>* q) { return !q->empty(); }, &queue_));
      op = std::move(queue_.front());
      queue_.pop_front();
      if (op->state == Op::State::kAbandoned) continue;
      op->state = Op::State::kRunning;
    }
    absl::Status st;
    if (op->needs_formation) st = admit_(op->epoch, epoch_);
    if (st.ok()) st = op->run();
    absl::MutexLock lock(&mu_);
    op->status = std::move(st);
    op->state = Op::State::kDone;
    if (op->final) return;
  }
}

absl::Status StepLoop::Install(int64_t epoch, std::unique_ptr<TimedCommunicator> comm,
                               std::unique_ptr<Backend> backend, const KvPoolSpec& pool,
                               std::unique_ptr<Backend> draft) {
  auto op = std::make_shared<Op>();
  op->needs_formation = false;
  op->run = [&]() -> absl::Status {
    DropFormation();
    // The pool is allocated here so that its memory is first touched by the
    // thread that will use it.
    if (absl::Status st = backend->AllocateKvPool(pool); !st.ok()) {
      backend.reset();
      comm.reset();
      return st;
    }
    if (draft != nullptr) {
      // The draft pool follows the target's block ids, which cover
      // block_tokens() positions each (more than a block under context
      // parallel); the draft model keeps all of them.
      KvPoolSpec draft_pool = pool;
      draft_pool.block_size = backend->block_tokens();
      absl::StatusOr<std::unique_ptr<DraftRunner>> d = DraftRunner::Create(
          std::move(draft), draft_pool, backend->config().vocab, backend->config().max_position);
      if (d.ok()) {
        draft_ = std::move(*d);
      } else {
        RL_LOG(WARNING) << "draft model: " << d.status().message() << "; serving without proposals";
      }
    }
    comm_ = std::move(comm);
    backend_ = std::move(backend);
    epoch_ = epoch;
    return absl::OkStatus();
  };
  return Submit(op, nullptr);
}

void StepLoop::Teardown() {
  auto op = std::make_shared<Op>();
  op->needs_formation = false;
  op->run = [this] {
    DropFormation();
    return absl::OkStatus();
  };
  (void)Submit(op, nullptr);  // Unavailable only after Stop(), which drops it too
}

absl::StatusOr<int64_t> StepLoop::CurrentEpoch() {
  int64_t epoch = 0;
  auto op = std::make_shared<Op>();
  op->run = [&] {
    epoch = epoch_;
    return absl::OkStatus();
  };
  if (absl::Status st = Submit(op, nullptr); !st.ok()) return st;
  return epoch;
}

absl::StatusOr<StepLoop::RoundOutcome> StepLoop::RunRound(
    int64_t epoch, std::unique_ptr<RoundExecutor>* exec, const v1::RoundPlan& plan,
    std::chrono::steady_clock::time_point arrived) {
  RoundOutcome outcome;
  auto op = std::make_shared<Op>();
  op->epoch = epoch;
  op->run = [&]() -> absl::Status {
    const int64_t queue_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - arrived)
                                 .count();
    // The admission check guarantees that this is the epoch the executor's
    // lanes belong to, so its backend pointer is still the installed one.
    if (*exec == nullptr)
      *exec = std::make_unique<RoundExecutor>(backend_.get(), rank_, comm_.get(), draft_.get());
    absl::StatusOr<v1::RoundResult> r = (*exec)->Run(plan);
    if (!r.ok()) {
      // Tell the group before the next operation is admitted, so that nothing
      // else runs on a broken formation.
      on_failure_(r.status());
      outcome.failure = r.status();
      return absl::OkStatus();
    }
    outcome.result = std::move(*r);
    outcome.result.set_queue_time_us(queue_us);
    return absl::OkStatus();
  };
  if (absl::Status st = Submit(op, nullptr); !st.ok()) return st;
  return outcome;
}

absl::Status StepLoop::ExportBlock(int32_t block, std::vector<uint8_t>* out,
                                   const CancelledFn& cancelled) {
  auto op = std::make_shared<Op>();
  op->run = [&] { return backend_->ExportKvBlock(block, out); };
  return Submit(op, &cancelled);
}

absl::Status StepLoop::ImportBlock(int32_t block, absl::Span<const uint8_t> data,
                                   const CancelledFn& cancelled) {
  auto op = std::make_shared<Op>();
  op->run = [&] {
    absl::Status st = backend_->ImportKvBlock(block, data);
    // The draft model's entries of the block are of whatever it held before.
    if (draft_ != nullptr) draft_->Invalidate(block);
    return st;
  };
  return Submit(op, &cancelled);
}

absl::Status StepLoop::ExportCheckpoint(int32_t checkpoint, int64_t position,
                                        std::vector<uint8_t>* out, const CancelledFn& cancelled) {
  auto op = std::make_shared<Op>();
  op->run = [&] { return backend_->ExportStateCheckpoint(checkpoint, position, out); };
  return Submit(op, &cancelled);
}

absl::Status StepLoop::ImportCheckpoint(int32_t checkpoint, int64_t position,
                                        absl::Span<const uint8_t> data,
                                        const CancelledFn& cancelled) {
  auto op = std::make_shared<Op>();
  op->run = [&] { return backend_->ImportStateCheckpoint(checkpoint, position, data); };
  return Submit(op, &cancelled);
}

}  // namespace ringlane::worker
