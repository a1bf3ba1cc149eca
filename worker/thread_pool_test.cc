#include "worker/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads, /*spin_us=*/threads == 4 ? 0 : 50);
    for (int round = 0; round < 200; ++round) {
      const int n = 1 + round % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t t, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[t].fetch_add(1);
      });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << round;
    }
  }
}

TEST(ThreadPool, ZeroTasksIsANoOp) {
  ThreadPool pool(2);
  bool ran = false;
  pool.ParallelFor(0, [&](int64_t, int) { ran = true; });
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace ringlane::worker
