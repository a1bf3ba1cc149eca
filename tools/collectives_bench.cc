// ringlane-collectives-bench: what the batch-invariant all-reduce costs.
// Forks --ranks processes that meet over Gloo/TCP on loopback and time, side
// by side for each message size, ringlane's AllReduceSum (all-gather, then a
// local sum in rank order) against Gloo's ring all-reduce (whose summation
// order depends on the message size).
//
//   ringlane-collectives-bench --ranks=2
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_context.h"

ABSL_FLAG(int, ranks, 2, "processes in the group (2 to 16)");
ABSL_FLAG(int, iterations, 200, "timed all-reduces per size and method");

namespace {

using Clock = std::chrono::steady_clock;
namespace rw = ringlane::worker;

int RunRank(int rank, int ranks, const std::string& dir, int iters) {
  rw::GlooOptions o{.rank = rank, .world_size = ranks, .file_store_dir = dir + "/a"};
  auto comm = rw::CreateGlooCommunicator(o);
  o.file_store_dir = dir + "/b";
  auto ctx = rw::ConnectGloo(o);
  if (!comm.ok() || !ctx.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 std::string((comm.ok() ? ctx.status() : comm.status()).message()).c_str());
    return 2;
  }
  if (rank == 0) {
    std::printf("| floats (hidden x rows) | ringlane rank-order us | gloo ring us | ratio |\n");
    std::printf("|---:|---:|---:|---:|\n");
  }
  uint32_t tag = 1000;
  for (int rows : {1, 5, 64, 512}) {
    const size_t n = size_t{2048} * rows;
    std::vector<float> data(n, 1.0f + rank);
    double ours = 1e30, ring = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto a = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (!(*comm)->AllReduceSum(data.data(), n).ok()) return 3;
      }
      ours = std::min(ours,
                      std::chrono::duration<double, std::micro>(Clock::now() - a).count() / iters);
      a = Clock::now();
      for (int i = 0; i < iters; ++i) {
        gloo::AllreduceOptions opts(*ctx);
        opts.setOutput(data.data(), n);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(tag++);
        gloo::allreduce(opts);
      }
      ring = std::min(ring,
                      std::chrono::duration<double, std::micro>(Clock::now() - a).count() / iters);
    }
    if (rank == 0) {
      std::printf("| %zu (2048 x %d) | %.1f | %.1f | %.2fx |\n", n, rows, ours, ring, ours / ring);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int iters = absl::GetFlag(FLAGS_iterations);
  if (ranks < 2 || ranks > 16 || iters < 1) {
    std::fprintf(stderr, "error: --ranks must be in [2, 16] and --iterations positive\n");
    return 2;
  }
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("rl_collectives_bench_" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/b");
  std::fprintf(stderr, "[bench] %d ranks on loopback, %d iterations per size\n", ranks, iters);
  std::vector<pid_t> kids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(r, ranks, dir, iters));
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
