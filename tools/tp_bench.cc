// ringlane-tp-bench: decode tokens/s of one model at TP1 (one process, N
// threads) against TPn (n processes, one thread each, Gloo over loopback),
// measured side by side in one run and repeated A/B so that drift of a shared
// machine shows. Also reports the time each TPn rank spent inside collectives
// per token (waiting for the slowest rank included).
//
//   ringlane-tp-bench --model=build/models/synth-1b1-fp8 --tp=2
//
// Ranks are forked before anything starts a thread; each loads the model
// itself (mmap) and keeps only its shard.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "worker/backend/backend.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/timed_communicator.h"
#include "worker/model/model.h"
#include "worker/model/resident.h"
#include "worker/model/shard.h"

ABSL_FLAG(std::string, model, "", "model to benchmark (HF directory or llama2.c .bin)");
ABSL_FLAG(int, tp, 2, "tensor-parallel degree of the sharded run");
ABSL_FLAG(int, tp1_threads, 2, "threads of the single-process run");
ABSL_FLAG(int, steps, 24, "decode steps timed per measurement");
ABSL_FLAG(int, prompt, 32, "prompt tokens prefilled before decoding");
ABSL_FLAG(int, repeats, 2, "A/B repetitions");
ABSL_FLAG(std::string, transport, "tcp", "Gloo transport for the sharded run");
ABSL_FLAG(std::string, tcp_wait, "blocking", "how TCP ranks wait: async, blocking or busy_poll");

namespace {

namespace rw = ringlane::worker;
using Clock = std::chrono::steady_clock;

struct Result {
  double tok_s = 0;
  double coll_ms_per_tok = 0;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "ringlane-tp-bench: error: %s\n", msg.c_str());
  std::exit(2);
}

// Runs one rank: prefill, warm up, then times decode steps. Returns tok/s and
// this rank's collective time per token.
Result RunRank(const std::string& path, int rank, int world, int threads, const std::string& dir,
               const std::string& transport) {
  auto full = rw::LoadModel(path);
  if (!full.ok()) Die(std::string(full.status().message()));
  std::shared_ptr<const rw::ModelWeights> model(std::move(*full));
  std::unique_ptr<rw::TimedCommunicator> comm;
  if (world > 1) {
    auto s = rw::ShardModel(model, rank, world);
    if (!s.ok()) Die(std::string(s.status().message()));
    model = *s;
    rw::GlooOptions g;
    g.rank = rank;
    g.world_size = world;
    g.file_store_dir = dir;
    g.transport = transport;
    g.tcp_wait = absl::GetFlag(FLAGS_tcp_wait);
    auto c = rw::CreateGlooCommunicator(g);
    if (!c.ok()) Die(std::string(c.status().message()));
    comm = std::make_unique<rw::TimedCommunicator>(std::move(*c));
  }
  // As the worker does by default (--huge_page_weights).
  auto resident = rw::MakeResident(model);
  if (!resident.ok()) Die(std::string(resident.status().message()));
  model = *resident;
  rw::CpuBackendOptions opt;
  opt.threads = threads;
  opt.comm = comm.get();
  absl::StatusOr<std::unique_ptr<rw::Backend>> made = rw::CreateCpuBackend(model, opt);
  if (!made.ok()) Die(std::string(made.status().message()));
  std::unique_ptr<rw::Backend> backend = std::move(*made);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int prompt = absl::GetFlag(FLAGS_prompt);
  const int bs = 16;
  const int total = prompt + steps + 8;
  const int blocks = (total + bs - 1) / bs;
  if (absl::Status st = backend->AllocateKvPool({blocks, bs, rw::DType::kBF16}); !st.ok()) {
    Die(std::string(st.message()));
  }
  const int vocab = model->config.vocab;
  rw::SeqStep seq;
  for (int b = 0; b < blocks; ++b) seq.block_ids.push_back(b);
  int64_t pos = 0;
  auto step = [&](int n) {
    rw::RoundInput in;
    seq.start_position = pos;
    seq.tokens.clear();
    for (int i = 0; i < n; ++i) seq.tokens.push_back(static_cast<int32_t>((pos + i) * 7 % vocab));
    seq.logit_offsets = {n - 1};
    in.seqs = {seq};
    auto out = backend->Step(in);
    if (!out.ok()) Die(std::string(out.status().message()));
    pos += n;
  };
  step(prompt);
  for (int i = 0; i < 4; ++i) step(1);  // warm: page in, settle the pools
  if (comm) {
    if (!comm->Barrier().ok()) Die("barrier");
    comm->TakeElapsedUs();
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step(1);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  Result r;
  r.tok_s = steps / s;
  if (comm) r.coll_ms_per_tok = comm->TakeElapsedUs() / 1000.0 / steps;
  return r;
}

// Forks `world` ranks and collects each one's Result through a pipe.
std::vector<Result> RunGroup(const std::string& path, int world, int threads, int rep) {
  const std::string dir = absl::StrFormat("/tmp/ringlane-tp-bench-%d-%d-%d", getpid(), world, rep);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<int> fds;
  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (pipe(p) != 0) Die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      Result res = RunRank(path, r, world, threads, dir, absl::GetFlag(FLAGS_transport));
      (void)!write(p[1], &res, sizeof(res));
      _exit(0);
    }
    close(p[1]);
    fds.push_back(p[0]);
    kids.push_back(pid);
  }
  std::vector<Result> out(world);
  for (int r = 0; r < world; ++r) {
    if (read(fds[r], &out[r], sizeof(Result)) != sizeof(Result)) Die("a rank failed");
    close(fds[r]);
  }
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Decode tokens/s at TP1 against TPn on this machine.");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty() || !std::filesystem::exists(path)) Die("--model must name a model");
  const int tp = absl::GetFlag(FLAGS_tp);
  if (tp < 2 || tp > 16) Die("--tp must be in [2, 16]");
  const int t1 = absl::GetFlag(FLAGS_tp1_threads);
  if (t1 < 1 || t1 > 256) Die("--tp1_threads must be in [1, 256]");
  if (absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_prompt) < 1) {
    Die("--steps and --prompt must be positive");
  }
  std::printf("%-28s %10s %22s\n", "run", "decode tok/s", "collectives ms/token");
  double sum1 = 0, sumn = 0;
  const int reps = absl::GetFlag(FLAGS_repeats);
  for (int rep = 0; rep < reps; ++rep) {
    std::fprintf(stderr, "[tp-bench] repeat %d/%d: TP1 x%d threads\n", rep + 1, reps, t1);
    Result a = RunGroup(path, 1, t1, rep)[0];
    std::printf("%-28s %10.2f %22s\n", absl::StrFormat("TP1, %d threads", t1).c_str(), a.tok_s,
                "-");
    std::fprintf(stderr, "[tp-bench] repeat %d/%d: TP%d x1 thread\n", rep + 1, reps, tp);
    std::vector<Result> b = RunGroup(path, tp, 1, rep);
    std::string coll;
    for (const Result& r : b)
      coll += absl::StrFormat("%s%.2f", coll.empty() ? "" : " / ", r.coll_ms_per_tok);
    std::printf("%-28s %10.2f %22s\n", absl::StrFormat("TP%d, %d processes x 1", tp, tp).c_str(),
                b[0].tok_s, coll.c_str());
    std::fflush(stdout);
    sum1 += a.tok_s;
    sumn += b[0].tok_s;
  }
  std::printf("TP%d / TP1 decode tok/s: %.2fx (mean of %d A/B pairs)\n", tp, sumn / sum1, reps);
  return 0;
}
