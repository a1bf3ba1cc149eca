// Real Gloo over loopback between real processes: each rank is a forked child
// that reports through its exit status.
#include "worker/collectives/communicator.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/processes.h"
#include "worker/collectives/collectives_testing.h"

namespace ringlane::worker {
namespace {

using testing::FreshDir;
using testing::Value;

class GlooTest : public ::testing::TestWithParam<int> {};

// The sum of each element is the rank-order sum, bit for bit, for every
// message size: an element's result never depends on how long the buffer is.
TEST_P(GlooTest, AllReduceIsRankOrderForEverySize) {
  const int n = GetParam();
  const std::string dir = FreshDir("allreduce" + std::to_string(n));
  bool ok = testing::RunInChildren(n, [&](int rank) {
    auto comm = CreateGlooCommunicator({.rank = rank, .world_size = n, .file_store_dir = dir});
    if (!comm.ok()) return 2;
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096}, size_t{100003}}) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = Value(rank, i);
      if (!(*comm)->AllReduceSum(data.data(), count).ok()) return 3;
      for (size_t i = 0; i < count; ++i) {
        float want = Value(0, i);
        for (int r = 1; r < n; ++r) want = want + Value(r, i);
        if (std::memcmp(&want, &data[i], sizeof(float)) != 0) return 4;
      }
    }
    std::vector<float> b(5, static_cast<float>(rank));
    if (!(*comm)->Broadcast(b.data(), b.size(), n - 1).ok()) return 5;
    for (float v : b)
      if (v != static_cast<float>(n - 1)) return 6;
    if (!(*comm)->Barrier().ok()) return 7;
    return 0;
  });
  EXPECT_TRUE(ok);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooTest, ::testing::Values(2, 4));

TEST(SingleRank, IsANoOp) {
  auto c = CreateSingleRankCommunicator();
  std::vector<float> v = {1, 2, 3}, out(3);
  EXPECT_TRUE(c->AllReduceSum(v.data(), 3).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(c->AllGather(v.data(), 3, out.data()).ok());
  EXPECT_EQ(out, v);
  EXPECT_EQ(c->Broadcast(v.data(), 3, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SumInRankOrder, AddsLeftToRight) {
  // (1 + 1e8) + -1e8 is 0 in float, 1 + (1e8 + -1e8) is 1: left to right.
  const float parts[3] = {1.0f, 1e8f, -1e8f};
  float out;
  SumInRankOrder(parts, 3, 1, &out);
  EXPECT_EQ(out, 0.0f);
}

TEST(Gloo, BadRankIsInvalidArgument) {
  EXPECT_EQ(CreateGlooCommunicator({.rank = 3, .world_size = 2, .file_store_dir = "/tmp"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringlane::worker
