// The OpenAI-compatible gateway end to end: real worker daemons, a real
// ringlane-router, and HTTP from a real client (services/http_client.h) the
// way curl or an OpenAI SDK would talk to it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/http_client.h"
#include "tests/support/daemon.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

using nlohmann::json;
using services::HttpClient;
using services::HttpRequestSpec;
using services::HttpResponse;
using testing::Daemon;
using ::testing::HasSubstr;
using testing::SourcePath;

std::string Model() { return SourcePath("deploy/models/stories260K/stories260K.bin"); }
std::string Tok() { return SourcePath("deploy/models/stories260K/tok512.bin"); }
constexpr char kModel[] = "stories260K";

struct Cluster {
  std::vector<std::unique_ptr<Daemon>> workers;
  std::unique_ptr<Daemon> router;
  std::string host;
  int port = 0;

  std::unique_ptr<HttpClient> Client() const {
    auto c = HttpClient::Connect(host, port, absl::Seconds(5));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
};

// One worker group of `world` ranks (none when world is 0: the router then
// points at a port nobody serves) and a router with its gateway.
std::unique_ptr<Cluster> StartCluster(int world, std::vector<std::string> router_extra = {},
                                      bool wait_ready = true,
                                      std::vector<std::string> worker_extra = {}) {
  auto c = std::make_unique<Cluster>();
  std::string addrs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> a = {"--model=" + Model(), "--threads=1", absl::StrCat("--rank=", r),
                                  absl::StrCat("--world_size=", world), "--listen=127.0.0.1:0"};
    if (r > 0) a.push_back("--rendezvous=" + c->workers[0]->address());
    a.insert(a.end(), worker_extra.begin(), worker_extra.end());
    auto d = Daemon::Start(RINGLANE_WORKER_BIN, a);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    addrs += (r ? "," : "") + (*d)->address();
    c->workers.push_back(std::move(*d));
  }
  if (world == 0) addrs = "127.0.0.1:1";
  std::vector<std::string> a = {"--workers=" + addrs, "--tokenizer=" + Tok(),
                                "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                                "--connect_timeout_ms=300"};
  a.insert(a.end(), router_extra.begin(), router_extra.end());
  auto r = Daemon::Start(RINGLANE_ROUTER_BIN, a, {"router", "http"});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  c->router = std::move(*r);
  const std::string http = c->router->address("http");
  const size_t colon = http.rfind(':');
  c->host = http.substr(0, colon);
  c->port = std::stoi(http.substr(colon + 1));
  if (!wait_ready) return c;
  auto client = c->Client();
  for (int i = 0; client && i < 600; ++i) {
    auto resp = client->Send({.target = "/ready"}, absl::Seconds(5));
    if (resp.ok() && resp->status == 200) return c;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "the gateway never became ready: " << c->router->Stderr();
  return nullptr;
}

HttpResponse Post(HttpClient& c, const std::string& path, const std::string& body,
                  std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpRequestSpec spec;
  spec.method = "POST";
  spec.target = path;
  spec.body = body;
  spec.headers = std::move(headers);
  auto r = c.Send(spec, absl::Seconds(120));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

HttpResponse Get(HttpClient& c, const std::string& path,
                 std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpRequestSpec spec;
  spec.target = path;
  spec.headers = std::move(headers);
  auto r = c.Send(spec, absl::Seconds(30));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

json Json(const HttpResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

// A streamed request: its SSE events (JSON, and whether [DONE] ended it).
struct Streamed {
  int status = 0;
  std::vector<json> events;
  bool done = false;
};

Streamed PostStream(HttpClient& c, const std::string& path, const json& body) {
  Streamed s;
  services::SseParser sse;
  HttpRequestSpec spec;
  spec.method = "POST";
  spec.target = path;
  spec.body = body.dump();
  auto r = c.Stream(
      spec,
      [&](std::string_view data) {
        sse.Feed(data, [&](std::string_view ev) {
          if (ev == "[DONE]") {
            s.done = true;
          } else {
            s.events.push_back(json::parse(ev));
          }
        });
        return true;
      },
      absl::Seconds(120));
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) s.status = r->status;
  return s;
}

// The value of a metric (summed over its label sets that contain `labels`).
double Metric(const std::string& text, const std::string& name, const std::string& labels = "") {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const std::string l(line);
    if (l.rfind(name, 0) != 0) continue;
    const char next = l.size() > name.size() ? l[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    if (!labels.empty() && l.find(labels) == std::string::npos) continue;
    sum += std::stod(l.substr(l.rfind(' ') + 1));
  }
  return sum;
}

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = StartCluster(2, {"--max_body_bytes=65536", "--max_concurrent_per_key=2"}).release();
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
  std::unique_ptr<HttpClient> client_;
};
Cluster* GatewayTest::cluster_ = nullptr;

TEST_F(GatewayTest, GoldenTextComesBackThroughCompletions) {
  for (const testing::GoldenCase& g : testing::GoldenCases()) {
    json body = {{"model", kModel},
                 {"prompt", g.prompt_text},
                 {"max_tokens", g.ids.size()},
                 {"temperature", 0},
                 {"echo", true}};
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
    Streamed s = PostStream(*client_, path, body);
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
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
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
  };
  const std::string long_prompt(40000, 'a');  // ~ thousands of tokens: over the 512 context
  const std::vector<Case> cases = {
      {"invalid JSON", "/v1/completions", "{\"model\": ", 400, "not valid JSON"},
      {"wrong type", "/v1/completions", R"({"model":"stories260K","prompt":"x","n":"2"})", 400,
       "expected an integer"},
      {"unknown model", "/v1/completions", R"({"model":"gpt-9","prompt":"x"})", 404,
       "unknown model"},
      {"negative max_tokens", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","max_tokens":-1})", 400, "max_tokens"},
      {"huge max_tokens", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","max_tokens":100000})", 400, "context"},
      {"prompt over the context", "/v1/completions",
       json{{"model", kModel}, {"prompt", long_prompt}}.dump(), 400, "context"},
      {"five stops", "/v1/completions",
       R"({"model":"stories260K","prompt":"x","stop":["a","b","c","d","e"]})", 400, "at most 4"},
      {"invalid UTF-8", "/v1/completions",
       std::string("{\"model\":\"stories260K\",\"prompt\":\"a\xff\xfe\"}"), 400, "UTF-8"},
      {"unsupported field", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       400, "tools"},
      {"missing messages", "/v1/chat/completions", R"({"model":"stories260K"})", 400, "messages"},
      {"bad role", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"wizard","content":"x"}]})", 400, "wizard"},
      {"body over the limit", "/v1/completions",
       json{{"model", kModel}, {"prompt", std::string(70000, 'b')}}.dump(), 413, ""},
      {"no route", "/v1/embeddings", "{}", 404, "no route"},
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

// A long stream on its own connection that counts itself in `started` at
// its first chunk and hangs up once `release` is set: it holds a lane (or a
// place in the queue, or a per-key slot) for as long as a test needs.
void HoldStream(const Cluster& c, std::atomic<int>* started, const std::atomic<bool>* release) {
  auto client = c.Client();
  json body = {{"model", kModel},    {"prompt", "Lily"},       {"max_tokens", 450},
               {"ignore_eos", true}, {"loop_watchdog", false}, {"stream", true}};
  HttpRequestSpec spec{.method = "POST", .target = "/v1/completions", .body = body.dump()};
  bool counted = false;
  (void)client->Stream(
      spec,
      [&](std::string_view) {
        if (!counted) {
          counted = true;
          ++*started;
        }
        return !release->load();
      },
      absl::Seconds(60));
}

TEST_F(GatewayTest, PerKeyConcurrencyLimitAnswers429WithRetryAfter) {
  // Two long streams hold both slots of the (anonymous) key.
  std::vector<std::thread> holders;
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  for (int i = 0; i < 2; ++i)
    holders.emplace_back(HoldStream, std::cref(*cluster_), &started, &release);
  while (started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  HttpResponse r =
      Post(*client_, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":2})");
  release = true;
  for (auto& t : holders) t.join();
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_THAT(r.body, HasSubstr("max_concurrent_per_key"));
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
  std::thread a(HoldStream, std::cref(*c), &started, &release);
  while (started.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::thread b(HoldStream, std::cref(*c), &started, &release);
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
      testing::RunToExit(RINGLANE_ROUTER_BIN, {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(),
                                               "--listen=127.0.0.1:0", "--http_listen=0.0.0.0:0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("no API keys"));
  r = testing::RunToExit(RINGLANE_ROUTER_BIN,
                         {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--chat_template=jinja"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--chat_template"));
  r = testing::RunToExit(RINGLANE_ROUTER_BIN,
                         {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--loop_flag_repeats=1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--loop_"));
}

}  // namespace
}  // namespace ringlane
