// GLM-5.3-Flash's hybrid (glm5_next: Kimi Delta Attention layers with a
// recurrent state per lane beside NoPE MLA) through a real worker daemon and
// the router: five concurrent requests, more than the worker has state
// slots, give each request's solo tokens and logprobs bit for bit, and as
// identical resends they resume from the state checkpoint of their longest
// cached prefix (reported as cached tokens: a multiple of the checkpoint
// interval); with speculative decoding on, rejected drafts rewind the lanes'
// states and every token and logprob is the same as with it off. A prefix
// the device pool evicted comes back from the kvstore, its latent KV,
// indexer keys and state checkpoints together, and resumes at the restored
// checkpoint with the same tokens and logprobs as cold.
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
#include "tests/support/http_probe.h"
#include "tests/support/kvstore.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using ::testing::HasSubstr;

// glm5-next-tiny (indexer top-8) written once per process; `full` adds
// GLM-5.3-Flash's other parts: four residual streams (hyper-connections) and
// the pooled indexer (pools of 4 of its 8 picks).
std::string WriteHybridModel(bool full) {
  auto o = worker::SyntheticPreset("glm5-next-tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + (full ? "/rl_hybrid_full_e2e_" : "/rl_hybrid_e2e_") +
               std::to_string(getpid());
  o->index_topk = 8;
  if (full) {
    o->index_kpool = 4;
    o->hc_mult = 4;
  }
  EXPECT_TRUE(worker::WriteSyntheticModel(*o).ok());
  return o->out_dir;
}

std::string HybridModel() {
  static const std::string dir = WriteHybridModel(false);
  return dir;
}

std::string FullHybridModel() {
  static const std::string dir = WriteHybridModel(true);
  return dir;
}

struct Outcome {
  std::vector<testing::CallOut> solo, together;
  testing::CallOut crowd;
  double drafted = 0, rejected = 0, preemptions = 0;
  double crowd_preemptions = 0;  // of the crowd call alone
};

// The requests one at a time, then all five at once (resends of the same
// prompts), on a fresh cluster with the router's `spec_flags`.
// With `crowd`, that request last (Outcome::crowd).
Outcome RunRequests(const std::vector<v1::GenerateRequest>& requests,
                    const std::vector<std::string>& spec_flags,
                    const std::vector<std::string>& worker_flags = {},
                    const v1::GenerateRequest* crowd = nullptr) {
  Outcome out;
  testing::ClusterOptions co;
  // Chunks of 8 under a budget of 24: the planner cuts prompts (12 to 48
  // tokens) at chunk ends, and the tails past the last whole chunk and every
  // generated token go through the recurrence.
  co.worker_flags = {"--model=" + HybridModel(), "--state_slots=3", "--dsa_dense_window=20",
                     "--state_checkpoint_interval=16", "--kda_chunk=8"};
  co.worker_flags.insert(co.worker_flags.end(), worker_flags.begin(), worker_flags.end());
  co.router_flags = {"--round_token_budget=24", "--max_lanes=8"};
  co.router_flags.insert(co.router_flags.end(), spec_flags.begin(), spec_flags.end());
  auto c = testing::StartCluster(co);
  EXPECT_NE(c, nullptr);
  if (c == nullptr) return out;
  for (const v1::GenerateRequest& r : requests) out.solo.push_back(testing::Call(*c->stub, r));
  out.together.resize(requests.size());
  out.preemptions = 0;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { out.together[i] = testing::Call(*c->stub, requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  if (crowd != nullptr) {
    auto before = testing::GetOnce(c->http(), "/metrics");
    EXPECT_TRUE(before.ok());
    out.crowd = testing::Call(*c->stub, *crowd);
    auto after = testing::GetOnce(c->http(), "/metrics");
    EXPECT_TRUE(after.ok());
    if (before.ok() && after.ok()) {
      out.crowd_preemptions = testing::Metric(after->body, "ringlane_preemptions_total") -
                              testing::Metric(before->body, "ringlane_preemptions_total");
    }
  }
  auto metrics = testing::GetOnce(c->http(), "/metrics");
  EXPECT_TRUE(metrics.ok());
  if (metrics.ok()) {
    out.drafted = testing::Metric(metrics->body, "ringlane_spec_drafted_tokens_total");
    out.rejected = testing::Metric(metrics->body, "ringlane_spec_rejected_tokens_total");
    out.preemptions = testing::Metric(metrics->body, "ringlane_preemptions_total");
  }
  return out;
}

TEST(HybridE2e, ConcurrentEqualsSoloAndSpeculationChangesNothing) {
  std::vector<v1::GenerateRequest> requests;
  for (int p = 0; p < 5; ++p) {
    std::vector<int32_t> prompt;
    // Repetitive prompts an n-gram drafter drafts from.
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
  const Outcome off = RunRequests(requests, {"--spec_drafters=none"});
  // A pool of 10 blocks for three lanes of 3 to 6 blocks each: lanes
  // are preempted and come back as new lanes that resume from the
  // checkpoints of what they had computed. How much the five concurrent
  // calls overlap depends on the machine's load; the three choices of one
  // call start together and need 18 blocks at their ends, so that call
  // preempts whatever the timing.
  v1::GenerateRequest crowd = requests[4];
  crowd.set_n(3);
  crowd.set_logprobs(false);
  crowd.mutable_sampling()->set_top_logprobs(0);
  const Outcome tight = RunRequests(requests, {"--spec_drafters=none"}, {"--kv_blocks=10"}, &crowd);
  // Drafts every step, however badly they fare: rejected drafts rewind the
  // lanes' states (the workers feed the kept tokens again).
  const Outcome on = RunRequests(
      requests, {"--spec_drafters=ngram,suffix", "--spec_adaptive=false", "--spec_gate=false"});
  ASSERT_EQ(off.solo.size(), requests.size());
  ASSERT_EQ(on.solo.size(), requests.size());
  ASSERT_EQ(tight.together.size(), requests.size());
  EXPECT_GT(tight.crowd_preemptions, 0);
  ASSERT_TRUE(tight.crowd.status.ok()) << tight.crowd.status.error_message();
  ASSERT_EQ(tight.crowd.choices.size(), 3u);
  for (const auto& [index, choice] : tight.crowd.choices) {
    EXPECT_EQ(choice.ids, off.solo[4].choices.at(0).ids) << "choice " << index;
  }
  EXPECT_EQ(off.drafted, 0);
  EXPECT_GT(on.drafted, 0);
  EXPECT_GT(on.rejected, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    const testing::ChoiceOut& want = off.solo[i].choices.at(0);
    ASSERT_TRUE(off.solo[i].status.ok()) << off.solo[i].status.error_message();
    ASSERT_EQ(want.ids.size(), static_cast<size_t>(requests[i].max_tokens()));
    for (const testing::CallOut* got : {&tight.solo[i], &tight.together[i]}) {
      ASSERT_TRUE(got->status.ok()) << got->status.error_message();
      EXPECT_EQ(got->choices.at(0).ids, want.ids);
      EXPECT_EQ(got->choices.at(0).logprobs, want.logprobs);
    }
    for (const Outcome* run : {&off, &on}) {
      for (const testing::CallOut* got : {&run->solo[i], &run->together[i]}) {
        ASSERT_TRUE(got->status.ok()) << got->status.error_message();
        EXPECT_EQ(got->choices.at(0).ids, want.ids);
        EXPECT_EQ(got->choices.at(0).logprobs, want.logprobs);
        EXPECT_EQ(got->choices.at(0).top_logprobs, want.top_logprobs);
      }
      // The resend resumed from the checkpoint after its last cached block
      // (the last prompt token is always computed), and says so.
      const int64_t prompt = requests[i].token_ids().ids_size();
      EXPECT_EQ(run->solo[i].usage.cached_tokens(), 0);
      EXPECT_EQ(run->together[i].usage.cached_tokens(), (prompt - 1) / 16 * 16);
    }
  }
}

std::vector<int32_t> Prompt(int seed, int n) {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (seed * 131 + i * 7) % 500);
  return p;
}

// The pool (12 blocks of 16) holds one 100-token prompt and its output at a
// time, and four checkpoint slots fewer than the prompts' checkpoints: the
// first prompt leaves the pool, and its checkpoints the ledger, before it is
// sent again; the resend resumes from the kvstore at the last checkpoint the
// store holds (96, a multiple of the 32-token interval that is decoupled
// from the block size).
struct KvstoreCase {
  int world = 1;
  bool full = false;  // FullHybridModel
};

class HybridKvstore : public ::testing::TestWithParam<KvstoreCase> {};

TEST_P(HybridKvstore, AnEvictedPrefixResumesFromTheKvstoreAtItsCheckpoint) {
  auto kv = testing::StartKvstore({});
  ASSERT_NE(kv, nullptr);
  testing::ClusterOptions co;
  co.world = GetParam().world;  // under TP every rank stores its heads' state
  co.worker_flags = {"--model=" + (GetParam().full ? FullHybridModel() : HybridModel()),
                     "--state_slots=3",
                     "--dsa_dense_window=20",
                     "--kv_blocks=12",
                     "--block_size=16",
                     "--state_checkpoint_interval=32",
                     "--kda_chunk=16",
                     "--state_checkpoints=4",
                     "--metrics_port=0",
                     "--kvstore=" + kv->address("kvstore")};
  co.router_flags = {"--round_token_budget=40"};
  auto c = testing::StartCluster(co);
  ASSERT_NE(c, nullptr);
  auto request = [](const std::vector<int32_t>& p) {
    v1::GenerateRequest r = testing::GreedyRequest(p, 12);
    r.set_logprobs(true);
    r.mutable_sampling()->set_top_logprobs(2);
    return r;
  };
  const std::vector<int32_t> p = Prompt(0, 100);
  const testing::CallOut cold = testing::Call(*c->stub, request(p));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0);
  // Six full blocks, three of them (ending at 32, 64, 96) with their
  // checkpoints.
  auto store = testing::KvClient(*kv);
  ASSERT_TRUE(testing::PollUntil([&] {
    auto s = store->Stats();
    return s.ok() && s->blocks_stored() >= 6;
  })) << "the prompt's blocks were never offloaded";
  for (int seed : {1, 2}) {
    const testing::CallOut other = testing::Call(*c->stub, request(Prompt(seed, 100)));
    ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  }
  auto before = testing::GetOnce(c->http(), "/metrics");
  ASSERT_TRUE(before.ok());
  const testing::CallOut back = testing::Call(*c->stub, request(p));
  ASSERT_TRUE(back.status.ok()) << back.status.error_message();
  EXPECT_EQ(back.choices.at(0).ids, cold.choices.at(0).ids);
  EXPECT_EQ(back.choices.at(0).logprobs, cold.choices.at(0).logprobs);
  EXPECT_EQ(back.choices.at(0).top_ids, cold.choices.at(0).top_ids);
  EXPECT_EQ(back.choices.at(0).top_logprobs, cold.choices.at(0).top_logprobs);
  EXPECT_EQ(back.usage.cached_tokens(), 96);
  auto after = testing::GetOnce(c->http(), "/metrics");
  ASSERT_TRUE(after.ok());
  EXPECT_GT(testing::Metric(after->body, "ringlane_kvstore_restored_tokens_total"),
            testing::Metric(before->body, "ringlane_kvstore_restored_tokens_total"));
  EXPECT_GT(c->workers->RankMetric("ringlane_worker_kvstore_state_checkpoints_restored_total"), 0);
  EXPECT_GT(c->workers->RankMetric("ringlane_worker_kvstore_state_checkpoints_offloaded_total"), 0);
}

// The full model's pooled indexer reads its gate scores from the restored
// latent rows.
INSTANTIATE_TEST_SUITE_P(Models, HybridKvstore,
                         ::testing::Values(KvstoreCase{1, false}, KvstoreCase{2, false},
                                           KvstoreCase{2, true}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.full ? "full_" : "", "tp",
                                               info.param.world);
                         });

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
  // A prefix hit resumes at a checkpoint, which must end a chunk.
  r = testing::RunToExit(testing::kWorkerBin, {model, "--state_checkpoint_interval=32",
                                               "--kda_chunk=24", "--listen=127.0.0.1:0"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--kda_chunk"));
}

// The next turn of a conversation sends the last prompt, the reply and more.
// The reply's positions ran through the recurrence, where a cold run of the
// new prompt runs whole chunks chunked: the two agree only to rounding, so
// the new prompt reuses the blocks and checkpoint its first turn computed
// in chunks, and recomputes the reply, and its output is the cold run's bit
// for bit.
TEST(HybridE2e, TheNextTurnReusesOnlyWhatItsColdRunComputesAlike) {
  const std::vector<int32_t> first = Prompt(5, 40);
  auto request = [](const std::vector<int32_t>& p, int max_tokens) {
    v1::GenerateRequest r = testing::GreedyRequest(p, max_tokens);
    r.set_logprobs(true);
    r.mutable_sampling()->set_top_logprobs(2);
    return r;
  };
  testing::ClusterOptions co;
  co.worker_flags = {"--model=" + HybridModel(), "--state_slots=3", "--dsa_dense_window=20",
                     "--state_checkpoint_interval=16", "--kda_chunk=8"};
  co.router_flags = {"--round_token_budget=24", "--max_lanes=8"};
  std::vector<int32_t> next;
  testing::CallOut warm;
  {
    auto c = testing::StartCluster(co);
    ASSERT_NE(c, nullptr);
    const testing::CallOut turn = testing::Call(*c->stub, request(first, 30));
    ASSERT_TRUE(turn.status.ok()) << turn.status.error_message();
    next = first;
    next.insert(next.end(), turn.choices.at(0).ids.begin(), turn.choices.at(0).ids.end());
    for (int i = 0; i < 10; ++i) next.push_back(3 + i * 41 % 500);
    warm = testing::Call(*c->stub, request(next, 16));
    ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  }
  auto c = testing::StartCluster(co);
  ASSERT_NE(c, nullptr);
  const testing::CallOut cold = testing::Call(*c->stub, request(next, 16));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0);
  // The first turn's blocks and checkpoints at 16 and 32 (its prompt's
  // whole chunks end at 40); those at 48 and 64 hold the reply's positions.
  EXPECT_EQ(warm.usage.cached_tokens(), 32);
  EXPECT_EQ(warm.choices.at(0).ids, cold.choices.at(0).ids);
  EXPECT_EQ(warm.choices.at(0).logprobs, cold.choices.at(0).logprobs);
  EXPECT_EQ(warm.choices.at(0).top_logprobs, cold.choices.at(0).top_logprobs);
}

}  // namespace
}  // namespace ringlane
