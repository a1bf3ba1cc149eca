// Hostile clients against real daemons on loopback: one test per attack
// class of issue 13, each asserting what the client gets, that the router
// still serves, and that its resident memory grew less than a stated bound.
// The table printed at the end (stderr) is what the closing note quotes.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
using ::testing::HasSubstr;
using testing::Post;
using testing::RssMiB;
using testing::StatusLine;

constexpr char kModel[] = "stories260K";

struct Row {
  std::string attack;
  std::string got;
  double rss_before = 0;
  double rss_after = 0;
  int fds_before = 0;  // the router's open file descriptors
  int fds_after = 0;
};
std::vector<Row>& Table() {
  static auto* rows = new std::vector<Row>;
  return *rows;
}

class AttackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = testing::StartCluster({.router_flags = {"--http_first_byte_timeout_ms=1500",
                                                       "--max_concurrent_per_key=64"},
                                      .ready = testing::ClusterOptions::Ready::kHttp})
                   .release();
    ASSERT_NE(cluster_, nullptr);
    router_ = cluster_->router.get();
    const std::string& http = cluster_->http();
    port_ = std::stoi(http.substr(http.rfind(':') + 1));
  }
  static void TearDownTestSuite() {
    std::fprintf(stderr, "\n%-58s | %-34s | RSS MiB before -> after | fds\n", "attack",
                 "client got");
    for (const Row& r : Table()) {
      std::fprintf(stderr, "%-58s | %-34s | %.1f -> %.1f (%+.1f) | %d -> %d\n", r.attack.c_str(),
                   r.got.c_str(), r.rss_before, r.rss_after, r.rss_after - r.rss_before,
                   r.fds_before, r.fds_after);
    }
    delete cluster_;
    cluster_ = nullptr;
    router_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(router_, nullptr);
    rss_before_ = RssMiB(router_->pid());
    fds_before_ = testing::OpenFds(router_->pid());
  }
  // Records the row; asserts the router grew less than `bound_mib` and still
  // answers a real completion.
  void Finish(const std::string& attack, const std::string& got, double bound_mib) {
    const double after = RssMiB(router_->pid());
    Table().push_back(
        {attack, got, rss_before_, after, fds_before_, testing::OpenFds(router_->pid())});
    EXPECT_LT(after - rss_before_, bound_mib) << attack;
    // A key's slots come back when the router has finished a response, a
    // moment after its client read the last byte: a 429 then is the limit
    // still counting the attack's last stream, so it is asked again.
    HttpResponse r;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    do {
      auto c = Client();
      ASSERT_NE(c, nullptr);
      r = Post(*c, "/v1/completions", R"({"model":"stories260K","prompt":"Once","max_tokens":3})");
      if (r.status != 429) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    EXPECT_EQ(r.status, 200) << attack << ": the router no longer serves: " << r.body;
  }

  static std::unique_ptr<services::HttpClient> Client() { return cluster_->Client(); }
  static int ConnectRaw() { return testing::ConnectLoopback(port_); }
  // Sends `bytes` (as much as the server takes), returns what it answers
  // until it closes or 10 s pass.
  static std::string Exchange(const std::string& bytes) {
    return testing::RawExchange(port_, bytes);
  }

  static Cluster* cluster_;
  static testing::Daemon* router_;
  static int port_;
  double rss_before_ = 0;
  int fds_before_ = 0;
};
Cluster* AttackTest::cluster_ = nullptr;
testing::Daemon* AttackTest::router_ = nullptr;
int AttackTest::port_ = 0;

