// NCCL behind the Communicator interface. Every case runs in forked children:
// neither CUDA nor gRPC survives a fork, so the test process itself never
// touches them, and ranks are processes as in a deployment. Children report
// through their exit status and say why on stderr.
//
// Without a GPU (no driver, as on the build machines) the unique-id exchange
// and the "no CUDA device" error still run; the device cases skip.
#include "worker/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cfloat>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/processes.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/nccl/rank_order_sum.h"
#include "worker/rendezvous/rendezvous.h"

namespace ringlane::worker {
namespace {

// The number of CUDA devices, asked in a child so that this process never
// initializes CUDA; 0 when the runtime fails (no driver).
int DeviceCount() {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/rl_nccl_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int Report(const absl::Status& st, int code) {
  std::cerr << "child: " << st << "\n";
  return code;
}

// Values whose sum depends on the order of addition.
float Value(int rank, size_t i) {
  const float big[4] = {1e8f, 1.0f, -1e8f, 3.0f};
  return big[(rank + i) % 4] * (1.0f + 0.001f * static_cast<float>(i % 13)) + 0.37f * rank;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Device buffers for the children; frees on exit from the child's body.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) { ok = cudaMalloc(&ptr, n * sizeof(float)) == cudaSuccess; }
  ~DeviceFloats() { cudaFree(ptr); }
  bool Put(const std::vector<float>& v) {
    return cudaMemcpy(ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice) ==
           cudaSuccess;
  }
  std::vector<float> Get(size_t n) const {
    std::vector<float> v(n);
    if (cudaMemcpy(v.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      v.clear();
    }
    return v;
  }
  float* ptr = nullptr;
  bool ok = false;
};

TEST(NcclUniqueId, ReachesEveryRankThroughTheGrpcRendezvous) {
  ASSERT_TRUE(NcclAvailable());
  EXPECT_TRUE(testing::RunInChildren(1, [](int) {
    RendezvousService service;
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    if (server == nullptr) return 2;
    const std::string address = "127.0.0.1:" + std::to_string(port);

    constexpr int kRanks = 3;
    std::vector<absl::StatusOr<std::string>> ids(kRanks, absl::UnknownError("not run"));
    std::vector<std::thread> ranks;
    // The others start first, so their Get has to wait for rank 0's Set.
    for (int r = kRanks - 1; r >= 0; --r) {
      ranks.emplace_back([&, r] {
        ids[r] = ExchangeNcclUniqueId({.rank = r,
                                       .world_size = kRanks,
                                       .rendezvous_address = address,
                                       .group = "tp-epoch-1",
                                       .timeout = std::chrono::seconds(10)});
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < kRanks; ++r) {
      if (!ids[r].ok()) return Report(ids[r].status(), 3);
      if (ids[r]->size() != 128 || *ids[r] != *ids[0]) return 4;
    }

    // A rank whose rank 0 never comes says so once its timeout passes.
    absl::StatusOr<std::string> lonely =
        ExchangeNcclUniqueId({.rank = 1,
                              .world_size = 2,
                              .rendezvous_address = address,
                              .group = "tp-epoch-2",
                              .timeout = std::chrono::milliseconds(200)});
    if (lonely.status().code() != absl::StatusCode::kUnavailable ||
        lonely.status().message().find("never arrived") == std::string::npos) {
      return Report(lonely.status(), 5);
    }
    server->Shutdown();
    return 0;
  }));
}

TEST(NcclUniqueId, ReachesEveryRankThroughADirectory) {
  const std::string dir = FreshDir("id");
  EXPECT_TRUE(testing::RunInChildren(1, [&](int) {
    std::vector<absl::StatusOr<std::string>> ids(2, absl::UnknownError("not run"));
    std::thread other([&] {
      ids[1] = ExchangeNcclUniqueId({.rank = 1, .world_size = 2, .file_store_dir = dir});
    });
    ids[0] = ExchangeNcclUniqueId({.rank = 0, .world_size = 2, .file_store_dir = dir});
    other.join();
    for (auto& id : ids) {
      if (!id.ok()) return Report(id.status(), 2);
    }
    return ids[0]->size() == 128 && *ids[0] == *ids[1] ? 0 : 3;
  }));
}

TEST(NcclCommunicator, BadGroupIsInvalidArgument) {
  EXPECT_EQ(CreateNcclCommunicator({.rank = 2, .world_size = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator({.rank = 0, .world_size = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommunicator, NoDeviceIsFailedPrecondition) {
  if (DeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_TRUE(testing::RunInChildren(1, [](int) {
    auto comm = CreateNcclCommunicator({});
    if (comm.status().code() != absl::StatusCode::kFailedPrecondition ||
        comm.status().message().find("no CUDA device") == std::string::npos) {
      return Report(comm.status(), 2);
    }
    return 0;
  }));
}

// The kernel alone, with more parts than there are GPUs: its sum has the
// bits of SumInRankOrder, subnormals included.
TEST(RankOrderSum, EqualsTheHostSumBitForBit) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(testing::RunInChildren(1, [](int) {
    constexpr int kParts = 4;
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096}, size_t{100003}, size_t{1} << 21}) {
      std::vector<float> parts(kParts * count);
      for (int r = 0; r < kParts; ++r) {
        for (size_t i = 0; i < count; ++i) {
          // Every 5th element subnormal: a flush to zero would show.
          parts[r * count + i] = i % 5 == 0 ? FLT_MIN / (2 + r) : Value(r, i);
        }
      }
      std::vector<float> want(count);
      SumInRankOrder(parts.data(), kParts, count, want.data());
      DeviceFloats d_parts(parts.size()), d_out(count);
      if (!d_parts.ok || !d_out.ok || !d_parts.Put(parts)) return 2;
      if (LaunchRankOrderSum(d_parts.ptr, kParts, count, d_out.ptr, nullptr) != cudaSuccess) {
        return 3;
      }
      if (cudaDeviceSynchronize() != cudaSuccess) return 4;
      if (!SameBits(d_out.Get(count), want)) return 5;
    }
    return 0;
  }));
}

TEST(NcclCommunicator, OneRankRunsEveryCollective) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(testing::RunInChildren(1, [](int) {
    auto comm = CreateNcclCommunicator({.timeout = std::chrono::seconds(60)});
    if (!comm.ok()) return Report(comm.status(), 2);
    const size_t count = 4099;
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = Value(0, i);
    DeviceFloats d(count), gathered(count);
    if (!d.ok || !gathered.ok || !d.Put(v)) return 3;
    if (absl::Status st = (*comm)->AllReduceSum(d.ptr, count); !st.ok()) return Report(st, 4);
    if (!SameBits(d.Get(count), v)) return 5;
    if (absl::Status st = (*comm)->AllGather(d.ptr, count, gathered.ptr); !st.ok()) {
      return Report(st, 6);
    }
    if (!SameBits(gathered.Get(count), v)) return 7;
    if (absl::Status st = (*comm)->Broadcast(d.ptr, count, 0); !st.ok()) return Report(st, 8);
    if ((*comm)->Broadcast(d.ptr, count, 1).code() != absl::StatusCode::kInvalidArgument) return 9;
    if (absl::Status st = (*comm)->Barrier(); !st.ok()) return Report(st, 10);
    return 0;
  }));
}

// Two ranks as two processes, each on device rank % device count. NCCL
// refuses two ranks of one communicator on the same GPU, so this needs two.
TEST(NcclCommunicator, TwoRanksSumInRankOrderGatherAndBroadcast) {
  const int devices = DeviceCount();
  if (devices < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (NCCL puts each rank on its own GPU); found " << devices;
  }
  constexpr int kRanks = 2;
  const std::string dir = FreshDir("two");
  EXPECT_TRUE(testing::RunInChildren(kRanks, [&](int rank) {
    auto comm = CreateNcclCommunicator({.rank = rank,
                                        .world_size = kRanks,
                                        .group = "two",
                                        .timeout = std::chrono::seconds(60),
                                        .file_store_dir = dir});
    if (!comm.ok()) return Report(comm.status(), 2);
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096}, size_t{100003}}) {
      std::vector<float> mine(count), all(kRanks * count), want(count);
      for (int r = 0; r < kRanks; ++r) {
        for (size_t i = 0; i < count; ++i) all[r * count + i] = Value(r, i);
      }
      std::copy(all.begin() + rank * count, all.begin() + (rank + 1) * count, mine.begin());
      SumInRankOrder(all.data(), kRanks, count, want.data());

      DeviceFloats d(count), gathered(kRanks * count);
      if (!d.ok || !gathered.ok || !d.Put(mine)) return 3;
      if (absl::Status st = (*comm)->AllGather(d.ptr, count, gathered.ptr); !st.ok()) {
        return Report(st, 4);
      }
      if (!SameBits(gathered.Get(kRanks * count), all)) return 5;
      if (absl::Status st = (*comm)->AllReduceSum(d.ptr, count); !st.ok()) return Report(st, 6);
      if (!SameBits(d.Get(count), want)) return 7;

      std::vector<float> own(count, static_cast<float>(rank));
      if (!d.Put(own)) return 8;
      if (absl::Status st = (*comm)->Broadcast(d.ptr, count, kRanks - 1); !st.ok()) {
        return Report(st, 9);
      }
      if (!SameBits(d.Get(count), std::vector<float>(count, kRanks - 1.0f))) return 10;
    }
    if (absl::Status st = (*comm)->Barrier(); !st.ok()) return Report(st, 11);
    return 0;
  }));
}

}  // namespace
}  // namespace ringlane::worker
