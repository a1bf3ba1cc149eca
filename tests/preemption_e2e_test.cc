// Invariant 1 across preemption: a choice whose lane is preempted (the KV pool
// is full) and later re-admitted over its prompt plus what it generated must
// give the tokens, logprobs, text and finish reason of its solo run, with
// every sampling parameter at work at once (temperature, seed, top-k, top-p,
// min-p, presence and frequency penalties, top_logprobs, stop strings, the
// loop watchdog, max_tokens, n). Real daemons on loopback, through the
// router's public gRPC API.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Call;
using testing::CallOut;
using testing::ChoiceOut;
using testing::Cluster;

// Preempted lanes wait for room and recompute: twice the usual deadline.
constexpr std::chrono::seconds kDeadline(240);

// The requests: every sampling knob on, and different per request so that
// penalties of both signs, stop strings and the watchdog all get a chance.
std::vector<v1::GenerateRequest> Requests() {
  const auto& goldens = testing::GoldenCases();
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest r;
    const auto& prompt = goldens[static_cast<size_t>(i) % goldens.size()].prompt;
    r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    r.set_max_tokens(150);
    r.set_ignore_eos(true);
    r.set_logprobs(true);
    v1::SamplingParams* s = r.mutable_sampling();
    s->set_temperature(0.7f + 0.1f * static_cast<float>(i));
    s->set_seed(1000 + static_cast<uint64_t>(i));
    s->set_top_k(i == 2 ? 0 : 40);
    s->set_top_p(i == 1 ? 1.0f : 0.95f);
    s->set_min_p(i == 3 ? 0.0f : 0.02f);
    // Strong penalties, so that restarting their counts at zero changes the
    // very next logits (and so every logprob after a re-admission).
    s->set_presence_penalty(i == 3 ? -0.5f : 0.8f);
    s->set_frequency_penalty(i == 3 ? -0.9f : 1.1f);
    s->set_top_logprobs(3);
    if (i == 1) r.set_n(2);
    if (i == 2) r.add_stop("wallets");  // about 100 tokens into its solo text
    out.push_back(std::move(r));
  }
  return out;
}

double Preemptions(const Cluster& c) {
  auto m = testing::GetOnce(c.http(), "/metrics");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? testing::Metric(m->body, "ringlane_preemptions_total") : -1;
}

// Preemptions of a lane that had generated tokens (the case where the
// re-admitted lane's prompt holds earlier output), from the router's log.
int PreemptionsWithOutput(const std::string& log) {
  static const std::regex re("restarts from its prompt and ([0-9]+) generated tokens");
  int n = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    if (std::stoi((*it)[1].str()) > 0) ++n;
  }
  return n;
}

struct Shape {
  int world = 1;
  int pipeline_depth = 2;
};

class PreemptionE2eTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PreemptionE2eTest, PreemptedChoicesEqualTheirSoloRuns) {
  // 30 blocks of 16 positions: any one request fits (n=2 of 150 tokens is
  // about 20 blocks), the five choices together need about 55.
  const Shape shape = GetParam();
  auto c = testing::StartCluster(
      {.world = shape.world,
       .worker_flags = {"--kv_blocks=30", "--block_size=16"},
       .router_flags = {absl::StrCat("--pipeline_depth=", shape.pipeline_depth),
                        // Flags early enough that request 3 (negative
                        // penalties favour repeats) can end with `loop`.
                        "--loop_flag_repeats=3", "--loop_stop_tokens=24"}});
  ASSERT_NE(c, nullptr);
  const std::vector<v1::GenerateRequest> reqs = Requests();

  std::vector<CallOut> solo;
  for (const auto& r : reqs) {
    solo.push_back(Call(*c->stub, r, kDeadline));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
  }
  ASSERT_EQ(Preemptions(*c), 0) << "a solo run was preempted; the pool is too small";

  // Twice over, so that the re-admitted lanes also meet their own cached
  // blocks from the first pass (positions the workers never see again).
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<CallOut> outs(reqs.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ts.emplace_back([&, i] { outs[i] = Call(*c->stub, reqs[i], kDeadline); });
    }
    for (auto& t : ts) t.join();
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("pass ", pass, ", request ", i));
      ASSERT_TRUE(outs[i].status.ok()) << outs[i].status.error_message();
      ASSERT_EQ(outs[i].choices.size(), solo[i].choices.size());
      EXPECT_EQ(outs[i].completion_tokens(), solo[i].completion_tokens());
      for (const auto& [index, want] : solo[i].choices) {
        SCOPED_TRACE(absl::StrCat("choice ", index));
        const ChoiceOut& got = outs[i].choices[index];
        EXPECT_EQ(got.ids, want.ids);
        EXPECT_EQ(got.logprobs, want.logprobs);
        EXPECT_EQ(got.top_ids, want.top_ids);
        EXPECT_EQ(got.top_logprobs, want.top_logprobs);
        EXPECT_EQ(got.text, want.text);
        EXPECT_EQ(got.finish, want.finish);
        EXPECT_EQ(got.stop_string, want.stop_string);
        EXPECT_EQ(got.logprobs.size(), got.ids.size());
        EXPECT_EQ(got.top_ids.size(), 3 * got.ids.size());
      }
    }
  }
  const std::string log = c->router->Stderr();
  const double preemptions = Preemptions(*c);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(PreemptionsWithOutput(log), 0) << log;
  // What the run exercised, for the record.
  std::string finishes;
  for (const CallOut& o : solo) {
    for (const auto& [index, ch] : o.choices) {
      absl::StrAppend(&finishes, " ", v1::FinishReason_Name(ch.finish), "/", ch.ids.size());
    }
  }
  std::printf("preemptions: %.0f (%d of lanes with earlier output); finish/tokens:%s\n",
              preemptions, PreemptionsWithOutput(log), finishes.c_str());
}

INSTANTIATE_TEST_SUITE_P(Shapes, PreemptionE2eTest,
                         ::testing::Values(Shape{1, 2}, Shape{1, 1}, Shape{2, 2}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("Tp", info.param.world, "Depth",
                                               info.param.pipeline_depth);
                         });

}  // namespace
}  // namespace ringlane