TEST_F(AttackTest, DeeplyNestedJsonIs400NotAStackOverflow) {
  const std::string deep = std::string(150000, '[') + std::string(150000, ']');
  auto c = Client();
  ASSERT_NE(c, nullptr);
  HttpResponse r =
      Post(*c, "/v1/completions",
           absl::StrCat(R"({"model":"stories260K","prompt":"x","logprobs":)", deep, "}"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("nested deeper than"));
  r = Post(*c, "/tokenize", absl::StrCat(R"({"prompt":)", deep, "}"));
  EXPECT_EQ(r.status, 400);
  Finish("JSON nested 150,000 deep (completions, tokenize)", "400 x2", 32);
}

TEST_F(AttackTest, EndlessChunkExtensionAndTrailerAre400) {
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string ext = Exchange(absl::StrCat(head, "5;e=", std::string(4 << 20, 'a')));
  EXPECT_EQ(StatusLine(ext), "HTTP/1.1 400 Bad Request") << ext.substr(0, 300);
  const std::string trailer =
      Exchange(absl::StrCat(head, "1\r\nx\r\n0\r\nX-T: ", std::string(4 << 20, 'b')));
  EXPECT_EQ(StatusLine(trailer), "HTTP/1.1 400 Bad Request") << trailer.substr(0, 300);
  Finish("chunk extension / trailer line of 4 MB, never ended", "400 x2", 16);
}

TEST_F(AttackTest, RequestIdsCannotInjectHeadersOrLeakLanes) {
  auto c = Client();
  ASSERT_NE(c, nullptr);
  HttpResponse r =
      Post(*c, "/v1/completions",
           R"({"model":"stories260K","prompt":"x","max_tokens":2,"request_id":"a\r\nX-Evil: 1"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.headers.count("x-evil"), 0u);
  EXPECT_THAT(r.body, HasSubstr("request_id"));
  // 70 KB: used to make the response header write throw after submission.
  r = Post(*c, "/v1/completions",
           absl::StrCat(R"({"model":"stories260K","prompt":"x","max_tokens":2,"request_id":")",
                        std::string(70000, 'i'), R"("})"));
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  r = Post(*c, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":2})",
           {{"X-Request-Id", "a b\"c"}});
  EXPECT_EQ(r.status, 400) << r.body;
  r = Post(*c, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":2})",
           {{"X-Request-Id", "client-7"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "client-7");
  // Nothing was left running or counted: only this /metrics request is in
  // flight.
  HttpResponse m = c->Send({.target = "/metrics"}, absl::Seconds(10)).value_or(HttpResponse{});
  EXPECT_THAT(m.body, HasSubstr("ringlane_http_requests_in_flight 1"));
  Finish("request_id with CR/LF, of 70 KB; X-Request-Id with space/quote", "400 x3, no header", 16);
}

TEST_F(AttackTest, AmplificationIsCappedWhereTheBytesArrive) {
  auto c = Client();
  ASSERT_NE(c, nullptr);
  // A 2 MB stop string times 500 prompts took the router to ~2 GiB.
  json prompts = json::array();
  for (int i = 0; i < 500; ++i) prompts.push_back("x");
  json body = {{"model", kModel}, {"prompt", prompts}, {"stop", std::string(2 << 20, 's')}};
  HttpResponse r = Post(*c, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  body["prompt"] = "x";
  r = Post(*c, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_THAT(r.body, HasSubstr("max_stop_bytes"));
  // A 4 MB session key would be kept in the affinity map.
  body = {{"model", kModel}, {"prompt", "x"}, {"prompt_cache_key", std::string(4 << 20, 'k')}};
  r = Post(*c, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  // n=16 x top_logprobs=20 x 480 tokens held for one response: must stream.
  body = {{"model", kModel},  {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"n", 16},          {"max_tokens", 480},
          {"logprobs", true}, {"top_logprobs", 20}};
  r = Post(*c, "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_THAT(r.body, HasSubstr("unless stream is true"));
  // Streamed, the same request holds nothing per token.
  body["stream"] = true;
  body["ignore_eos"] = true;
  body["loop_watchdog"] = false;
  HttpRequestSpec spec{.method = "POST", .target = "/v1/chat/completions", .body = body.dump()};
  size_t streamed = 0;
  auto s = c->Stream(
      spec,
      [&](std::string_view data) {
        streamed += data.size();
        return true;
      },
      absl::Seconds(300));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->status, 200);
  EXPECT_GT(streamed, 16u * 480 * 20 * 10);
  Finish(absl::StrFormat("2 MB stop x 500 prompts; 4 MB session key; n16 x top20 x 480 "
                         "(%.0f MB streamed)",
                         streamed / 1e6),
         "400 x4, 200 streamed", 64);
}

TEST_F(AttackTest, IdleConnectionsDoNotLockOutProbesOrClients) {
  // More silent connections than one peer may hold (256).
  std::vector<int> fds;
  for (int i = 0; i < 600; ++i) {
    const int fd = ConnectRaw();
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_EQ(fds.size(), 600u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const char* path : {"/health", "/ready"}) {
    auto c = Client();
    ASSERT_NE(c, nullptr);
    auto r = c->Send({.target = path}, absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->status, 200) << path;
  }
  // A real request is served too: the oldest silent connection gives way.
  {
    auto c = Client();
    ASSERT_NE(c, nullptr);
    HttpResponse r =
        Post(*c, "/v1/completions", R"({"model":"stories260K","prompt":"Once","max_tokens":3})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // The silent ones are closed after --http_first_byte_timeout_ms (1.5 s).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  int closed = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    char b;
    if (::poll(&p, 1, 0) == 1 && ::recv(fd, &b, 1, MSG_DONTWAIT) <= 0) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, 600);
  Finish("600 silent TCP connections from one peer", "probes+request 200; silent closed", 48);
}

TEST_F(AttackTest, ChoicesNotRequestsCountAgainstAKey) {
  auto c = Client();
  ASSERT_NE(c, nullptr);
  // 16 prompts x n=16 = 256 lanes from one request.
  json prompts = json::array();
  for (int i = 0; i < 16; ++i) prompts.push_back("Once upon a time");
  json body = {{"model", kModel}, {"prompt", prompts}, {"n", 16}, {"max_tokens", 4}};
  HttpResponse r = Post(*c, "/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("256 choices"));

  // 8 x 8 = 64 choices hold the whole (shared, keyless) allowance of 64...
  prompts = json::array();
  for (int i = 0; i < 8; ++i) prompts.push_back("Once upon a time");
  std::atomic<bool> started{false};
  std::thread holder([&] {
    auto h = Client();
    json hold = {{"model", kModel},   {"prompt", prompts},  {"n", 8},
                 {"max_tokens", 200}, {"ignore_eos", true}, {"loop_watchdog", false},
                 {"stream", true}};
    HttpRequestSpec spec{.method = "POST", .target = "/v1/completions", .body = hold.dump()};
    auto s = h->Stream(
        spec,
        [&](std::string_view) {
          started = true;
          return true;
        },
        absl::Seconds(300));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) {
      EXPECT_EQ(s->status, 200) << s->body;
    }
    started = true;
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // ...so one more choice is refused at once, not queued behind them.
  const absl::Time t0 = absl::Now();
  r = Post(*c, "/v1/completions", R"({"model":"stories260K","prompt":"x","max_tokens":4})");
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  holder.join();
  Finish("16 prompts x n=16; then 64 choices held + 1 more", "400; 429 at once", 64);
}

}  // namespace
}  // namespace ringlane
