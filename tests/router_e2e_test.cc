// The router end to end: a real ringlane-router in front of real worker
// daemons, driven through the public gRPC Generate API the way a client
// would. Token ids are compared exactly (DESIGN.md, invariant 1).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ringlane/v1/generate.grpc.pb.h"
#include "router/tokenizer/tokenizer.h"
#include "services/flags_util.h"
#include "services/http_client.h"
#include "tests/support/daemon.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Daemon;
using ::testing::HasSubstr;
using testing::SourcePath;

const char* kWorker = RINGLANE_WORKER_BIN;
const char* kRouter = RINGLANE_ROUTER_BIN;
constexpr int kBlock = 16;

std::string Model() { return SourcePath("deploy/models/stories260K/stories260K.bin"); }
std::string Tok() { return SourcePath("deploy/models/stories260K/tok512.bin"); }

using Golden = testing::GoldenCase;
const std::vector<Golden>& Goldens() { return testing::GoldenCases(); }

const router::Tokenizer& Tokenizer() {
  static const auto* t = [] {
    auto r = router::LoadTokenizer(Tok());
    EXPECT_TRUE(r.ok()) << r.status();
    return r->release();
  }();
  return *t;
}

// Worker ranks of one group plus a router in front of them.
struct Cluster {
  std::vector<std::unique_ptr<Daemon>> workers;
  std::unique_ptr<Daemon> router;
  std::unique_ptr<v1::Generate::Stub> stub;
};

std::unique_ptr<Cluster> StartCluster(int world, std::vector<std::string> worker_extra,
                                      std::vector<std::string> router_extra) {
  auto c = std::make_unique<Cluster>();
  std::string addrs;
  for (int r = 0; r < world; ++r) {
    // Port 0: a cluster from `make serve` may hold the default ports.
    std::vector<std::string> a = {"--model=" + Model(), "--threads=1", absl::StrCat("--rank=", r),
                                  absl::StrCat("--world_size=", world), "--listen=127.0.0.1:0"};
    a.insert(a.end(), worker_extra.begin(), worker_extra.end());
    if (r > 0) a.push_back("--rendezvous=" + c->workers[0]->address());
    auto d = Daemon::Start(kWorker, a);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    addrs += (r ? "," : "") + (*d)->address();
    c->workers.push_back(std::move(*d));
  }
  std::vector<std::string> a = {"--workers=" + addrs, "--tokenizer=" + Tok(),
                                "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0"};
  a.insert(a.end(), router_extra.begin(), router_extra.end());
  auto r = Daemon::Start(kRouter, a, {"router"});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  c->router = std::move(*r);
  c->stub = v1::Generate::NewStub(
      grpc::CreateChannel(c->router->address("router"), grpc::InsecureChannelCredentials()));
  // Ready once ListModels reports a ready group.
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    v1::ListModelsResponse resp;
    if (c->stub->ListModels(&ctx, {}, &resp).ok() && resp.models_size() == 1 &&
        resp.models(0).num_ready_groups() == 1) {
      return c;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "the router never became ready: " << c->router->Stderr();
  return nullptr;
}

struct ChoiceOut {
  std::vector<int32_t> ids;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  std::string stop_string;
  int messages = 0;
};

struct CallOut {
  grpc::Status status;
  std::map<int, ChoiceOut> choices;
  v1::Usage usage;
  bool has_usage = false;
};

CallOut Call(v1::Generate::Stub& stub, const v1::GenerateRequest& req) {
  CallOut out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ChoiceOut& c = out.choices[m.index()];
    c.ids.insert(c.ids.end(), m.token_ids().begin(), m.token_ids().end());
    c.text += m.text();
    ++c.messages;
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) c.finish = m.finish_reason();
    if (m.has_stop_string()) c.stop_string = m.stop_string();
    if (m.has_usage()) {
      out.usage = m.usage();
      out.has_usage = true;
    }
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest Ids(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

// Trailing metadata of ListModels: the router's live state.
std::map<std::string, int64_t> State(v1::Generate::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  EXPECT_TRUE(stub.ListModels(&ctx, {}, &resp).ok());
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    out[std::string(k.data(), k.size())] = std::stoll(std::string(v.data(), v.size()));
  }
  return out;
}

class RouterE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = StartCluster(2, {"--block_size=16"}, {"--log_level=info"}).release();
  }
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
  static void SetUpTestSuite() {
    cluster_ = StartCluster(2, {"--block_size=16"}, {"--pipeline_depth=1"}).release();
  }
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
    CallOut cold = Call(stub(), r);
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    EXPECT_EQ(cold.usage.cached_tokens(), 0) << "n=" << n;
    const int64_t before = State(stub())["ringlane-prefilled-tokens"];
    CallOut warm = Call(stub(), r);
    ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
    const int cached = (n - 1) / kBlock * kBlock;
    EXPECT_EQ(warm.usage.cached_tokens(), cached) << "n=" << n;
    // Only the uncached rest of the prompt was fed.
    EXPECT_EQ(State(stub())["ringlane-prefilled-tokens"] - before, n - cached) << "n=" << n;
    EXPECT_EQ(warm.choices[0].ids, cold.choices[0].ids) << "n=" << n;
    EXPECT_EQ(warm.choices[0].text, cold.choices[0].text) << "n=" << n;
  }
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
  auto hp = services::ParseHostPort(cluster_->router->address("http"));
  ASSERT_TRUE(hp.ok());
  auto http = services::HttpClient::Connect(hp->first, hp->second, absl::Seconds(5));
  ASSERT_TRUE(http.ok()) << http.status();
  auto m = (*http)->Send({.target = "/metrics"}, absl::Seconds(10));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->body, HasSubstr("ringlane_grpc_requests_total{code=\"3\",method=\"Tokenize\"}"));
  EXPECT_THAT(m->body, HasSubstr("ringlane_grpc_requests_total{code=\"0\",method=\"Generate\"}"));
}

