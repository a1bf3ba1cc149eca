// A fixed set of threads that runs the iterations of one loop at a time,
// for work the group's thread would otherwise do alone (token masks of
// grammar-constrained lanes). The caller runs iterations too and returns
// when all are done, so results are as if the loop ran in order whenever
// the iterations are independent.
#ifndef RINGLANE_ROUTER_SCHED_TASK_POOL_H_
#define RINGLANE_ROUTER_SCHED_TASK_POOL_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ringlane::router {

class TaskPool {
 public:
  // `threads` runners in all, the caller included (1: no helper threads).
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // fn(0) .. fn(n - 1), in any order and on any runner; one call at a time.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

 private:
  void Help();
  // Runs iterations of the current loop until none is left to take.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex call_mu_;  // one ParallelFor at a time
  absl::Mutex mu_;
  const std::function<void(size_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t n_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_TASK_POOL_H_
