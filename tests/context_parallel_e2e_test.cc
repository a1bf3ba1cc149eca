// Decode context parallel through real worker daemons and the router: a TP2
// group of a GLM-5-shaped model whose ranks each keep every other position
// of the FP8 latent cache holds twice the context of the same group with the
// cache replicated, in the same KV pool per rank, and generates the same
// tokens as one rank holding everything (past the DSA dense window, so the
// ranks' indexer choices are merged too).
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "tests/support/cluster.h"
#include "tests/support/daemon.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using ::testing::HasSubstr;

TEST(ContextParallelE2e, HoldsTwiceTheContextWithTheSameTokens) {
  auto o = worker::SyntheticPreset("glm5-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_dcp_e2e_" + std::to_string(getpid());
  o->index_topk = 8;
  ASSERT_TRUE(worker::WriteSyntheticModel(*o).ok());
  const std::vector<std::string> model = {"--model=" + o->out_dir, "--dsa_dense_window=24",
                                          "--kv_dtype=fp8"};
  std::vector<v1::GenerateRequest> requests;
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 140 + 7 * p; ++i) prompt.push_back(1 + (i * 53 + p * 71) % 500);
    // 140..154 prompt tokens and 40 generated: more than the 128 positions
    // 8 blocks of 16 hold, fewer than the 256 they hold split over 2 ranks.
    requests.push_back(testing::GreedyRequest(prompt, 40));
  }

  auto run = [&](int world, std::vector<std::string> extra) {
    testing::ClusterOptions co;
    co.world = world;
    co.worker_flags = model;
    co.worker_flags.insert(co.worker_flags.end(), extra.begin(), extra.end());
    auto c = testing::StartCluster(co);
    std::vector<testing::CallOut> out;
    if (c == nullptr) return out;
    for (const v1::GenerateRequest& r : requests) out.push_back(testing::Call(*c->stub, r));
    return out;
  };

  const std::vector<testing::CallOut> reference = run(1, {});
  ASSERT_EQ(reference.size(), requests.size());
  for (const testing::CallOut& r : reference)
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();

  // Replicated, 8 blocks per rank: the requests do not fit.
  const std::vector<testing::CallOut> replicated = run(2, {"--kv_blocks=8"});
  ASSERT_EQ(replicated.size(), requests.size());
  for (const testing::CallOut& r : replicated) {
    EXPECT_FALSE(r.status.ok());
    EXPECT_THAT(r.status.error_message(), HasSubstr("need more KV blocks"));
  }

  // Context parallel, the same 8 blocks per rank: they fit, with the tokens
  // one rank holding everything gives.
  const std::vector<testing::CallOut> split =
      run(2, {"--kv_blocks=8", "--decode_context_parallel"});
  ASSERT_EQ(split.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_TRUE(split[i].status.ok()) << split[i].status.error_message();
    EXPECT_EQ(split[i].choices.at(0).ids, reference[i].choices.at(0).ids);
    EXPECT_EQ(split[i].choices.at(0).ids.size(), 40u);
  }
}

// The bundled model keeps per-head K/V, which tensor parallelism already
// splits: a worker asked to split it by position exits with a message, as do
// two ways of drafting at once.
TEST(ContextParallelE2e, WorkerRefusesWhatItCannotSplit) {
  const std::string model = "--model=" + testing::StoriesModel();
  testing::RunResult r = testing::RunToExit(
      testing::kWorkerBin,
      {model, "--world_size=2", "--rank=0", "--decode_context_parallel", "--listen=127.0.0.1:0"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--decode_context_parallel"));
  r = testing::RunToExit(testing::kWorkerBin,
                         {model, "--draft_layers=2", "--draft_mtp", "--listen=127.0.0.1:0"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ways to draft"));
  r = testing::RunToExit(testing::kWorkerBin, {model, "--draft_mtp", "--listen=127.0.0.1:0"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("MTP"));
}

}  // namespace
}  // namespace ringlane
