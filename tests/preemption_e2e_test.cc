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
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "services/flags_util.h"
#include "services/http_client.h"
#include "tests/support/daemon.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Daemon;
using testing::SourcePath;

std::string Model() { return SourcePath("deploy/models/stories260K/stories260K.bin"); }
std::string Tok() { return SourcePath("deploy/models/stories260K/tok512.bin"); }

struct Cluster {
  std::vector<std::unique_ptr<Daemon>> workers;
  std::unique_ptr<Daemon> router;
  std::unique_ptr<v1::Generate::Stub> stub;
};

std::unique_ptr<Cluster> StartCluster(int world, const std::vector<std::string>& worker_extra,
                                      const std::vector<std::string>& router_extra) {
  auto c = std::make_unique<Cluster>();
  std::string addrs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> a = {"--model=" + Model(), "--threads=1", absl::StrCat("--rank=", r),
                                  absl::StrCat("--world_size=", world), "--listen=127.0.0.1:0"};
    a.insert(a.end(), worker_extra.begin(), worker_extra.end());
    if (r > 0) a.push_back("--rendezvous=" + c->workers[0]->address());
    auto d = Daemon::Start(RINGLANE_WORKER_BIN, a);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    addrs += (r ? "," : "") + (*d)->address();
    c->workers.push_back(std::move(*d));
  }
  std::vector<std::string> a = {"--workers=" + addrs, "--tokenizer=" + Tok(),
                                "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0"};
  a.insert(a.end(), router_extra.begin(), router_extra.end());
  auto r = Daemon::Start(RINGLANE_ROUTER_BIN, a, {"router", "http"});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  c->router = std::move(*r);
  c->stub = v1::Generate::NewStub(
      grpc::CreateChannel(c->router->address("router"), grpc::InsecureChannelCredentials()));
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

// Everything a client sees of one choice, in a form gtest can compare and
// print. Logprobs are compared as floats bit for bit (==), not within a
// tolerance: the invariant is byte identity.
struct ChoiceOut {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  // Per token: the alternatives' ids and logprobs, flattened.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  std::string stop_string;
};

struct CallOut {
  grpc::Status status;
  std::map<int, ChoiceOut> choices;
  int completion_tokens = -1;
};

CallOut Call(v1::Generate::Stub& stub, const v1::GenerateRequest& req) {
  CallOut out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(240));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ChoiceOut& c = out.choices[m.index()];
    c.ids.insert(c.ids.end(), m.token_ids().begin(), m.token_ids().end());
    for (const v1::LogprobEntry& e : m.logprobs()) {
      c.logprobs.push_back(e.logprob());
      for (const v1::TokenLogprob& a : e.top_logprobs()) {
        c.top_ids.push_back(a.token_id());
        c.top_logprobs.push_back(a.logprob());
      }
    }
    c.text += m.text();
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) c.finish = m.finish_reason();
    if (m.has_stop_string()) c.stop_string = m.stop_string();
    if (m.has_usage()) out.completion_tokens = m.usage().completion_tokens();
  }
  out.status = reader->Finish();
  return out;
}

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

double Metric(const std::string& text, const std::string& name) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const std::string l(line);
    if (l.rfind(name, 0) != 0) continue;
    const char next = l.size() > name.size() ? l[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    sum += std::stod(l.substr(l.rfind(' ') + 1));
  }
  return sum;
}

double Preemptions(const Cluster& c) {
  auto hp = services::ParseHostPort(c.router->address("http"));
  EXPECT_TRUE(hp.ok());
  if (!hp.ok()) return -1;
  auto http = services::HttpClient::Connect(hp->first, hp->second, absl::Seconds(5));
  EXPECT_TRUE(http.ok()) << http.status();
  if (!http.ok()) return -1;
  auto m = (*http)->Send({.target = "/metrics"}, absl::Seconds(10));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? Metric(m->body, "ringlane_preemptions_total") : -1;
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
  auto c = StartCluster(shape.world, {"--kv_blocks=30", "--block_size=16"},
                        {absl::StrCat("--pipeline_depth=", shape.pipeline_depth),
                         // Flags early enough that request 3 (negative
                         // penalties favour repeats) can end with `loop`.
                         "--loop_flag_repeats=3", "--loop_stop_tokens=24"});
  ASSERT_NE(c, nullptr);
  const std::vector<v1::GenerateRequest> reqs = Requests();

  std::vector<CallOut> solo;
  for (const auto& r : reqs) {
    solo.push_back(Call(*c->stub, r));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
  }
  ASSERT_EQ(Preemptions(*c), 0) << "a solo run was preempted; the pool is too small";

  // Twice over, so that the re-admitted lanes also meet their own cached
  // blocks from the first pass (positions the workers never see again).
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<CallOut> outs(reqs.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ts.emplace_back([&, i] { outs[i] = Call(*c->stub, reqs[i]); });
    }
    for (auto& t : ts) t.join();
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("pass ", pass, ", request ", i));
      ASSERT_TRUE(outs[i].status.ok()) << outs[i].status.error_message();
      ASSERT_EQ(outs[i].choices.size(), solo[i].choices.size());
      EXPECT_EQ(outs[i].completion_tokens, solo[i].completion_tokens);
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
