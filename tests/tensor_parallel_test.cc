// Tensor parallelism across real processes: each rank is a forked child with
// its shard of the model, meeting the others over Gloo/TCP on loopback.
//
// Tolerance: a sharded row-parallel layer adds its ranks' partial sums, which
// reorders float additions against TP1, so logits differ by rounding only.
// Measured on stories260K: max |TP2 - TP1| and |TP4 - TP1| about 1e-5 over
// every position of a golden sequence (logits are of order 10). The bound,
// 1e-3, stays under a quarter of the smallest gap between the two highest
// logits along the golden sequences (0.004), so greedy choices cannot flip,
// and a wrong shard (a misplaced head or column) gives errors of order 1.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/lane_runner.h"
#include "tests/support/processes.h"
#include "tests/support/synthetic_shapes.h"
#include "worker/collectives/communicator.h"
#include "worker/model/shard.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

using testing::SourcePath;

using Golden = testing::GoldenCase;

// Runs body(rank, comm) in `world` children; true when all exit with 0.
bool RunGroup(int world, const std::string& dir,
              const std::function<int(int, worker::Communicator*)>& body) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return testing::RunInChildren(world, [&](int r) {
    auto comm = worker::CreateGlooCommunicator({.rank = r,
                                                .world_size = world,
                                                .file_store_dir = dir,
                                                .timeout = std::chrono::seconds(60)});
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, std::string(comm.status().message()).c_str());
      return 10;
    }
    return body(r, comm->get());
  });
}

// How a group is run beyond its sharding: decode context parallel, and the
// DSA dense window (0: the model's default).
struct GroupMode {
  bool context_parallel = false;
  int dense_window = 0;
  int kv_blocks = 128;
};

absl::StatusOr<std::unique_ptr<worker::Backend>> ShardBackend(
    const std::string& model_path, int rank, int world, worker::Communicator* comm,
    worker::DType kv, const worker::ShardOptions& sharding = {}, const GroupMode& mode = {}) {
  auto full = worker::LoadModel(model_path);
  if (!full.ok()) return full.status();
  if (mode.dense_window > 0) (*full)->config.indexer.dense_window = mode.dense_window;
  auto shard = worker::ShardModel(std::shared_ptr<const worker::ModelWeights>(std::move(*full)),
                                  rank, world, sharding);
  if (!shard.ok()) return shard.status();
  worker::CpuBackendOptions opt;
  opt.comm = comm;
  opt.threads = 1;
  opt.context_parallel = mode.context_parallel;
  absl::StatusOr<std::unique_ptr<worker::Backend>> b = worker::CreateCpuBackend(*shard, opt);
  if (!b.ok()) return b.status();
  // State slots for a model with recurrent layers (ignored by the others).
  if (absl::Status st = (*b)->AllocateKvPool({mode.kv_blocks, 16, kv, 8}); !st.ok()) return st;
  return b;
}

void WriteFloats(const std::string& path, const std::vector<std::vector<float>>& rows) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& r : rows) f.write(reinterpret_cast<const char*>(r.data()), r.size() * 4);
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), v.size() * 4);
  return v;
}

// Max |a - b| between TP1 rows and a flat file of the same rows.
double MaxDiff(const std::vector<std::vector<float>>& ref, const std::vector<float>& got) {
  double m = 0;
  size_t at = 0;
  for (const auto& r : ref)
    for (float v : r) {
      if (at >= got.size()) return INFINITY;
      m = std::max(m, std::fabs(double(v) - got[at++]));
    }
  return at == got.size() ? m : INFINITY;
}

class StoriesTp : public ::testing::TestWithParam<int> {};