// A pool too small for three long lanes at once: the youngest is preempted
// and recomputed, and every output still equals the golden ids.
TEST(RouterPreemptionTest, RecomputeKeepsOutputsIdentical) {
  auto c = StartCluster(1, {"--kv_blocks=30", "--block_size=16"}, {});
  ASSERT_NE(c, nullptr);
  std::vector<CallOut> outs(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      outs[i] = Call(*c->stub, Ids(Goldens()[i].prompt, static_cast<int>(Goldens()[i].ids.size())));
    });
  }
  for (auto& t : ts) t.join();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(outs[i].status.ok()) << outs[i].status.error_message();
    EXPECT_EQ(outs[i].choices[0].ids, Goldens()[i].ids) << i;
  }
  EXPECT_THAT(c->router->Stderr(), HasSubstr("preempting lane"));
}

// A worker dies mid-generation: its lanes fail with UNAVAILABLE, and once a
// worker serves at the same address again the router reconnects (new epoch,
// empty ledger) and serves.
TEST(RouterFailoverTest, WorkerDeathFailsItsLanesAndTheRouterReconnects) {
  auto c = StartCluster(1, {"--block_size=16"}, {"--connect_timeout_ms=500"});
  ASSERT_NE(c, nullptr);
  const std::string addr = c->workers[0]->address();
  {
    grpc::ClientContext ctx;
    auto reader = c->stub->Generate(&ctx, Ids(Goldens()[0].prompt, 400));
    v1::GenerateResponse m;
    ASSERT_TRUE(reader->Read(&m));
    c->workers[0]->Signal(SIGKILL);
    while (reader->Read(&m)) {
    }
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(st.error_message(), HasSubstr("worker group 0 failed"));
  }
  c->workers[0]->Wait(std::chrono::seconds(5));
  CallOut down = Call(*c->stub, Ids(Goldens()[0].prompt, 4));
  EXPECT_EQ(down.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  auto w = Daemon::Start(
      kWorker, {"--model=" + Model(), "--threads=1", "--block_size=16", "--listen=" + addr});
  ASSERT_TRUE(w.ok()) << w.status();
  c->workers[0] = std::move(*w);
  CallOut up;
  for (int i = 0; i < 100; ++i) {
    up = Call(*c->stub, Ids(Goldens()[0].prompt, 8));
    if (up.status.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(up.choices[0].ids,
            std::vector<int32_t>(Goldens()[0].ids.begin(), Goldens()[0].ids.begin() + 8));
}

// Chunked prefill inside decode rounds, read back from the round log: three
// lanes decode while a 400-token prompt arrives with a 64-token round
// budget, so the prompt needs several chunks. No round may feed more than
// the budget, every round that carries a chunk of the prompt must also carry
// a decode row of each decoding lane, and the decoding lanes' tokens must
// equal their solo tokens.
class RouterRoundsTest : public ::testing::TestWithParam<int> {};

std::vector<nlohmann::json> ReadRoundLog(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST_P(RouterRoundsTest, ChunkedPrefillInsideDecodeRounds) {
  const int depth = GetParam();
  constexpr int kBudget = 64, kDecodeTokens = 160, kLongPrompt = 400;
  const std::string log =
      absl::StrCat(::testing::TempDir(), "/router_rounds_", getpid(), "_", depth, ".jsonl");
  auto c = StartCluster(1, {"--block_size=16"},
                        {absl::StrCat("--round_token_budget=", kBudget), "--round_log=" + log,
                         absl::StrCat("--pipeline_depth=", depth)});
  ASSERT_NE(c, nullptr);
  auto decode_req = [&](int i, const std::string& id) {
    v1::GenerateRequest r = Ids(Goldens()[i].prompt, kDecodeTokens);
    r.set_request_id(id);
    return r;
  };
  std::vector<CallOut> solo;
  for (int i = 0; i < 3; ++i) {
    solo.push_back(Call(*c->stub, decode_req(i, absl::StrCat("solo-", i))));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
  }

  std::vector<CallOut> together(3);
  std::vector<std::atomic<int>> seen(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      auto reader = c->stub->Generate(&ctx, decode_req(i, absl::StrCat("dec-", i)));
      v1::GenerateResponse m;
      while (reader->Read(&m)) {
        together[i].choices[0].ids.insert(together[i].choices[0].ids.end(), m.token_ids().begin(),
                                          m.token_ids().end());
        seen[i] += m.token_ids_size();
      }
      together[i].status = reader->Finish();
    });
  }
  // The long prompt arrives once all three decode.
  for (int w = 0; w < 2000; ++w) {
    if (seen[0] >= 4 && seen[1] >= 4 && seen[2] >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<int32_t> prompt = {1};
  for (int k = 1; k < kLongPrompt; ++k) prompt.push_back(260 + (k * 13) % 240);
  v1::GenerateRequest long_req = Ids(prompt, 4);
  long_req.set_request_id("long");
  CallOut long_out = Call(*c->stub, long_req);
  for (auto& t : ts) t.join();
  ASSERT_TRUE(long_out.status.ok()) << long_out.status.error_message();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].choices[0].ids, solo[i].choices[0].ids) << "lane " << i;
  }

  std::vector<nlohmann::json> rounds = ReadRoundLog(log);
  ASSERT_FALSE(rounds.empty());
  int first = -1, last = -1, chunks = 0, fed = 0, ahead = 0;
  for (size_t k = 0; k < rounds.size(); ++k) {
    const nlohmann::json& r = rounds[k];
    EXPECT_EQ(r["budget"].get<int>(), kBudget);
    EXPECT_LE(r["tokens"].get<int>(), kBudget) << r.dump();
    if (r["in_flight"].get<int>() > 0) ++ahead;
    EXPECT_LT(r["in_flight"].get<int>(), depth) << r.dump();
    for (const auto& row : r["rows"]) {
      if (row["request"] == "long" && row["kind"] == "prefill") {
        if (first < 0) first = static_cast<int>(k);
        last = static_cast<int>(k);
        ++chunks;
        fed += row["tokens"].get<int>();
      }
    }
  }
  ASSERT_GE(first, 0) << "the long prompt was never prefilled";
  EXPECT_EQ(fed, kLongPrompt);
  EXPECT_GE(chunks, kLongPrompt / kBudget) << "the prompt was not chunked";
  for (int k = first; k <= last; ++k) {
    for (int i = 0; i < 3; ++i) {
      const std::string id = absl::StrCat("dec-", i);
      bool decoded = false;
      for (const auto& row : rounds[k]["rows"]) {
        decoded |= row["request"] == id && row["kind"] == "decode";
      }
      EXPECT_TRUE(decoded) << id << " got no token in round " << rounds[k].dump();
    }
  }
  // Pipelined rounds are sent while the previous one runs; unpipelined never.
  if (depth == 1) {
    EXPECT_EQ(ahead, 0);
  } else {
    EXPECT_GT(ahead, static_cast<int>(rounds.size()) / 2);
  }
  std::remove(log.c_str());
}

INSTANTIATE_TEST_SUITE_P(PipelineDepth, RouterRoundsTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("depth", info.param); });

