// The router end to end: a real ringlane-router in front of real worker
// daemons, driven through the public gRPC Generate API the way a client
// would. Token ids are compared exactly (DESIGN.md, invariant 1). Scheduling
// under pressure, worker faults and flags: router_daemon_test.cc.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "router/tokenizer/tokenizer.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Call;
using testing::CallOut;
using testing::Cluster;
using ::testing::HasSubstr;

using Golden = testing::GoldenCase;
const std::vector<Golden>& Goldens() { return testing::GoldenCases(); }
v1::GenerateRequest Ids(const std::vector<int32_t>& prompt, int max_tokens) {
  return testing::GreedyRequest(prompt, max_tokens);
}

const router::Tokenizer& Tokenizer() {
  static const auto* t = [] {
    auto r = router::LoadTokenizer(testing::StoriesTokenizer());
    EXPECT_TRUE(r.ok()) << r.status();
    return r->release();
  }();
  return *t;
}

// Trailing metadata of ListModels: the router's live state.
std::map<std::string, int64_t> State(v1::Generate::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  EXPECT_TRUE(stub.ListModels(&ctx, {}, &resp).ok());
  return testing::TrailingState(ctx);
}

// A TP2 group (blocks of 16 positions) and a router.
std::unique_ptr<Cluster> StartTp2(std::vector<std::string> router_flags) {
  return testing::StartCluster(
      {.world = 2, .worker_flags = {"--block_size=16"}, .router_flags = std::move(router_flags)});
}

class RouterE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = StartTp2({"--log_level=info"}).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }
  v1::Generate::Stub& stub() { return *cluster_->stub; }
  static Cluster* cluster_;
};
Cluster* RouterE2eTest::cluster_ = nullptr;

void ExpectGoldenCases(v1::Generate::Stub& stub) {
  for (const Golden& g : Goldens()) {
    CallOut o = Call(stub, Ids(g.prompt, static_cast<int>(g.ids.size())));
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    ASSERT_EQ(o.choices.size(), 1u);
    EXPECT_EQ(o.choices[0].ids, g.ids);
    auto prompt_text = Tokenizer().Decode(g.prompt);
    ASSERT_TRUE(prompt_text.ok());
    ASSERT_EQ(g.text.substr(0, prompt_text->size()), *prompt_text);
    EXPECT_EQ(o.choices[0].text, g.text.substr(prompt_text->size()));
    EXPECT_EQ(o.choices[0].finish, v1::FINISH_REASON_LENGTH);
    ASSERT_TRUE(o.has_usage);
    EXPECT_EQ(o.usage.prompt_tokens(), static_cast<int>(g.prompt.size()));
    EXPECT_EQ(o.usage.completion_tokens(), static_cast<int>(g.ids.size()));
  }
}

TEST_F(RouterE2eTest, GoldenCasesThroughTheApi) { ExpectGoldenCases(stub()); }

TEST_F(RouterE2eTest, TextPromptAndEmptyPromptStartFromBos) {
  v1::GenerateRequest r;
  r.set_text("");
  r.set_max_tokens(static_cast<int>(Goldens()[3].ids.size()));
  r.set_ignore_eos(true);  // temperature absent: the server default, 0
  CallOut o = Call(stub(), r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.choices[0].ids, Goldens()[3].ids);
  EXPECT_EQ(o.choices[0].text, Goldens()[3].text);

  r.set_text("Once upon a time");
  r.set_max_tokens(20);
  r.set_echo(true);
  o = Call(stub(), r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  std::vector<int32_t> want = Goldens()[0].prompt;
  want.insert(want.end(), Goldens()[0].ids.begin(), Goldens()[0].ids.begin() + 20);
  EXPECT_EQ(o.choices[0].ids, want);
  EXPECT_EQ(o.choices[0].text.rfind("Once upon a time, there was", 0), 0u) << o.choices[0].text;
}

// Five requests, each run alone, then all at once with staggered arrivals.
void ExpectFiveClientsGetTheirSoloTokens(v1::Generate::Stub& stub) {
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> prompt = Goldens()[i % Goldens().size()].prompt;
    for (int k = 0; k < 3 + 11 * i; ++k) prompt.push_back(300 + (7 * i + k) % 150);
    v1::GenerateRequest r = Ids(prompt, 30 + 17 * i);
    if (i % 2 == 1) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_top_p(0.95f);
      if (i == 1) r.mutable_sampling()->set_seed(77);  // i == 3: derived seed
    }
    reqs.push_back(r);
  }
  std::vector<CallOut> solo;
  for (const auto& r : reqs) {
    solo.push_back(Call(stub, r));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
  }
  std::vector<CallOut> together(reqs.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ts.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(15 * i));
      together[i] = Call(stub, reqs[i]);
    });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].choices[0].ids, solo[i].choices[0].ids) << "client " << i;
    EXPECT_EQ(together[i].choices[0].text, solo[i].choices[0].text) << "client " << i;
    EXPECT_EQ(static_cast<int>(solo[i].choices[0].ids.size()), reqs[i].max_tokens());
  }
  // The sampled ones really sampled (differ from greedy on the same prompt).
  v1::GenerateRequest greedy = reqs[1];
  greedy.mutable_sampling()->set_temperature(0);
  EXPECT_NE(Call(stub, greedy).choices[0].ids, solo[1].choices[0].ids);
}

