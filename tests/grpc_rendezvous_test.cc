// A Gloo group meeting through the gRPC Rendezvous service, all real
// processes: the service in one forked child, each rank in another (this
// parent never starts gRPC, so no child inherits its threads).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/processes.h"
#include "worker/collectives/communicator.h"
#include "worker/rendezvous/rendezvous.h"

namespace ringlane {
namespace {

// Forks the Rendezvous service on a free port; returns (pid, port).
std::pair<pid_t, int> StartService() {
  int fds[2];
  if (pipe(fds) != 0) return {-1, 0};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    worker::RendezvousService service;
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    auto server = b.BuildAndStart();
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    server->Wait();  // until the parent kills it
    _exit(0);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) port = 0;
  close(fds[0]);
  return {pid, port};
}

bool RunRanks(const std::vector<int>& ranks, int world, int port, std::chrono::milliseconds timeout,
              int (*check)(absl::StatusOr<std::unique_ptr<worker::Communicator>>&, int)) {
  return testing::RunInChildren(static_cast<int>(ranks.size()), [&](int i) {
    const int r = ranks[i];
    auto comm =
        worker::CreateGlooCommunicator({.rank = r,
                                        .world_size = world,
                                        .timeout = timeout,
                                        .rendezvous_address = "127.0.0.1:" + std::to_string(port),
                                        .group = "test-group"});
    return check(comm, r);
  });
}

TEST(GrpcRendezvous, ThreeRanksMeetAndReduce) {
  auto [server, port] = StartService();
  ASSERT_GT(port, 0);
  bool ok = RunRanks({0, 1, 2}, 3, port, std::chrono::seconds(30), [](auto& comm, int rank) {
    if (!comm.ok()) return 2;
    std::vector<float> v(1000, static_cast<float>(rank + 1));
    if (!(*comm)->AllReduceSum(v.data(), v.size()).ok()) return 3;
    for (float x : v)
      if (x != 6.0f) return 4;
    return 0;
  });
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  EXPECT_TRUE(ok);
}

// Rank 1 never comes: rank 0 fails within its timeout, saying why.
TEST(GrpcRendezvous, AbsentPeerFailsWithTimeout) {
  auto [server, port] = StartService();
  ASSERT_GT(port, 0);
  bool ok = RunRanks({0}, 2, port, std::chrono::milliseconds(1500), [](auto& comm, int) {
    if (comm.ok()) return 2;
    if (comm.status().code() != absl::StatusCode::kUnavailable) return 3;
    if (std::string(comm.status().message()).find("never arrived") == std::string::npos) {
      std::fprintf(stderr, "%s\n", std::string(comm.status().message()).c_str());
      return 4;
    }
    return 0;
  });
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace ringlane