TEST(RouterDaemonTest, BadFlagsExitNonZero) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--tokenizer=" + Tok()}, "--workers is required"},
      {{"--workers=127.0.0.1:1"}, "--tokenizer is required"},
      {{"--workers=nohost", "--tokenizer=" + Tok()}, "--workers"},
      {{"--workers=127.0.0.1:1", "--tokenizer=/nonexistent"}, "--tokenizer"},
      {{"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:99999"}, "--listen"},
      {{"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--seed_policy=dice"}, "--seed_policy"},
      {{"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--max_lanes=0"}, "--max_lanes"},
      {{"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--log_level=loud"}, "--log_level"},
      {{"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--pipeline_depth=3"}, "--pipeline_depth"},
  };
  for (const Case& c : cases) {
    testing::RunResult r = testing::RunToExit(kRouter, c.args);
    EXPECT_NE(r.code, 0) << ::testing::PrintToString(c.args);
    EXPECT_THAT(r.err, HasSubstr(c.message)) << ::testing::PrintToString(c.args);
  }
}

TEST(RouterDaemonTest, WithoutWorkersItServesUnavailable) {
  auto r = Daemon::Start(kRouter,
                         {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--connect_timeout_ms=200"},
                         {"router"});
  ASSERT_TRUE(r.ok()) << r.status();
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel((*r)->address("router"), grpc::InsecureChannelCredentials()));
  CallOut o = Call(*stub, Ids(Goldens()[0].prompt, 4));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(o.status.error_message(), HasSubstr("127.0.0.1:1"));
  auto h = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel((*r)->address("router"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(h->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace ringlane