TEST_F(RouterE2eTest, FiveConcurrentClientsGetTheirSoloTokens) {
  ExpectFiveClientsGetTheirSoloTokens(stub());
}

// The same outputs with rounds not pipelined (the fixture above runs the
// default, two rounds in flight).
class RouterE2eUnpipelinedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = StartTp2({"--pipeline_depth=1"}).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }
  static Cluster* cluster_;
};
Cluster* RouterE2eUnpipelinedTest::cluster_ = nullptr;

TEST_F(RouterE2eUnpipelinedTest, GoldenCasesThroughTheApi) { ExpectGoldenCases(*cluster_->stub); }

TEST_F(RouterE2eUnpipelinedTest, FiveConcurrentClientsGetTheirSoloTokens) {
  ExpectFiveClientsGetTheirSoloTokens(*cluster_->stub);
}

TEST_F(RouterE2eTest, ResendReusesTheCachedPrefix) {
  for (int n : {37, 48, 49, 5}) {
    std::vector<int32_t> prompt = {1};
    for (int k = 1; k < n; ++k) prompt.push_back(260 + (k * 13 + n) % 240);
    v1::GenerateRequest r = Ids(prompt, 12);
    const int64_t before_cold = State(stub())["ringlane-prefilled-tokens"];
    CallOut cold = Call(stub(), r);
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    // Prompts sent before share a few leading tokens with this one (BOS at
    // least): token-granular hits, but no more than that.
    EXPECT_LT(cold.usage.cached_tokens(), 4) << "n=" << n;
    EXPECT_EQ(State(stub())["ringlane-prefilled-tokens"] - before_cold,
              n - cold.usage.cached_tokens())
        << "n=" << n;
    const int64_t before = State(stub())["ringlane-prefilled-tokens"];
    CallOut warm = Call(stub(), r);
    ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
    // Every token but the last: the full blocks by reference, the rest of
    // the last one through a copy of the block the cold run left partly
    // filled (it ends in generated tokens, which the resend does not share).
    const int cached = n - 1;
    EXPECT_EQ(warm.usage.cached_tokens(), cached) << "n=" << n;
    // Only the uncached rest of the prompt was fed.
    EXPECT_EQ(State(stub())["ringlane-prefilled-tokens"] - before, n - cached) << "n=" << n;
    EXPECT_EQ(warm.choices[0].ids, cold.choices[0].ids) << "n=" << n;
    EXPECT_EQ(warm.choices[0].text, cold.choices[0].text) << "n=" << n;
  }
}

// The copies of the resends above are counted; with --partial_block_reuse
// off, a resend reuses whole blocks only, as before.
TEST_F(RouterE2eTest, PartialBlockReuseIsCountedAndCanBeTurnedOff) {
  std::vector<int32_t> prompt = {1};
  for (int k = 1; k < 37; ++k) prompt.push_back(300 + (k * 7) % 200);
  const v1::GenerateRequest r = Ids(prompt, 6);
  const auto copies = [](Cluster& c) {
    auto m = testing::GetOnce(c.http(), "/metrics");
    EXPECT_TRUE(m.ok());
    return m.ok() ? testing::Metric(m->body, "ringlane_kv_block_copies_total") : -1;
  };
  // (The first call may copy a block too, for a hit on BOS.)
  ASSERT_TRUE(Call(stub(), r).status.ok());
  const double before = copies(*cluster_);
  const CallOut warm = Call(stub(), r);
  EXPECT_EQ(warm.usage.cached_tokens(), 36);
  EXPECT_EQ(copies(*cluster_), before + 1);

  auto off = StartTp2({"--partial_block_reuse=false"});
  ASSERT_NE(off, nullptr);
  const CallOut cold = Call(*off->stub, r);
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0);
  const CallOut again = Call(*off->stub, r);
  EXPECT_EQ(again.usage.cached_tokens(), 32);
  EXPECT_EQ(again.choices.at(0).ids, warm.choices.at(0).ids);
  EXPECT_EQ(copies(*off), 0);
}

