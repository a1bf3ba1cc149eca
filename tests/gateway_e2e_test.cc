// The OpenAI-compatible gateway end to end: real worker daemons, a real
// ringlane-router, and HTTP from a real client (services/http_client.h) the
// way curl or an OpenAI SDK would talk to it. One cluster serves every test
// here; the gateway's options, each on a cluster of its own, are in
// gateway_daemon_test.cc.
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
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/http_client.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

using nlohmann::json;
using services::HttpRequestSpec;
using services::HttpResponse;
using testing::Cluster;
using testing::Get;
using ::testing::HasSubstr;
using testing::Json;
using testing::Metric;
using testing::Post;
constexpr char kModel[] = "stories260K";

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = testing::StartCluster(
                   {.world = 2,
                    .router_flags = {"--connect_timeout_ms=300", "--max_body_bytes=65536",
                                     "--max_concurrent_per_key=2"},
                    .ready = testing::ClusterOptions::Ready::kHttp})
                   .release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    client_ = cluster_->Client();
    ASSERT_NE(client_, nullptr);
  }
  static Cluster* cluster_;
  std::unique_ptr<services::HttpClient> client_;
};
Cluster* GatewayTest::cluster_ = nullptr;

TEST_F(GatewayTest, GoldenTextComesBackThroughCompletions) {
  for (const testing::GoldenCase& g : testing::GoldenCases()) {
    const json body = testing::GoldenEchoBody(g);
    HttpResponse r = Post(*client_, "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json j = Json(r);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["model"], kModel);
    EXPECT_EQ(j["choices"][0]["text"], g.text) << "prompt '" << g.prompt_text << "'";
    EXPECT_EQ(j["usage"]["prompt_tokens"], g.prompt.size());
    // The last golden id is BOS when the reference stopped on it: the
    // router stops there too and counts it.
    EXPECT_EQ(j["usage"]["completion_tokens"], g.ids.size());
    EXPECT_EQ(j["usage"]["total_tokens"], g.prompt.size() + g.ids.size());
  }
}

TEST_F(GatewayTest, StreamedTextEqualsNonStreamedTextWithUsage) {
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool chat = std::string(path) == "/v1/chat/completions";
    json body = {{"model", kModel}, {"max_tokens", 40}, {"temperature", 0.8},
                 {"seed", 7},       {"n", 2},           {"stop", {"park"}}};
    if (chat) {
      body["messages"] = {{{"role", "user"}, {"content", "Tell me a story"}}};
      body["logprobs"] = true;
      body["top_logprobs"] = 2;
    } else {
      body["prompt"] = "Once upon a time";
      body["logprobs"] = 2;
    }
    HttpResponse whole = Post(*client_, path, body.dump());
    ASSERT_EQ(whole.status, 200) << whole.body;
    json w = Json(whole);
    ASSERT_EQ(w["choices"].size(), 2u);

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    testing::SseStream s = testing::PostSse(*client_, path, body.dump());
    EXPECT_TRUE(s.transport.ok()) << s.transport;
    EXPECT_EQ(s.malformed, 0) << "an event that is not JSON";
    ASSERT_EQ(s.status, 200);
    EXPECT_TRUE(s.done);
    std::map<int, std::string> text;
    std::map<int, std::string> finish;
    std::map<int, int> logprob_entries;
    json usage;
    for (const json& e : s.events) {
      EXPECT_EQ(e["object"], chat ? "chat.completion.chunk" : "text_completion");
      if (!e["usage"].is_null()) usage = e["usage"];
      for (const json& c : e["choices"]) {
        const int i = c["index"];
        if (chat) {
          if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
        } else {
          text[i] += c["text"].get<std::string>();
        }
        if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
        if (!c["logprobs"].is_null()) {
          logprob_entries[i] +=
              chat ? c["logprobs"]["content"].size() : c["logprobs"]["token_logprobs"].size();
        }
      }
    }
    ASSERT_FALSE(usage.is_null()) << "no usage chunk";
    // The same counts, but the resend found its prompt cached.
    for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) {
      EXPECT_EQ(usage[k], w["usage"][k]) << path << " " << k;
    }
    int completion = 0;
    for (int i = 0; i < 2; ++i) {
      const json& c = w["choices"][i];
      const std::string t =
          chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
      EXPECT_EQ(text[i], t) << path << " choice " << i;
      EXPECT_EQ(finish[i], c["finish_reason"]) << path;
      EXPECT_THAT(t, ::testing::Not(HasSubstr("park")));
      const int entries =
          chat ? c["logprobs"]["content"].size() : c["logprobs"]["token_logprobs"].size();
      EXPECT_EQ(logprob_entries[i], entries);
      completion += entries;
    }
    // One logprob entry per generated token: usage counts the same tokens.
    EXPECT_EQ(w["usage"]["completion_tokens"], completion) << path;
    EXPECT_NE(text[0], text[1]) << "n=2 choices sample their own streams";
  }
}

