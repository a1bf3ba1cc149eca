// A persistent pool of worker threads for data-parallel loops inside one
// engine step. Several ranks may share two cores, so idle workers spin only
// briefly for the next loop and then block on a condition variable.
//
// Owned by the backend's step thread, which is the only caller of ParallelFor;
// ParallelFor is not reentrant and not safe to call from two threads at once.
#ifndef RINGLANE_WORKER_THREAD_POOL_H_
#define RINGLANE_WORKER_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ringlane::worker {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread, so 1 means no extra threads.
  // `spin_us` is how long an idle worker polls before it blocks.
  explicit ThreadPool(int num_threads, int spin_us = 50);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task, thread) for every task in [0, num_tasks), spread over the
  // pool (the caller works too); returns when all are done. Tasks are handed
  // out dynamically, so fn must not depend on which thread runs a task.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t task, int thread)>& fn);

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  const int num_threads_;
  const int spin_us_;
  std::vector<std::thread> threads_;

  // The current job. Written by the caller before bumping generation_.
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> active_{0};  // workers still inside the current job

  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;       // workers wait here for a new job
  std::condition_variable done_cv_;  // the caller waits here for the job's end
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_THREAD_POOL_H_
