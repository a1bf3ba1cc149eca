// GLM-5.3-Flash's hybrid (glm5_next: Kimi Delta Attention layers with a
// recurrent state per lane beside NoPE MLA) through a real worker daemon and
// the router: five concurrent requests, more than the worker has state
// slots, give each request's solo tokens and logprobs bit for bit, and as
// identical resends they resume from the state checkpoint of their longest
// cached prefix (reported as cached tokens: a multiple of the checkpoint
// interval); drafting is off for it even when the router is asked to
// speculate.
#include <unistd.h>

#include <string>
#include <thread>
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

std::string HybridModel() {
  static const std::string dir = [] {
    auto o = worker::SyntheticPreset("glm5-next-tiny");
    EXPECT_TRUE(o.ok());
    o->out_dir = ::testing::TempDir() + "/rl_hybrid_e2e_" + std::to_string(getpid());
    o->index_topk = 8;
    EXPECT_TRUE(worker::WriteSyntheticModel(*o).ok());
    return o->out_dir;
  }();
  return dir;
}

TEST(HybridE2e, ConcurrentEqualsSoloBeyondTheStateSlotsAndResendsAgree) {
  testing::ClusterOptions co;
  co.worker_flags = {"--model=" + HybridModel(), "--state_slots=3", "--dsa_dense_window=20",
                     "--state_checkpoint_interval=16"};
  // Asked to speculate: the group's recurrent layers turn drafting off.
  co.router_flags = {"--spec_drafters=ngram,suffix", "--round_token_budget=24", "--max_lanes=8"};
  auto c = testing::StartCluster(co);
  ASSERT_NE(c, nullptr);
  std::vector<v1::GenerateRequest> requests;
  for (int p = 0; p < 5; ++p) {
    std::vector<int32_t> prompt;
    // Repetitive prompts an n-gram drafter would draft from.
    for (int i = 0; i < 12 + 9 * p; ++i) prompt.push_back(3 + (i % (4 + p)) * 37 % 500);
    v1::GenerateRequest r = testing::GreedyRequest(prompt, 24 + 4 * p);
    if (p == 3) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_seed(77);
    }
    r.set_logprobs(true);
    r.mutable_sampling()->set_top_logprobs(2);
    requests.push_back(r);
  }
  std::vector<testing::CallOut> solo;
  for (const v1::GenerateRequest& r : requests) {
    solo.push_back(testing::Call(*c->stub, r));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
    ASSERT_EQ(solo.back().choices.at(0).ids.size(), static_cast<size_t>(r.max_tokens()));
  }
  std::vector<testing::CallOut> together(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { together[i] = testing::Call(*c->stub, requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].choices.at(0).ids, solo[i].choices.at(0).ids);
    EXPECT_EQ(together[i].choices.at(0).logprobs, solo[i].choices.at(0).logprobs);
    EXPECT_EQ(together[i].choices.at(0).top_logprobs, solo[i].choices.at(0).top_logprobs);
    // The resend resumed from the checkpoint after its last cached block
    // (the last prompt token is always computed), and says so.
    const int64_t prompt = requests[i].token_ids().ids_size();
    EXPECT_EQ(together[i].usage.cached_tokens(), (prompt - 1) / 16 * 16);
    EXPECT_EQ(solo[i].usage.cached_tokens(), 0);
  }
}

// What the worker cannot run yet for this model, it refuses at start.
TEST(HybridE2e, WorkerRefusesWhatNeedsStateCheckpoints) {
  const std::string model = "--model=" + HybridModel();
  testing::RunResult r =
      testing::RunToExit(testing::kWorkerBin, {model, "--draft_layers=2", "--listen=127.0.0.1:0"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("linear-attention"));
  r = testing::RunToExit(testing::kWorkerBin, {model, "--state_slots=0", "--listen=127.0.0.1:0"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--state_slots"));
  // Checkpoints sit on block boundaries (16 positions here).
  r = testing::RunToExit(testing::kWorkerBin,
                         {model, "--state_checkpoint_interval=24", "--listen=127.0.0.1:0"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--state_checkpoint_interval"));
}

}  // namespace
}  // namespace ringlane
