// The Gloo transport choice (GlooOptions::transport) and the registered-buffer
// algorithms that the ibverbs transport runs, exercised here over TCP. Ranks
// are forked children reporting through their exit status, as in
// communicator_test.cc.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "services/log.h"
#include "tests/support/processes.h"
#include "worker/collectives/collectives_testing.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_context.h"

namespace ringlane::worker {
namespace {

using testing::FreshDir;
using testing::Value;

// Runs the collectives over `n` ranks and checks every result bit for bit;
// 0 when all hold, else the number of the failed check.
int CheckCollectives(Communicator& comm, int n, const std::vector<size_t>& counts) {
  const int rank = comm.rank();
  for (size_t count : counts) {
    std::vector<float> data(count), gathered(count * n);
    for (size_t i = 0; i < count; ++i) data[i] = Value(rank, i);
    if (!comm.AllGather(data.data(), count, gathered.data()).ok()) return 10;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        if (gathered[r * count + i] != Value(r, i)) return 11;
      }
    }
    if (!comm.AllReduceSum(data.data(), count).ok()) return 12;
    for (size_t i = 0; i < count; ++i) {
      float want = Value(0, i);
      for (int r = 1; r < n; ++r) want = want + Value(r, i);
      if (std::memcmp(&want, &data[i], sizeof(float)) != 0) return 13;
    }
    const int root = static_cast<int>(count % n);
    std::vector<float> b(count, static_cast<float>(rank));
    if (!comm.Broadcast(b.data(), count, root).ok()) return 14;
    for (float v : b) {
      if (v != static_cast<float>(root)) return 15;
    }
  }
  return comm.Barrier().ok() ? 0 : 16;
}

std::vector<std::string>* captured = nullptr;
void Capture(std::string_view line) { captured->emplace_back(line); }

TEST(GlooTransport, AutoWithoutRdmaIsTcpSaidOnce) {
  if (!RdmaDeviceNames().empty()) GTEST_SKIP() << "this machine has RDMA devices";
  // In a child: the line is once per process, and this one may have said it.
  EXPECT_TRUE(testing::RunInChildren(1, [](int) {
    std::vector<std::string> lines;
    captured = &lines;
    services::SetLogSinkForTesting(&Capture);
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<GlooTransport> t = ResolveGlooTransport({});
      if (!t.ok() || *t != GlooTransport::kTcp) return 2;
    }
    services::SetLogSinkForTesting(nullptr);
    if (lines.size() != 1 || lines[0].find("Gloo uses TCP") == std::string::npos) {
      for (const std::string& l : lines) std::cerr << "logged: " << l;
      return 3;
    }
    return 0;
  }));
}

TEST(GlooTransport, AutoConnectsTwoRanksOverTcp) {
  if (!RdmaDeviceNames().empty()) GTEST_SKIP() << "this machine has RDMA devices";
  const std::string dir = FreshDir("auto");
  EXPECT_TRUE(testing::RunInChildren(2, [&](int rank) {
    auto comm = CreateGlooCommunicator(
        {.rank = rank, .world_size = 2, .file_store_dir = dir, .transport = "auto"});
    if (!comm.ok()) return 2;
    if ((*comm)->name().find("gloo-tcp") != 0) return 3;
    return CheckCollectives(**comm, 2, {1, 7, 4096});
  }));
}

TEST(GlooTransport, ForcedIbverbsWithoutADeviceFailsClearly) {
  if (!RdmaDeviceNames().empty()) GTEST_SKIP() << "this machine has RDMA devices";
  auto comm = CreateGlooCommunicator(
      {.rank = 0, .world_size = 2, .file_store_dir = "/nonexistent", .transport = "ibverbs"});
  ASSERT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_NE(comm.status().message().find("'ibverbs' requested, but"), std::string::npos)
      << comm.status();
}

TEST(GlooTransport, UnknownNameIsInvalidArgument) {
  EXPECT_EQ(ResolveGlooTransport({.transport = "udp"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ResolveGlooTransport({.transport = "tcp"}), GlooTransport::kTcp);
}

// What ibverbs runs (AllgatherRing, BroadcastOneToAll, BarrierAllToAll over
// staging buffers kept per shape), over TCP. More shapes than the cache keeps
// make it drop everything mid-run, on every rank at the same call.
class BoundBuffersTest : public ::testing::TestWithParam<int> {};

TEST_P(BoundBuffersTest, MatchTheRankOrderDefinition) {
  const int n = GetParam();
  const std::string dir = FreshDir("bound" + std::to_string(n));
  std::vector<size_t> counts = {1, 7, 4096, 100003, 7, 1, 4096};
  for (size_t c = 2; c < 40; ++c) counts.push_back(c);
  counts.push_back(100003);
  EXPECT_TRUE(testing::RunInChildren(n, [&](int rank) {
    auto comm = CreateGlooCommunicator({.rank = rank,
                                        .world_size = n,
                                        .file_store_dir = dir,
                                        .transport = "tcp",
                                        .bound_buffers_for_testing = true});
    if (!comm.ok()) return 2;
    return CheckCollectives(**comm, n, counts);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, BoundBuffersTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace ringlane::worker
