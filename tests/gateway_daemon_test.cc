// The gateway's options end to end, each on a cluster of its own (real
// workers, a real ringlane-router, HTTP from a real client): the loop
// watchdog, API keys, readiness without workers, the drain on SIGTERM, the
// waiting queue and the KV pool's limits, and flags it refuses. The API on
// one shared cluster: gateway_e2e_test.cc.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/http_client.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"

namespace ringlane {
namespace {

using nlohmann::json;
using services::HttpRequestSpec;
using services::HttpResponse;
using testing::Cluster;
using testing::Get;
using ::testing::HasSubstr;
using testing::Json;
using testing::kRouterBin;
using testing::Metric;
using testing::Post;
constexpr char kModel[] = "stories260K";
std::string Tok() { return testing::StoriesTokenizer(); }

// One worker group of `world` ranks (none when world is 0: the router then
// points at a port nobody serves) and a router with its gateway, ready
// unless `wait_ready` is false.
std::unique_ptr<Cluster> StartCluster(int world, std::vector<std::string> router_extra = {},
                                      bool wait_ready = true,
                                      std::vector<std::string> worker_extra = {}) {
  router_extra.insert(router_extra.begin(), "--connect_timeout_ms=300");
  return testing::StartCluster({.world = world,
                                .worker_flags = std::move(worker_extra),
                                .router_flags = std::move(router_extra),
                                .ready = wait_ready ? testing::ClusterOptions::Ready::kHttp
                                                    : testing::ClusterOptions::Ready::kListening});
}

TEST(GatewayLoopTest, WatchdogStopsALoopAndLeavesOtherTextAlone) {
  auto c = StartCluster(1, {"--loop_stop_tokens=64"});
  ASSERT_NE(c, nullptr);
  auto client = c->Client();
  // Greedy decoding of this tiny model from "Tom" falls into a cycle after
  // ~360 tokens ("It is not angry." over and over; seen with
  // ringlane-generate --max_tokens=480), so a 64-token stop ends it early.
  json loop = {{"model", kModel},
               {"prompt", "Tom"},
               {"max_tokens", 400},
               {"temperature", 0},
               {"ignore_eos", true}};
  json j = Json(Post(*client, "/v1/completions", loop.dump()));
  ASSERT_TRUE(j.contains("choices")) << j.dump();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "loop") << j.dump();
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 400);
  // The same request with the watchdog off runs to its length.
  loop["loop_watchdog"] = false;
  json off = Json(Post(*client, "/v1/completions", loop.dump()));
  EXPECT_EQ(off["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(off["usage"]["completion_tokens"], 400);
  // A sampled generation of the same length does not loop.
  json sampled = {{"model", kModel},  {"prompt", "Tom"}, {"max_tokens", 400},
                  {"temperature", 1}, {"seed", 3},       {"ignore_eos", true}};
  json s = Json(Post(*client, "/v1/completions", sampled.dump()));
  EXPECT_EQ(s["choices"][0]["finish_reason"], "length") << s.dump();

  const std::string m = Get(*client, "/metrics").body;
  EXPECT_EQ(Metric(m, "ringlane_loops_stopped_total"), 1);
  EXPECT_GE(Metric(m, "ringlane_loops_detected_total"), 1);
  EXPECT_TRUE(c->router->WaitForStderr("loop detected", std::chrono::seconds(5)));
  EXPECT_THAT(c->router->Stderr(), HasSubstr("request "));
}

TEST(GatewayAuthTest, KeysCoverEveryRouteButLivenessAndReadiness) {
  const std::string keys = ::testing::TempDir() + "/gateway_keys.txt";
  std::ofstream(keys) << "# test keys\nsecret-1\n";
  auto c = StartCluster(1, {"--api_key_file=" + keys}, /*wait_ready=*/false);
  ASSERT_NE(c, nullptr);
  auto client = c->Client();
  for (int i = 0; i < 600 && Get(*client, "/ready").status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(Get(*client, "/health").status, 200);
  EXPECT_EQ(Get(*client, "/ready").status, 200);
  EXPECT_EQ(Get(*client, "/metrics").status, 200);  // --metrics_require_key is off
  const std::string body = R"({"model":"stories260K","prompt":"Lily","max_tokens":2})";
  HttpResponse none = Post(*client, "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(Json(none)["error"]["type"], "authentication_error");
  EXPECT_EQ(Post(*client, "/v1/completions", body, {{"Authorization", "Bearer nope"}}).status, 401);
  EXPECT_EQ(Get(*client, "/v1/models").status, 401);
  EXPECT_EQ(Post(*client, "/v1/completions", body, {{"Authorization", "Bearer secret-1"}}).status,
            200);
  EXPECT_EQ(Get(*client, "/v1/models", {{"Authorization", "Bearer secret-1"}}).status, 200);
}

TEST(GatewayReadinessTest, LiveButNotReadyWithoutWorkers) {
  auto c = StartCluster(0, {}, /*wait_ready=*/false);
  ASSERT_NE(c, nullptr);
  auto client = c->Client();
  EXPECT_EQ(Get(*client, "/health").status, 200);
  HttpResponse ready = Get(*client, "/ready");
  EXPECT_EQ(ready.status, 503);
  HttpResponse r = Post(*client, "/v1/completions", R"({"model":"stories260K","prompt":"x"})");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_FALSE(r.headers["retry-after"].empty());
  EXPECT_EQ(Json(r)["error"]["type"], "service_unavailable_error");
}

TEST(GatewayDrainTest, SigtermStopsReadinessAndLetsRunningStreamsFinish) {
  // A drain long enough for the stream below on a slow (sanitized) build; the
  // default 5 s cuts it there, as it should.
  auto c = StartCluster(1, {"--drain_timeout_ms=60000"});
  ASSERT_NE(c, nullptr);
  auto client = c->Client();
  json body = {{"model", kModel},    {"prompt", "Once upon a time"}, {"max_tokens", 450}, {"n", 4},
               {"ignore_eos", true}, {"loop_watchdog", false},       {"stream", true}};
  HttpRequestSpec spec{.method = "POST", .target = "/v1/completions", .body = body.dump()};
  std::string streamed;
  bool signalled = false;
  HttpResponse during_ready, during_generate;
  auto other = c->Client();
  auto r = client->Stream(
      spec,
      [&](std::string_view data) {
        streamed += data;
        if (!signalled) {
          signalled = true;
          c->router->Signal(SIGTERM);
          // Give the signal a moment to reach the gateway.
          for (int i = 0; i < 100 && Get(*other, "/ready").status == 200; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          during_ready = Get(*other, "/ready");
          during_generate = Post(*other, "/v1/completions",
                                 R"({"model":"stories260K","prompt":"x","max_tokens":2})");
        }
        return true;
      },
      absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(during_ready.status, 503);
  EXPECT_THAT(during_ready.body, HasSubstr("draining"));
  EXPECT_EQ(during_generate.status, 503) << during_generate.body;
  // The stream that was running when the signal came ran to its end.
  EXPECT_THAT(streamed, HasSubstr("data: [DONE]"));
  std::optional<int> code = c->router->Wait(std::chrono::seconds(15));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << c->router->Stderr();
}

TEST(GatewayQueueTest, AFullWaitingQueueAnswers429WithRetryAfter) {
  auto c = StartCluster(1, {"--max_lanes=1", "--max_waiting=1", "--max_concurrent_per_key=0"});
  ASSERT_NE(c, nullptr);
  // A holds the only lane, B waits for it, C finds the queue full.
  std::atomic<bool> release{false};
  std::atomic<int> started{0};
  std::thread a(testing::HoldStream, c->http(), &started, &release);
  while (started.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::thread b(testing::HoldStream, c->http(), &started, &release);
  auto client = c->Client();
  for (int i = 0; i < 200; ++i) {
    if (Metric(Get(*client, "/metrics").body, "ringlane_lanes_waiting") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  HttpResponse r =
      Post(*client, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":2})");
  release = true;
  a.join();
  b.join();
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_THAT(r.body, HasSubstr("max_waiting"));
}

TEST(GatewayKvTest, APromptLargerThanTheKvPoolIsA400NotA429) {
  // 4 blocks of 16 tokens: a 100-token prompt fits the context (512) but
  // never the pool, so retrying cannot help.
  auto c = StartCluster(1, {}, true, {"--kv_blocks=4", "--block_size=16"});
  ASSERT_NE(c, nullptr);
  auto client = c->Client();
  std::vector<int> ids(100, 300);
  ids[0] = 1;
  HttpResponse r = Post(*client, "/v1/completions",
                        json{{"model", kModel}, {"prompt", ids}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("KV blocks"));
  HttpResponse ok =
      Post(*client, "/v1/completions", R"({"model":"stories260K","prompt":"Lily","max_tokens":3})");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(GatewayFlagsTest, RefusesAnOpenNonLoopbackListenerWithoutKeys) {
  testing::RunResult r =
      testing::RunToExit(kRouterBin, {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(),
                                      "--listen=127.0.0.1:0", "--http_listen=0.0.0.0:0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("no API keys"));
  r = testing::RunToExit(kRouterBin,
                         {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--chat_template=jinja"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--chat_template"));
  r = testing::RunToExit(kRouterBin,
                         {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--loop_flag_repeats=1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--loop_"));
}

}  // namespace
}  // namespace ringlane