TEST_F(GatewayTest, SeedReproducesAndModelsTokenizeDetokenizeWork) {
  // Over one KV block (16 tokens), so that the resend finds a full block.
  json body = {{"model", kModel},
               {"prompt", "Once upon a time, there was a little girl named Lily. She loved to"},
               {"max_tokens", 30},
               {"temperature", 1.0},
               {"seed", 1234}};
  json a = Json(Post(*client_, "/v1/completions", body.dump()));
  json b = Json(Post(*client_, "/v1/completions", body.dump()));
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]) << a.dump() << "\n" << b.dump();
  // The identical resend reuses its kept prefix.
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << b.dump();

  json models = Json(Get(*client_, "/v1/models"));
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], kModel);
  EXPECT_EQ(models["data"][0]["object"], "model");

  json t =
      Json(Post(*client_, "/tokenize", json{{"model", kModel}, {"prompt", "Lily and Ben"}}.dump()));
  const auto& golden = testing::GoldenCases()[1];
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), golden.prompt);
  EXPECT_EQ(t["count"], golden.prompt.size());
  json d = Json(Post(*client_, "/detokenize", json{{"tokens", golden.ids}}.dump()));
  EXPECT_THAT(d["prompt"].get<std::string>(), HasSubstr("were playing in the park"));
}

TEST_F(GatewayTest, BadRequestsGetOpenAiErrorsAndTheDaemonKeepsServing) {
  struct Case {
    std::string name;
    std::string path;
    std::string body;
    int status;
    std::string message;
    // The field error.param names (null when empty): typed, never parsed
    // from the message.
    std::string param;
  };
  const std::string long_prompt(40000, 'a');  // ~ thousands of tokens: over the 512 context
  const std::vector<Case> cases = {
      {"invalid JSON", "/v1/completions", "{\"model\": ", 400, "not valid JSON", "body"},
      {"wrong type", "/v1/completions", R"({"model":"stories260K","prompt":"x","n":"2"})", 400,
       "expected an integer", "n"},
      {"unknown model", "/v1/completions", R"({"model":"gpt-9","prompt":"x"})", 404,
       "unknown model", "model"},
      {"negative max_tokens", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","max_tokens":-1})", 400, "max_tokens", "max_tokens"},
      {"huge max_tokens", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","max_tokens":100000})", 400, "context", "max_tokens"},
      {"prompt over the context", "/v1/completions",
       json{{"model", kModel}, {"prompt", long_prompt}}.dump(), 400, "context", "prompt"},
      {"five stops", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","stop":["a","b","c","d","e"]})", 400, "at most 4",
       "stop"},
      {"invalid UTF-8", "/v1/completions",
       std::string("{\"model\":\"stories260K\",\"prompt\":\"a\xff\xfe\"}"), 400, "UTF-8", "body"},
      {"unsupported field", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})",
       400, "functions", "functions"},
      {"tool without a function", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       400, "tools[0].function", "tools[0].function"},
      {"missing messages", "/v1/chat/completions", R"({"model":"stories260K"})", 400, "messages",
       "messages"},
      {"bad role", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"wizard","content":"x"}]})", 400, "wizard",
       "messages"},
      // The bound comes from the workers' GetInfo limits, checked before any
      // round is planned.
      {"top_logprobs over the workers' limit", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
       400, "top_logprobs", "top_logprobs"},
      {"body over the limit", "/v1/completions",
       json{{"model", kModel}, {"prompt", std::string(70000, 'b')}}.dump(), 413, "", ""},
      {"no route", "/v1/embeddings", "{}", 404, "no route", ""},
  };
  for (const Case& c : cases) {
    auto client = cluster_->Client();  // a 413 closes its connection
    HttpResponse r = Post(*client, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.name << ": " << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << c.name << ": " << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << c.name;
    EXPECT_TRUE(j["error"]["type"].is_string()) << c.name;
    EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code")) << c.name;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(j["error"]["param"], c.param.empty() ? json(nullptr) : json(c.param)) << c.name;
    // And a good request right after.
    auto good = cluster_->Client();
    HttpResponse ok =
        Post(*good, "/v1/completions", R"({"model":"stories260K","prompt":"Lily","max_tokens":3})");
    EXPECT_EQ(ok.status, 200) << "after " << c.name << ": " << ok.body;
  }
}

