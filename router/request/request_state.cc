#include "router/request/request_state.h"

#include <utility>

namespace ringlane::router {

namespace v1 = ringlane::v1;

void ResponseQueue::Push(v1::GenerateResponse msg) {
  {
    absl::MutexLock l(&mu_);
    if (done_) return;
    msgs_.push_back(std::move(msg));
  }
  if (notifier_) notifier_->Notify();
}

void ResponseQueue::Finish(absl::Status status) {
  {
    absl::MutexLock l(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }
  if (notifier_) notifier_->Notify();
}

bool ResponseQueue::finished() const {
  absl::MutexLock l(&mu_);
  return done_;
}

bool ResponseQueue::Take(absl::Duration timeout, std::vector<v1::GenerateResponse>* out,
                         absl::Status* status) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !msgs_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  while (!msgs_.empty()) {
    out->push_back(std::move(msgs_.front()));
    msgs_.pop_front();
  }
  if (done_) *status = status_;
  return done_;
}

void RequestState::Fail(absl::Status status) {
  if (failed) return;
  failed = true;
  Account(queue->cancelled() ? &GroupMetrics::requests_cancelled : &GroupMetrics::requests_failed);
  queue->Finish(std::move(status));
}

void RequestState::Account(prometheus::Counter* GroupMetrics::*outcome) {
  if (accounted || metrics == nullptr) return;
  accounted = true;
  (metrics->*outcome)->Increment();
  metrics->e2e_request_latency_s->Observe(Seconds(Clock::now() - submitted));
}

}  // namespace ringlane::router
