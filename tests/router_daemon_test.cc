// The router daemon under pressure and at fault, with real workers behind
// it: preemption and recompute when the KV pool is full, chunked prefill
// inside decode rounds read back from the round log, a worker that dies and
// returns, and the daemon's flags. The API's outputs: router_e2e_test.cc.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
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
#include "tests/support/cluster.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Call;
using testing::CallOut;
using ::testing::HasSubstr;
using testing::kRouterBin;
using testing::StartCluster;
using testing::StoriesTokenizer;

const std::vector<testing::GoldenCase>& Goldens() { return testing::GoldenCases(); }
v1::GenerateRequest Ids(const std::vector<int32_t>& prompt, int max_tokens) {
  return testing::GreedyRequest(prompt, max_tokens);
}
std::string Tok() { return StoriesTokenizer(); }

// A pool too small for three long lanes at once: the youngest is preempted
// and recomputed, and every output still equals the golden ids.
TEST(RouterPreemptionTest, RecomputeKeepsOutputsIdentical) {
  auto c = StartCluster({.worker_flags = {"--kv_blocks=30", "--block_size=16"}});
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
  auto c = StartCluster(
      {.worker_flags = {"--block_size=16"}, .router_flags = {"--connect_timeout_ms=500"}});
  ASSERT_NE(c, nullptr);
  {
    grpc::ClientContext ctx;
    auto reader = c->stub->Generate(&ctx, Ids(Goldens()[0].prompt, 400));
    v1::GenerateResponse m;
    ASSERT_TRUE(reader->Read(&m));
    c->workers->rank(0).Signal(SIGKILL);
    while (reader->Read(&m)) {
    }
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(st.error_message(), HasSubstr("worker group 0 failed"));
  }
  c->workers->rank(0).Wait(std::chrono::seconds(5));
  CallOut down = Call(*c->stub, Ids(Goldens()[0].prompt, 4));
  EXPECT_EQ(down.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(c->workers->Restart(0));
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
  auto c = StartCluster(
      {.worker_flags = {"--block_size=16"},
       .router_flags = {absl::StrCat("--round_token_budget=", kBudget), "--round_log=" + log,
                        absl::StrCat("--pipeline_depth=", depth)}});
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
  // What the prefix cache did not hold (BOS, shared with the other prompts,
  // is a token-granular hit).
  EXPECT_EQ(fed, kLongPrompt - long_out.usage.cached_tokens());
  EXPECT_LT(long_out.usage.cached_tokens(), 4);
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
    testing::RunResult r = testing::RunToExit(kRouterBin, c.args);
    EXPECT_NE(r.code, 0) << ::testing::PrintToString(c.args);
    EXPECT_THAT(r.err, HasSubstr(c.message)) << ::testing::PrintToString(c.args);
  }
}

TEST(RouterDaemonTest, WithoutWorkersItServesUnavailable) {
  // No workers: the router points at 127.0.0.1:1, where nobody serves.
  auto c = StartCluster({.world = 0,
                         .router_flags = {"--connect_timeout_ms=200"},
                         .ready = testing::ClusterOptions::Ready::kListening});
  ASSERT_NE(c, nullptr);
  CallOut o = Call(*c->stub, Ids(Goldens()[0].prompt, 4));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(o.status.error_message(), HasSubstr("127.0.0.1:1"));
  auto h = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(c->router->address("router"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(h->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace ringlane
