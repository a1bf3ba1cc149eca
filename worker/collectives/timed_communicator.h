// A Communicator that forwards to another and adds up the wall time spent in
// its calls, so a round can report its time in collectives (waiting for the
// slowest rank included) apart from compute.
#ifndef RINGLANE_WORKER_COLLECTIVES_TIMED_COMMUNICATOR_H_
#define RINGLANE_WORKER_COLLECTIVES_TIMED_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "worker/collectives/communicator.h"

namespace ringlane::worker {

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return inner_->name(); }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Timed([&] { return inner_->AllReduceSum(data, count); });
  }
  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Timed([&] { return inner_->AllGather(in, count, out); });
  }
  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Timed([&] { return inner_->Broadcast(data, count, root); });
  }
  absl::Status Barrier() override {
    return Timed([&] { return inner_->Barrier(); });
  }

  // Microseconds spent in collectives since the last call.
  int64_t TakeElapsedUs() {
    int64_t us = elapsed_ns_ / 1000;
    elapsed_ns_ = 0;
    return us;
  }

 private:
  template <typename F>
  absl::Status Timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = f();
    elapsed_ns_ +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    return st;
  }

  std::unique_ptr<Communicator> inner_;
  int64_t elapsed_ns_ = 0;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_TIMED_COMMUNICATOR_H_