TEST_F(RouterE2eTest, BadRequestsAreInvalidArgumentAndServingGoesOn) {
  auto base = [] { return Ids(Goldens()[0].prompt, 8); };
  struct Case {
    std::string name;
    v1::GenerateRequest req;
    std::string field;
  };
  std::vector<Case> cases;
  {
    auto r = base();
    r.set_max_tokens(0);
    cases.push_back({"max_tokens 0", r, "max_tokens"});
  }
  {
    auto r = base();
    r.set_max_tokens(-3);
    cases.push_back({"max_tokens negative", r, "max_tokens"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({"temperature", r, "sampling.temperature"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back({"top_p", r, "sampling.top_p"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_min_p(2);
    cases.push_back({"min_p", r, "sampling.min_p"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_frequency_penalty(3);
    cases.push_back({"frequency_penalty", r, "sampling.frequency_penalty"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_logprobs(21);
    cases.push_back({"top_logprobs", r, "sampling.top_logprobs"});
  }
  {
    auto r = base();
    r.set_n(-1);
    cases.push_back({"n negative", r, "n"});
  }
  {
    auto r = base();
    r.set_n(1000);
    cases.push_back({"n too large", r, "n"});
  }
  {
    auto r = base();
    for (int i = 0; i < 5; ++i) r.add_stop(absl::StrCat("s", i));
    cases.push_back({"five stops", r, "stop"});
  }
  {
    auto r = base();
    r.add_stop("");
    cases.push_back({"empty stop", r, "stop"});
  }
  {
    auto r = base();
    r.add_stop_token_ids(100000);
    cases.push_back({"stop token id", r, "stop_token_ids"});
  }
  {
    auto r = base();
    r.mutable_token_ids()->add_ids(512);
    cases.push_back({"token outside vocab", r, "prompt.token_ids"});
  }
  {
    auto r = base();
    r.mutable_token_ids()->clear_ids();
    cases.push_back({"empty token ids", r, "prompt"});
  }
  {
    auto r = base();
    std::vector<int32_t> longp(600, 300);
    r.mutable_token_ids()->mutable_ids()->Assign(longp.begin(), longp.end());
    cases.push_back({"prompt over the context", r, "prompt"});
  }
  {
    auto r = base();
    auto* m = r.mutable_chat()->add_messages();
    m->set_role("wizard");
    m->set_content("hi");
    cases.push_back({"chat role the template does not know", r, "messages"});
  }
  {
    auto r = base();
    r.set_max_tokens(600);
    cases.push_back({"max_tokens over the context", r, "max_tokens"});
  }
  for (const Case& c : cases) {
    CallOut o = Call(stub(), c.req);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(o.status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_TRUE(o.choices.empty()) << c.name;
  }
  {
    // An unknown model is INVALID_ARGUMENT on gRPC (issue 4); the message
    // names the field, which the gateway turns into OpenAI's 404.
    auto r = base();
    r.set_model("no-such-model");
    CallOut o = Call(stub(), r);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(o.status.error_message(), HasSubstr("unknown model 'no-such-model'"));
  }
  CallOut ok = Call(stub(), base());
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.choices[0].ids,
            std::vector<int32_t>(Goldens()[0].ids.begin(), Goldens()[0].ids.begin() + 8));
}

TEST_F(RouterE2eTest, StopStringsAcrossTokensNeverAppear) {
  const Golden& g = Goldens()[0];
  auto prompt_text = *Tokenizer().Decode(g.prompt);
  const std::string full = g.text.substr(prompt_text.size());
  // Each spans a token boundary: " little" + " girl", " Lily" + "." .
  for (std::string stop : {"le gi", "ily.", "ball. She"}) {
    v1::GenerateRequest r = Ids(g.prompt, 150);
    r.add_stop(stop);
    r.add_stop("zzzz-never");
    CallOut o = Call(stub(), r);
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    const size_t at = full.find(stop);
    ASSERT_NE(at, std::string::npos) << stop;
    EXPECT_EQ(o.choices[0].text, full.substr(0, at)) << stop;
    EXPECT_EQ(o.choices[0].text.find(stop), std::string::npos);
    EXPECT_EQ(o.choices[0].finish, v1::FINISH_REASON_STOP);
    EXPECT_EQ(o.choices[0].stop_string, stop);
  }
  // A stop token id: returned as a token, its text not.
  v1::GenerateRequest r = Ids(g.prompt, 150);
  r.add_stop_token_ids(g.ids[5]);
  CallOut o = Call(stub(), r);
  ASSERT_TRUE(o.status.ok());
  EXPECT_EQ(o.choices[0].ids, std::vector<int32_t>(g.ids.begin(), g.ids.begin() + 6));
  EXPECT_EQ(o.choices[0].finish, v1::FINISH_REASON_STOP);
}

TEST_F(RouterE2eTest, NChoicesDifferAndLogprobsArrive) {
  v1::GenerateRequest r = Ids(Goldens()[1].prompt, 25);
  r.set_n(3);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(5);
  r.mutable_sampling()->set_top_logprobs(3);
  grpc::ClientContext ctx;
  auto reader = stub().Generate(&ctx, r);
  v1::GenerateResponse m;
  std::map<int, std::vector<int32_t>> ids;
  int entries = 0;
  while (reader->Read(&m)) {
    ids[m.index()].insert(ids[m.index()].end(), m.token_ids().begin(), m.token_ids().end());
    EXPECT_EQ(m.logprobs_size(), m.token_ids_size());
    for (const auto& e : m.logprobs()) {
      EXPECT_EQ(e.top_logprobs_size(), 3);
      EXPECT_LE(e.logprob(), 0);
      EXPECT_FALSE(e.token_bytes().empty());
      ++entries;
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(entries, 75);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  // The same request again gives the same three choices.
  CallOut again = Call(stub(), r);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.choices[i].ids, ids[i]);
}

TEST_F(RouterE2eTest, CancelFreesTheLaneAndItsBlocks) {
  grpc::ClientContext ctx;
  v1::GenerateRequest r = Ids(Goldens()[2].prompt, 490);
  auto reader = stub().Generate(&ctx, r);
  v1::GenerateResponse m;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reader->Read(&m));
  auto busy = State(stub());
  EXPECT_EQ(busy["ringlane-active-lanes"], 1);
  EXPECT_LT(busy["ringlane-kv-available-blocks"], busy["ringlane-kv-total-blocks"]);
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  std::map<std::string, int64_t> s;
  for (int i = 0; i < 100; ++i) {
    s = State(stub());
    if (s["ringlane-active-lanes"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s["ringlane-active-lanes"], 0);
  EXPECT_EQ(s["ringlane-kv-available-blocks"], s["ringlane-kv-total-blocks"]);
  CallOut after = Call(stub(), Ids(Goldens()[0].prompt, 4));
  EXPECT_TRUE(after.status.ok());
}

TEST_F(RouterE2eTest, HealthIsServing) {
  auto ch =
      grpc::CreateChannel(cluster_->router->address("router"), grpc::InsecureChannelCredentials());
  auto h = grpc::health::v1::Health::NewStub(ch);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(h->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(RouterE2eTest, TokenizeAndListModels) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text("Once upon a time");
  req.set_add_special_tokens(true);
  v1::TokenizeResponse resp;
  ASSERT_TRUE(stub().Tokenize(&ctx, req, &resp).ok());
  EXPECT_EQ(std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end()),
            Goldens()[0].prompt);
  EXPECT_GT(resp.max_context_tokens(), 0);
  grpc::ClientContext ctx2;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub().ListModels(&ctx2, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "stories260K");
  EXPECT_EQ(models.models(0).num_groups(), 1);
}

TEST_F(RouterE2eTest, GrpcCallsAreCountedInTheRouterMetrics) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(std::string("\xff"));
  v1::TokenizeResponse resp;
  EXPECT_EQ(stub().Tokenize(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Call(stub(), Ids(Goldens()[0].prompt, 3)).status.ok());
  auto m = testing::GetOnce(cluster_->http(), "/metrics");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->body, HasSubstr("ringlane_grpc_requests_total{code=\"3\",method=\"Tokenize\"}"));
  EXPECT_THAT(m->body, HasSubstr("ringlane_grpc_requests_total{code=\"0\",method=\"Generate\"}"));
}

}  // namespace
}  // namespace ringlane