TEST_F(GatewayTest, DisconnectMidStreamFreesTheLaneWithinASecond) {
  json body = {{"model", kModel},    {"prompt", "Once upon a time"}, {"max_tokens", 400},
               {"ignore_eos", true}, {"loop_watchdog", false},       {"stream", true}};
  auto metrics = cluster_->Client();
  const double tokens_before =
      Metric(Get(*metrics, "/metrics").body, "ringlane_generation_tokens_total");
  HttpRequestSpec spec;
  spec.method = "POST";
  spec.target = "/v1/completions";
  spec.body = body.dump();
  int pieces = 0;
  auto r = client_->Stream(
      spec,
      [&](std::string_view) {
        // Hang up after a few tokens, with most of the generation left.
        return ++pieces < 3;
      },
      absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  const auto hung_up = std::chrono::steady_clock::now();
  double lanes = -1;
  while (std::chrono::steady_clock::now() - hung_up < std::chrono::seconds(1)) {
    lanes = Metric(Get(*metrics, "/metrics").body, "ringlane_lanes_running");
    if (lanes == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(lanes, 0) << "the lane still runs a second after the client went away";
  const std::string text = Get(*metrics, "/metrics").body;
  // This model makes 400 tokens in well under a second here, so the lane
  // being gone is not enough: it must have stopped early.
  EXPECT_LT(Metric(text, "ringlane_generation_tokens_total") - tokens_before, 200);
  EXPECT_GE(Metric(text, "ringlane_http_client_disconnects_total"), 1);
  EXPECT_GE(Metric(text, "ringlane_generate_requests_total", "outcome=\"cancelled\""), 1);
}

TEST_F(GatewayTest, PerKeyConcurrencyLimitAnswers429WithRetryAfter) {
  // Two long streams hold both slots of the (anonymous) key.
  std::vector<std::thread> holders;
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  for (int i = 0; i < 2; ++i)
    holders.emplace_back(testing::HoldStream, cluster_->http(), &started, &release);
  while (started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  HttpResponse r =
      Post(*client_, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":2})");
  release = true;
  for (auto& t : holders) t.join();
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_THAT(r.body, HasSubstr("max_concurrent_per_key"));
}

// A client that sends its next request the moment it has read a response
// finds its key's slots free: the gateway gives them back before the last
// bytes go out, not after. With n = 2 one request takes both slots of the
// key, so a slot still held by the previous request answers 429 (the
// request after a stream's [DONE] did, now and then, under ctest -j2). The
// streamed requests here stop reading at [DONE], as SDK clients do, and the
// next one goes out at once.
TEST_F(GatewayTest, BackToBackRequestsOfOneKeyAreNeverTurnedAway) {
  // Streams an earlier test walked away from hold the key's slots until the
  // gateway notices (within its 20 ms client check): wait for them first.
  const std::string probe = R"({"model":"stories260K","prompt":"x","max_tokens":1,"n":2})";
  for (int tries = 0; Post(*client_, "/v1/completions", probe).status == 429; ++tries) {
    ASSERT_LT(tries, 100) << "the key's slots stay taken";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int i = 0; i < 60; ++i) {
    const bool stream = i % 2 == 1;
    json body = {{"model", kModel},
                 {"prompt", "Once upon a time"},
                 {"max_tokens", 2},
                 {"n", 2},
                 {"stream", stream}};
    if (!stream) {
      HttpResponse r = Post(*client_, "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << "request " << i << ": " << r.body;
      continue;
    }
    services::HttpRequestSpec spec;
    spec.method = "POST";
    spec.target = "/v1/completions";
    spec.body = body.dump();
    services::SseParser sse;
    bool done = false;
    absl::StatusOr<services::HttpResponse> r = client_->Stream(
        spec,
        [&](std::string_view data) {
          sse.Feed(data, [&](std::string_view ev) { done = done || ev == "[DONE]"; });
          return !done;
        },
        absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << "request " << i << ": " << r->body;
    EXPECT_TRUE(done) << "request " << i;
  }
}

TEST_F(GatewayTest, MetricsParseAndCountersMove) {
  // Lanes of earlier tests' cancelled streams may still be winding down.
  std::string before = Get(*client_, "/metrics").body;
  for (int i = 0; i < 100 && Metric(before, "ringlane_lanes_running") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    before = Get(*client_, "/metrics").body;
  }
  HttpResponse r = Post(*client_, "/v1/completions",
                        R"({"model":"stories260K","prompt":"Lily and Ben","max_tokens":12})");
  ASSERT_EQ(r.status, 200);
  const int completion = Json(r)["usage"]["completion_tokens"];
  HttpResponse m = Get(*client_, "/metrics");
  EXPECT_THAT(m.headers["content-type"], HasSubstr("text/plain"));
  const std::string after = m.body;
  EXPECT_EQ(Metric(after, "ringlane_generation_tokens_total") -
                Metric(before, "ringlane_generation_tokens_total"),
            completion);
  EXPECT_GT(Metric(after, "ringlane_prompt_tokens_total"),
            Metric(before, "ringlane_prompt_tokens_total"));
  EXPECT_GT(
      Metric(after, "ringlane_http_requests_total", "endpoint=\"/v1/completions\",status=\"200\""),
      Metric(before, "ringlane_http_requests_total",
             "endpoint=\"/v1/completions\",status=\"200\""));
  EXPECT_GT(Metric(after, "ringlane_time_to_first_token_seconds_count"),
            Metric(before, "ringlane_time_to_first_token_seconds_count"));
  EXPECT_GT(Metric(after, "ringlane_rounds_total"), Metric(before, "ringlane_rounds_total"));
  EXPECT_GT(Metric(after, "ringlane_requests_default_temperature_total"),
            Metric(before, "ringlane_requests_default_temperature_total"));
  EXPECT_GT(Metric(after, "ringlane_kv_blocks_capacity"), 0);
  EXPECT_THAT(after, HasSubstr("model=\"stories260K\""));

  // A Prometheus parser agrees it is valid text exposition.
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0) GTEST_SKIP() << "promtool not installed (Debian: prometheus)";
  const std::string path = ::testing::TempDir() + "/gateway_metrics.txt";
  std::ofstream(path) << after;
  const std::string cmd = absl::StrCat(promtool, " check metrics < ", path, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace ringlane
