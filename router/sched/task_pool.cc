#include "router/sched/task_pool.h"

namespace ringlane::router {

TaskPool::TaskPool(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { Help(); });
}

TaskPool::~TaskPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

void TaskPool::Drain() {
  while (fn_ != nullptr && next_ < n_) {
    const size_t i = next_++;
    const std::function<void(size_t)>* fn = fn_;
    mu_.Unlock();
    (*fn)(i);
    mu_.Lock();
    ++done_;
  }
}

void TaskPool::Help() {
  absl::MutexLock l(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](TaskPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return p->stop_ || (p->fn_ != nullptr && p->next_ < p->n_);
        },
        this));
    if (stop_) return;
    Drain();
  }
}

void TaskPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (helpers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock call(&call_mu_);
  absl::MutexLock l(&mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  done_ = 0;
  Drain();
  mu_.Await(absl::Condition(
      +[](TaskPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->done_ == p->n_; }, this));
  fn_ = nullptr;
}

}  // namespace ringlane::router
