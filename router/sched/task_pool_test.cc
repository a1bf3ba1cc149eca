#include "router/sched/task_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

TEST(TaskPoolTest, EveryIterationRunsOnceWhateverTheThreads) {
  for (int threads : {1, 2, 4}) {
    TaskPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{100}}) {
      for (int repeat = 0; repeat < 20; ++repeat) {
        std::vector<std::atomic<int>> runs(n);
        pool.ParallelFor(n, [&](size_t i) { runs[i].fetch_add(1); });
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << threads << " " << n;
      }
    }
  }
}

TEST(TaskPoolTest, SlowIterationsSpreadOverTheThreads) {
  TaskPool pool(3);
  std::atomic<int> running{0}, most{0};
  pool.ParallelFor(6, [&](size_t) {
    const int now = running.fetch_add(1) + 1;
    int m = most.load();
    while (now > m && !most.compare_exchange_weak(m, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    running.fetch_sub(1);
  });
  // Not a timing assertion: 30 ms sleeps overlap on any scheduler.
  EXPECT_GE(most.load(), 2);
}

TEST(TaskPoolTest, CallersOnSeveralThreadsTakeTurns) {
  TaskPool pool(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) pool.ParallelFor(7, [&](size_t) { total.fetch_add(1); });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 7);
}

}  // namespace
}  // namespace ringlane::router
