#include "worker/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RL_CPU_RELAX() asm volatile("yield")
#else
#define RL_CPU_RELAX() \
  do {                 \
  } while (0)
#endif

namespace ringlane::worker {

ThreadPool::ThreadPool(int num_threads, int spin_us)
    : num_threads_(num_threads < 1 ? 1 : num_threads), spin_us_(spin_us) {
  for (int t = 1; t < num_threads_; ++t) threads_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    (*fn_)(task, thread);
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks,
                             const std::function<void(int64_t task, int thread)>& fn) {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i, 0);
    return;
  }
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  active_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the job fields before the generation bump for workers
    // that are about to block; spinning workers see them through the
    // release/acquire pair on generation_.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  RunTasks(0);
  // Spin briefly for the stragglers, then block: when ranks share cores a
  // worker may be descheduled mid-task, and spinning would steal its core.
  auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  while (active_.load(std::memory_order_acquire) != 0 &&
         std::chrono::steady_clock::now() < spin_until) {
    for (int i = 0; i < 16; ++i) RL_CPU_RELAX();
  }
  if (active_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      while ((gen = generation_.load(std::memory_order_acquire)) == seen &&
             std::chrono::steady_clock::now() < spin_until) {
        for (int i = 0; i < 64; ++i) RL_CPU_RELAX();
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        gen = generation_.load(std::memory_order_acquire);
      }
    }
    seen = gen;
    if (stop_.load()) return;
    RunTasks(thread);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Last one out wakes the caller if it has stopped spinning; taking the
      // lock orders this with the caller's check-then-wait.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace ringlane::worker