TEST_P(StoriesTp, TeacherForcedMatchesTp1AndGreedyMatchesGolden) {
  const int world = GetParam();
  const std::string model = SourcePath("deploy/models/stories260K/stories260K.bin");
  const std::vector<Golden>& golden = testing::GoldenCases();
  std::vector<int32_t> seq = golden[0].prompt;
  seq.insert(seq.end(), golden[0].ids.begin(), golden[0].ids.end());

  auto tp1 = testing::MakeCpuBackend(model, {128, 16, worker::DType::kF32}, {.threads = 1});
  ASSERT_TRUE(tp1.ok());
  auto ref = testing::TeacherForcedLogits(tp1->get(), seq, 16);
  ASSERT_TRUE(ref.ok());

  const std::string dir =
      ::testing::TempDir() + "/rl_tp_" + std::to_string(world) + "_" + std::to_string(getpid());
  const std::string out = dir + ".logits";
  const std::string ids = dir + ".ids";
  bool ok = RunGroup(world, dir, [&](int rank, worker::Communicator* comm) {
    auto b = ShardBackend(model, rank, world, comm, worker::DType::kF32);
    if (!b.ok()) return 2;
    auto logits = testing::TeacherForcedLogits(b->get(), seq, 16);
    if (!logits.ok()) return 3;
    if (rank == 0) WriteFloats(out, *logits);
    // Every golden case, greedy, through the sharded group (TP2: four
    // oversubscribed ranks on two cores take half a minute for this).
    if (world != 2) return 0;
    std::ofstream f(ids);
    for (const Golden& g : golden) {
      testing::LaneSpec lane;
      lane.prompt = g.prompt;
      lane.max_new_tokens = static_cast<int>(g.ids.size());
      lane.stop_token = 1;
      auto res = testing::RunLanes(b->get(), {lane});
      if (!res.ok()) return 4;
      if (rank == 0) {
        for (int32_t t : (*res)[0].tokens) f << t << ' ';
        f << '\n';
      }
    }
    return 0;
  });
  ASSERT_TRUE(ok);
  const double diff = MaxDiff(*ref, ReadFloats(out));
  std::printf("TP%d vs TP1: max |logit difference| %.3g over %zu positions\n", world, diff,
              seq.size());
  EXPECT_LT(diff, 1e-3);
  if (world != 2) return;
  std::ifstream f(ids);
  for (const Golden& g : golden) {
    std::vector<int32_t> got;
    std::string line;
    std::getline(f, line);
    std::istringstream in(line);
    for (int32_t t; in >> t;) got.push_back(t);
    EXPECT_EQ(got, g.ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, StoriesTp, ::testing::Values(2, 4));

// Five lanes in shared rounds across a TP4 group give exactly their solo
// tokens and logits: the rank-order all-reduce keeps batch invariance.
bool ConcurrentEqualsSoloTp4(const std::string& model, worker::DType kv, int vocab,
                             const std::string& dir, const worker::ShardOptions& sharding = {},
                             const GroupMode& mode = {}) {
  return RunGroup(4, dir, [&](int rank, worker::Communicator* comm) {
    auto b = ShardBackend(model, rank, 4, comm, kv, sharding, mode);
    if (!b.ok()) return 2;
    std::vector<testing::LaneSpec> lanes(5);
    for (int i = 0; i < 5; ++i) {
      for (int j = 0; j < 3 + 5 * i; ++j) lanes[i].prompt.push_back((j * 31 + i * 7 + 1) % vocab);
      lanes[i].max_new_tokens = 12 + 3 * i;
      lanes[i].arrival_round = (i * 3) % 7;
    }
    lanes[2].sampling.temperature = 0.9f;
    lanes[2].sampling.seed = 7;
    // Every rank plans the same rounds (the planner is deterministic): 4
    // tokens a round give chunks of 1 to 4 beside the other lanes' decodes.
    auto together = testing::RunLanes(
        b->get(), lanes,
        {.planner = {.round_token_budget = 4, .min_prefill_chunk = 2}, .keep_logits = true});
    if (!together.ok()) return 3;
    int mixed = 0;
    for (const testing::LaneResult& r : *together) mixed += r.mixed_prefill_chunks;
    if (mixed == 0) return 7;
    for (int i = 0; i < 5; ++i) {
      testing::LaneSpec alone = lanes[i];
      alone.arrival_round = 0;
      auto solo = testing::RunLanes(b->get(), {alone}, {.keep_logits = true});
      if (!solo.ok()) return 4;
      if ((*solo)[0].tokens != (*together)[i].tokens) return 5;
      if ((*solo)[0].logits != (*together)[i].logits) return 6;
    }
    return 0;
  });
}

TEST(StoriesTp4, ConcurrentEqualsSolo) {
  EXPECT_TRUE(ConcurrentEqualsSoloTp4(
      SourcePath("deploy/models/stories260K/stories260K.bin"), worker::DType::kFP8E4M3, 512,
      ::testing::TempDir() + "/rl_tp_inv_" + std::to_string(getpid())));
}

// Max |TP(world) - TP1| of the teacher-forced logits of `seq` (prefill
// chunks of `chunk`), F32 KV; INFINITY when a rank fails.
double TeacherForcedTpDiff(const std::string& model, const std::vector<int32_t>& seq, int chunk,
                           int world, const worker::ShardOptions& sharding = {},
                           const GroupMode& mode = {}) {
  auto tp1 = testing::MakeCpuBackend(model, {128, 16, worker::DType::kF32, 8}, {.threads = 1},
                                     [&](worker::ModelConfig& c) {
                                       if (mode.dense_window > 0) {
                                         c.indexer.dense_window = mode.dense_window;
                                       }
                                     });
  EXPECT_TRUE(tp1.ok()) << tp1.status();
  if (!tp1.ok()) return INFINITY;
  auto ref = testing::TeacherForcedLogits(tp1->get(), seq, chunk);
  EXPECT_TRUE(ref.ok()) << ref.status();
  if (!ref.ok()) return INFINITY;
  const std::string dir = model + "_group" + std::to_string(world);
  const std::string out = model + ".logits" + std::to_string(world);
  bool ok = RunGroup(world, dir, [&](int rank, worker::Communicator* comm) {
    auto b = ShardBackend(model, rank, world, comm, worker::DType::kF32, sharding, mode);
    if (!b.ok()) return 2;
    auto logits = testing::TeacherForcedLogits(b->get(), seq, chunk);
    if (!logits.ok()) return 3;
    if (rank == 0) WriteFloats(out, *logits);
    return 0;
  });
  return ok ? MaxDiff(*ref, ReadFloats(out)) : INFINITY;
}

// KV-head replication: 8 query heads over 2 KV heads at TP4 (each rank keeps
// one KV head, shared with another rank), FP8 weights.
TEST(SyntheticTp4, KvHeadReplicationMatchesTp1) {
  worker::SyntheticModelOptions o =
      testing::Fp8GqaModel(::testing::TempDir() + "/rl_tp_synth_" + std::to_string(getpid()),
                           /*intermediate=*/512, /*vocab=*/512, /*seed=*/11);
  ASSERT_TRUE(worker::WriteSyntheticModel(o).ok());
  std::vector<int32_t> seq;
  for (int i = 0; i < 48; ++i) seq.push_back((i * 97 + 5) % 512);
  const double diff = TeacherForcedTpDiff(o.out_dir, seq, 7, 4);
  std::printf("synthetic TP4 vs TP1: max |logit difference| %.3g\n", diff);
  EXPECT_LT(diff, 1e-3);
}

// The DeepSeek family sharded: each rank its heads of the latent attention
// (the latent itself whole), its columns of every expert, of the shared
// expert and of the dense MLP. Same bound as above: rounding only (measured
// below 1e-5 with logits of order 1), and a misplaced head or column is an
// error of order 1.
worker::SyntheticModelOptions DeepseekTpModel() {
  auto o = worker::SyntheticPreset("glm5-tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_tp_deepseek_" + std::to_string(getpid());
  o->dtype = worker::DType::kF32;
  EXPECT_TRUE(worker::WriteSyntheticModel(*o).ok());
  return *o;
}

// (world, expert parallel): expert parallelism gives each rank whole experts
// (8 over 2 or 4 ranks), its partial sums meeting the others' in the same
// rank-order all-reduce.
class DeepseekTp : public ::testing::TestWithParam<std::pair<int, bool>> {};

TEST_P(DeepseekTp, TeacherForcedMatchesTp1) {
  const auto [world, ep] = GetParam();
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back((i * 97 + 5) % o.vocab);
  const double diff = TeacherForcedTpDiff(o.out_dir, seq, 6, world, {.expert_parallel = ep});
  std::printf("glm_moe_dsa %s%d vs TP1: max |logit difference| %.3g\n", ep ? "EP" : "TP", world,
              diff);
  EXPECT_LT(diff, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeepseekTp,
                         ::testing::Values(std::pair{2, false}, std::pair{4, false},
                                           std::pair{2, true}, std::pair{4, true}));

TEST(DeepseekTp4, ConcurrentEqualsSolo) {
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  EXPECT_TRUE(
      ConcurrentEqualsSoloTp4(o.out_dir, worker::DType::kBF16, o.vocab, o.out_dir + "_inv"));
  EXPECT_TRUE(ConcurrentEqualsSoloTp4(o.out_dir, worker::DType::kBF16, o.vocab,
                                      o.out_dir + "_inv_ep", {.expert_parallel = true}));
}

// GLM-5.3-Flash's hybrid sharded: each rank its KDA heads (their rows of
// the head-wise projections, convolution channels, decay parameters, columns
// of o_proj, and their part of the recurrent state) beside the MLA layer's.
TEST(HybridTp, TeacherForcedMatchesTp1AndConcurrentEqualsSolo) {
  auto o = worker::SyntheticPreset("glm5-next-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_tp_hybrid_" + std::to_string(getpid());
  o->dtype = worker::DType::kF32;
  ASSERT_TRUE(worker::WriteSyntheticModel(*o).ok());
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back((i * 97 + 5) % o->vocab);
  for (int world : {2, 4}) {
    const double diff = TeacherForcedTpDiff(o->out_dir, seq, 6, world);
    std::printf("glm5_next TP%d vs TP1: max |logit difference| %.3g\n", world, diff);
    EXPECT_LT(diff, 1e-3) << "TP" << world;
  }
  EXPECT_TRUE(
      ConcurrentEqualsSoloTp4(o->out_dir, worker::DType::kBF16, o->vocab, o->out_dir + "_inv"));
}

// With hyper-connections every rank keeps the whole residual streams and
// computes their mixing itself: TP2 and TP4 stay within TP1's rounding.
TEST(HybridTp, HyperConnectionsMatchTp1) {
  auto o = worker::SyntheticPreset("glm5-next-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_tp_hyper_" + std::to_string(getpid());
  o->dtype = worker::DType::kF32;
  o->hc_mult = 4;
  ASSERT_TRUE(worker::WriteSyntheticModel(*o).ok());
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back((i * 97 + 5) % o->vocab);
  for (int world : {2, 4}) {
    const double diff = TeacherForcedTpDiff(o->out_dir, seq, 6, world);
    std::printf("glm5_next hc_mult 4 TP%d vs TP1: max |logit difference| %.3g\n", world, diff);
    EXPECT_LT(diff, 1e-3) << "TP" << world;
  }
}

// Decode context parallel: each rank keeps every world-th position of the
// latent cache; attention is computed per rank over its positions with every
// head's query and merged by log-sum-exp, and the DSA indexer's choice is
// merged from the ranks' own top-k. Against TP1 (everything on one rank)
// within the same rounding bound, past a dense window of 24 so the indexer
// picks (8 of up to 60), prefill in chunks of 7 and decode one token a round.
class DeepseekDcp : public ::testing::TestWithParam<int> {};

TEST_P(DeepseekDcp, TeacherForcedMatchesTp1) {
  const int world = GetParam();
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  std::vector<int32_t> seq;
  for (int i = 0; i < 60; ++i) seq.push_back((i * 89 + 3) % o.vocab);
  for (int chunk : {7, 1}) {
    const double diff = TeacherForcedTpDiff(o.out_dir, seq, chunk, world, {},
                                            {.context_parallel = true, .dense_window = 24});
    std::printf(
        "glm_moe_dsa TP%d decode context parallel (chunks of %d) vs TP1: max |logit "
        "difference| %.3g\n",
        world, chunk, diff);
    EXPECT_LT(diff, 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeepseekDcp, ::testing::Values(2, 4));

TEST(DeepseekDcp4, ConcurrentEqualsSolo) {
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  EXPECT_TRUE(ConcurrentEqualsSoloTp4(o.out_dir, worker::DType::kFP8E4M3, o.vocab,
                                      o.out_dir + "_inv_dcp", {},
                                      {.context_parallel = true, .dense_window = 12}));
}

// The point of it: a block id covers world times the positions, in the
// same bytes per rank, so the same pool holds world times the context.
TEST(DeepseekDcp, CapacityGrowsWithTheGroup) {
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  for (int world : {1, 2, 4}) {
    const std::string out = o.out_dir + ".dcp_capacity" + std::to_string(world);
    bool ok = RunGroup(world, o.out_dir + "_cap" + std::to_string(world),
                       [&](int rank, worker::Communicator* comm) {
                         auto b =
                             ShardBackend(o.out_dir, rank, world, comm, worker::DType::kFP8E4M3, {},
                                          {.context_parallel = true, .kv_blocks = 8});
                         if (!b.ok()) return 2;
                         if (rank == 0) {
                           WriteFloats(out, {{static_cast<float>((*b)->block_tokens()),
                                              static_cast<float>((*b)->kv_block_bytes()),
                                              static_cast<float>((*b)->context_parallel())}});
                         }
                         // No rank leaves while another still connects.
                         float sync = 0;
                         return comm->AllReduceSum(&sync, 1).ok() ? 0 : 3;
                       });
    ASSERT_TRUE(ok) << world;
    const std::vector<float> got = ReadFloats(out);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], 16.0f * world) << "positions per block id";
    EXPECT_EQ(got[2], static_cast<float>(world));
    static float bytes = got[1];
    EXPECT_EQ(got[1], bytes) << "each rank's block is the same size whatever the group";
  }
}

// Expert parallelism needs routed experts that split over the ranks.
TEST(DeepseekShard, ExpertParallelNeedsExpertsThatSplit) {
  const worker::SyntheticModelOptions o = DeepseekTpModel();
  auto full = worker::LoadModel(o.out_dir);
  ASSERT_TRUE(full.ok());
  std::shared_ptr<const worker::ModelWeights> m(std::move(*full));
  EXPECT_TRUE(worker::ShardModel(m, 0, 4, {.expert_parallel = true}).ok());
  auto bad = worker::ShardModel(m, 0, 3, {.expert_parallel = true});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  auto stories = worker::LoadModel(SourcePath("deploy/models/stories260K/stories260K.bin"));
  ASSERT_TRUE(stories.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      worker::ShardModel(std::shared_ptr<const worker::ModelWeights>(std::move(*stories)), 0, 2,
                         {.expert_parallel = true})
          .status()));
}

}  // namespace
}  // namespace ringlane
