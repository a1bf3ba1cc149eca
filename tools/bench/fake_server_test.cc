// ringlane-bench against a fake OpenAI server written here (Boost.Beast on
// loopback) that streams a known schedule: the measured TTFT, ITL and token
// counts must come out as scheduled, a server that reports wrong usage (or
// wrong metrics) must be flagged, and the report files must be written.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http/read.hpp"
#include "boost/beast/http/string_body.hpp"
#include "boost/beast/http/write.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/bench/report.h"
#include "tools/bench/runner.h"
#include "tools/bench/stats.h"

namespace ringlane::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using tcp = net::ip::tcp;
using ::testing::HasSubstr;
using ::testing::Not;

// The fake server's behaviour.
struct FakeOptions {
  // Tokens carried by each content chunk; the first chunk is sent
  // first_chunk_ms after the request was read, the others gap_ms apart.
  std::vector<int> chunk_tokens = {1, 2, 1, 2, 2};
  double first_chunk_ms = 100;
  double gap_ms = 50;
  // Added to the true completion token count in the usage chunk.
  int usage_error = 0;
  // Added to the true generated tokens in /metrics, per request.
  int metrics_error = 0;
  // Where the counters in /metrics start.
  int64_t metrics_base = 0;
  // Export the speculation counters too: each 2-token chunk is a verify row
  // that accepted one of its two drafts (every chunk is a sampling row,
  // which /metrics always exports). The series are split over two drafters
  // and appear with the first request, as the router's labelled ones do.
  bool speculation = false;
  // Like a server with a short idle timeout racing the client's next
  // request: after one completion on a connection, the next request read
  // there gets no answer, the connection just closes.
  bool close_after_completion = false;
  // 0: any free port.
  int port = 0;
};

// A loopback OpenAI-compatible server: /v1/models, streamed
// /v1/completions, ringlane's /tokenize (a BOS plus one token per word) and
// /metrics. One thread accepts; one thread per connection serves its
// requests in order. Request bodies are kept for the test to inspect.
class FakeServer {
 public:
  explicit FakeServer(FakeOptions options) : options_(std::move(options)) {
    tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(options_.port));
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeServer() {
    stopping_ = true;
    // Wake the blocking accept with a connection of our own.
    {
      net::io_context io;
      tcp::socket s(io);
      beast::error_code ec;
      s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
    }
    accept_thread_.join();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& s : sockets_) ::shutdown(s->native_handle(), SHUT_RDWR);
    }
    for (std::thread& t : connection_threads_) t.join();
  }

  int port() const { return port_; }
  std::string base_url() const { return absl::StrCat("http://127.0.0.1:", port_, "/v1"); }
  std::string root_url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  std::vector<json> completion_bodies() {
    absl::MutexLock lock(&mu_);
    return bodies_;
  }

 private:
  void AcceptLoop() {
    for (;;) {
      auto socket = std::make_shared<tcp::socket>(io_);
      beast::error_code ec;
      acceptor_.accept(*socket, ec);
      if (stopping_) return;
      if (ec) continue;
      absl::MutexLock lock(&mu_);
      sockets_.push_back(socket);
      connection_threads_.emplace_back([this, socket] { Serve(*socket); });
    }
  }

  void Serve(tcp::socket& socket) {
    beast::flat_buffer buffer;
    bool completed = false;
    for (;;) {
      http::request<http::string_body> req;
      beast::error_code ec;
      http::read(socket, buffer, req, ec);
      if (ec) return;
      if (completed && options_.close_after_completion) {
        socket.shutdown(tcp::socket::shutdown_both, ec);  // the socket outlives this thread
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      const std::string target(req.target());
      if (target == "/v1/completions" && req.method() == http::verb::post) {
        if (!StreamCompletion(socket, req.body(), start)) return;
        completed = true;
        continue;
      }
      http::response<http::string_body> resp{http::status::ok, req.version()};
      resp.keep_alive(true);
      if (target == "/v1/models") {
        resp.set(http::field::content_type, "application/json");
        resp.body() = R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})";
      } else if (target == "/tokenize") {
        json b = json::parse(req.body());
        resp.set(http::field::content_type, "application/json");
        resp.body() = json{{"count", Tokens(b["prompt"].get<std::string>())}}.dump();
      } else if (target == "/metrics") {
        absl::MutexLock lock(&mu_);
        resp.set(http::field::content_type, "text/plain; version=0.0.4");
        resp.body() = absl::StrCat(
            "# TYPE ringlane_generation_tokens_total counter\n",
            "ringlane_generation_tokens_total{model=\"fake-model\",group=\"0\"} ", generated_,
            "\nringlane_prompt_tokens_total{model=\"fake-model\",group=\"0\"} ", prompted_,
            "\nringlane_rounds_total{model=\"fake-model\",group=\"0\"} ", rounds_,
            "\nringlane_sampling_rows_total{model=\"fake-model\",group=\"0\"} ", sampling_rows_,
            "\n");
        if (options_.speculation && verify_rows_ > 0) {
          for (auto [name, total] :
               {std::pair<const char*, int64_t>{"drafted_tokens", 2 * verify_rows_},
                {"accepted_tokens", verify_rows_},
                {"rejected_tokens", verify_rows_},
                {"verify_rows", verify_rows_}}) {
            absl::StrAppend(&resp.body(), "ringlane_spec_", name,
                            "_total{model=\"fake-model\",group=\"0\",drafter=\"ngram\","
                            "temperature=\"given\"} ",
                            total - total / 2, "\nringlane_spec_", name,
                            "_total{model=\"fake-model\",group=\"0\",drafter=\"suffix\","
                            "temperature=\"given\"} ",
                            total / 2, "\n");
          }
        }
      } else {
        resp.result(http::status::not_found);
        resp.body() = R"({"error":{"message":"no such route"}})";
      }
      resp.prepare_payload();
      http::write(socket, resp, ec);
      if (ec) return;
    }
  }

  // A BOS plus one token per word.
  static int64_t Tokens(const std::string& text) {
    int64_t n = 1;
    for (absl::string_view w : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      (void)w;
      ++n;
    }
    return n;
  }

  bool StreamCompletion(tcp::socket& socket, const std::string& body_text,
                        std::chrono::steady_clock::time_point start) {
    const json body = json::parse(body_text);
    {
      absl::MutexLock lock(&mu_);
      bodies_.push_back(body);
    }
    const bool logprobs = body.contains("logprobs");
    beast::error_code ec;
    net::write(socket,
               net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                       "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                                       "\r\n")),
               ec);
    auto send = [&](const std::string& event) {
      const std::string data = "data: " + event + "\n\n";
      net::write(socket, net::buffer(absl::StrFormat("%x\r\n%s\r\n", data.size(), data)), ec);
      return !ec;
    };
    int64_t total = 0;
    for (size_t i = 0; i < options_.chunk_tokens.size(); ++i) {
      std::this_thread::sleep_until(
          start +
          std::chrono::microseconds(static_cast<int64_t>(
              (options_.first_chunk_ms + options_.gap_ms * static_cast<double>(i)) * 1000)));
      json tokens = json::array(), lps = json::array();
      std::string text;
      for (int t = 0; t < options_.chunk_tokens[i]; ++t) {
        const std::string tok = absl::StrCat(" w", total++);
        tokens.push_back(tok);
        lps.push_back(-0.25);
        text += tok;
      }
      json choice = {{"index", 0}, {"text", text}, {"finish_reason", nullptr}};
      if (i + 1 == options_.chunk_tokens.size()) choice["finish_reason"] = "length";
      if (logprobs) choice["logprobs"] = {{"tokens", tokens}, {"token_logprobs", lps}};
      if (!send(json{{"id", "cmpl-1"}, {"object", "text_completion"}, {"choices", {choice}}}
                    .dump())) {
        return false;
      }
    }
    const int64_t prompt = Tokens(body["prompt"].get<std::string>());
    send(json{{"id", "cmpl-1"},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt},
                {"completion_tokens", total + options_.usage_error},
                {"total_tokens", prompt + total + options_.usage_error}}}}
             .dump());
    send("[DONE]");
    net::write(socket, net::buffer(std::string("0\r\n\r\n")), ec);
    absl::MutexLock lock(&mu_);
    generated_ += total + options_.metrics_error;
    prompted_ += prompt;
    rounds_ += total;
    sampling_rows_ += static_cast<int64_t>(options_.chunk_tokens.size());
    for (int t : options_.chunk_tokens) verify_rows_ += t == 2;
    return !ec;
  }

  const FakeOptions options_;
  net::io_context io_;
  tcp::acceptor acceptor_{io_};
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> connection_threads_ ABSL_GUARDED_BY(mu_);
  std::vector<json> bodies_ ABSL_GUARDED_BY(mu_);
  int64_t generated_ ABSL_GUARDED_BY(mu_) = options_.metrics_base;
  int64_t prompted_ ABSL_GUARDED_BY(mu_) = options_.metrics_base;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = options_.metrics_base;
  int64_t sampling_rows_ ABSL_GUARDED_BY(mu_) = options_.metrics_base;
  int64_t verify_rows_ ABSL_GUARDED_BY(mu_) = 0;
};

Workload TestWorkload(std::vector<int> concurrency = {1}, int requests = 3) {
  Workload w;
  w.name = "fake";
  Stage s;
  s.name = "t";
  s.concurrency = std::move(concurrency);
  s.prompt_tokens.values = {12};
  s.output_tokens = 8;
  s.requests = requests;
  w.stages.push_back(s);
  return w;
}

RunOptions Options(const FakeServer& server, ServerKind kind, bool logprobs) {
  RunOptions o;
  o.server.base_url = server.base_url();
  o.server.kind = kind;
  o.server.request_logprobs = logprobs;
  if (kind == ServerKind::kRinglane) {
    o.server.metrics_url = server.root_url() + "/metrics";
    o.server.tokenize_url = server.root_url() + "/tokenize";
  }
  o.progress = false;
  o.log = [](std::string_view) {};
  return o;
}

// The schedule {1, 2, 1, 2, 2} tokens at 100, 150, 200, 250, 300 ms.
// Nothing can arrive early, but a loaded machine (ctest -j, other builds)
// delays single chunks by tens of milliseconds, so the bounds on timing are
// loose above; how each gap is attributed to tokens is checked exactly.
void ExpectScheduleMeasured(const RequestSample& s, bool counted) {
  EXPECT_TRUE(s.ok()) << s.error;
  EXPECT_GE(s.ttft_ms, 99);
  EXPECT_LT(s.ttft_ms, 100 + 80);
  ASSERT_EQ(s.chunks.size(), 5u);
  const std::vector<int> expected_itl_tokens = {2, 1, 2, 2};  // chunks after the first
  size_t k = 0;
  for (size_t c = 1; c < s.chunks.size(); ++c) {
    const int tokens = counted ? expected_itl_tokens[c - 1] : 1;
    if (counted) {
      EXPECT_EQ(s.chunks[c].logprob_tokens, tokens);
    }
    const double gap = s.chunks[c].t_ms - s.chunks[c - 1].t_ms;
    EXPECT_NEAR(gap, 50, 45) << "chunk " << c;
    for (int t = 0; t < tokens; ++t, ++k) {
      ASSERT_LT(k, s.itl_ms.size());
      // The chunk's gap over its tokens, once per token.
      EXPECT_NEAR(s.itl_ms[k], gap / tokens, 1e-9) << "ITL " << k;
    }
  }
  EXPECT_EQ(s.itl_ms.size(), k);
  // The chunks' gaps add up to the schedule's 200 ms.
  EXPECT_NEAR(s.chunks.back().t_ms - s.chunks.front().t_ms, 200, 40);
  EXPECT_EQ(s.output_tokens, 8);
  EXPECT_NEAR(s.tpot_ms, (s.e2e_ms - s.ttft_ms) / 7, 1e-9);
  EXPECT_NEAR(s.tpot_ms, 200.0 / 7, 12);
}

// Over a run's samples, the typical ITL of 2-token chunks is 25 ms and of
// 1-token chunks 50 ms (medians shrug off a late chunk).
void ExpectTypicalItl(const std::vector<RequestSample>& samples) {
  std::vector<double> one, two;
  for (const RequestSample& s : samples) {
    size_t k = 0;
    for (size_t c = 1; c < s.chunks.size() && k < s.itl_ms.size(); ++c) {
      const int tokens = std::max(1, s.chunks[c].logprob_tokens);
      (tokens == 1 ? one : two).push_back(s.itl_ms[k]);
      k += static_cast<size_t>(tokens);
    }
  }
  EXPECT_NEAR(Percentile(one, 50), 50, 12);
  if (!two.empty()) {
    EXPECT_NEAR(Percentile(two, 50), 25, 8);
  }
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(FakeServerTest, MeasuresTheScheduleAndVerifiesCounts) {
  FakeServer server({});
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kGeneric, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->server.model, "fake-model");  // from /v1/models
  ASSERT_EQ(run->samples.size(), 3u);
  for (const RequestSample& s : run->samples) {
    ExpectScheduleMeasured(s, /*counted=*/true);
    EXPECT_EQ(s.check, TokenCheck::kVerified);
    EXPECT_EQ(s.usage_completion_tokens, 8);
    EXPECT_EQ(s.logprob_tokens, 8);
    EXPECT_EQ(s.usage_prompt_tokens, 13);  // 12 words + BOS
  }
  // Generic servers get standard fields only.
  for (const json& b : server.completion_bodies()) {
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["logprobs"], 1);
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_FALSE(b.contains("ignore_eos"));
    EXPECT_FALSE(b.contains("loop_watchdog"));
  }
  ExpectTypicalItl(run->samples);
  const std::vector<GroupStats> groups = ComputeGroups(*run);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].verified, 3);
  EXPECT_EQ(groups[0].mismatched, 0);
  EXPECT_NEAR(groups[0].itl_ms.p50, 25, 10);  // 6 of every 7 ITLs are 25 ms
  const std::string md = RenderMarkdown(*run, groups);
  EXPECT_THAT(md, HasSubstr("verified 3/3"));
  EXPECT_THAT(md, Not(HasSubstr("MISMATCH")));
}

// ringlane-bench once lost 17 of 84 requests to llama-server this way and
// averaged over the rest: now such a request is sent again on a new
// connection, and the report says how many were.
TEST(FakeServerTest, AServerClosingKeptAliveConnectionsCostsNoRequest) {
  FakeOptions fake;
  fake.close_after_completion = true;
  FakeServer server(fake);
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kGeneric, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->samples.size(), 3u);
  int retried = 0;
  for (const RequestSample& s : run->samples) {
    EXPECT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.check, TokenCheck::kVerified);
    retried += s.retried;
  }
  EXPECT_GE(retried, 1);
  const std::string md = RenderMarkdown(*run, ComputeGroups(*run));
  EXPECT_THAT(md, HasSubstr(absl::StrCat(retried, " request(s) were retried once")));
  EXPECT_THAT(md, Not(HasSubstr("failed")));
}

TEST(FakeServerTest, WrongUsageIsFlagged) {
  FakeOptions fake;
  fake.usage_error = 3;  // claims 11 tokens, streams 8
  FakeServer server(fake);
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kGeneric, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->samples.size(), 3u);
  for (const RequestSample& s : run->samples) {
    ExpectScheduleMeasured(s, /*counted=*/true);
    EXPECT_EQ(s.check, TokenCheck::kMismatch);
    EXPECT_EQ(s.usage_completion_tokens, 11);
  }
  const std::vector<GroupStats> groups = ComputeGroups(*run);
  EXPECT_EQ(groups[0].mismatched, 3);
  const std::string md = RenderMarkdown(*run, groups);
  EXPECT_THAT(md, HasSubstr("**MISMATCH** 3/3"));
  EXPECT_THAT(md, HasSubstr("usage.completion_tokens = 11 but the stream carried 8 logprob"));
  const json j = json::parse(RenderJson(*run, groups));
  EXPECT_EQ(j["samples"][0]["token_check"], "MISMATCH");
  EXPECT_EQ(j["samples"][0]["verified"], false);
}

TEST(FakeServerTest, WithoutLogprobsCountsAreUnverified) {
  FakeServer server({});
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kGeneric, /*logprobs=*/false));
  ASSERT_TRUE(run.ok()) << run.status();
  for (const RequestSample& s : run->samples) {
    ExpectScheduleMeasured(s, /*counted=*/false);
    EXPECT_EQ(s.check, TokenCheck::kUnverified);
  }
  ExpectTypicalItl(run->samples);
  for (const json& b : server.completion_bodies()) EXPECT_FALSE(b.contains("logprobs"));
  EXPECT_THAT(RenderMarkdown(*run, ComputeGroups(*run)), HasSubstr("unverified 3/3"));
}

TEST(FakeServerTest, RinglaneModeSendsExtensionsAndChecksMetrics) {
  FakeServer server({});
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kRinglane, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  for (const json& b : server.completion_bodies()) {
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["loop_watchdog"], false);
  }
  for (const RequestSample& s : run->samples) {
    EXPECT_TRUE(s.prompt_tokens_exact);  // sized with /tokenize
    EXPECT_EQ(s.prompt_tokens_expected, 12);
    EXPECT_EQ(s.usage_prompt_tokens, 12);
  }
  ASSERT_EQ(run->levels.size(), 1u);
  const LevelResult& level = run->levels[0];
  ASSERT_TRUE(level.has_metrics);
  EXPECT_EQ(level.delta.at("generation_tokens"), 24);
  EXPECT_EQ(level.delta.at("prompt_tokens"), 36);
  const std::string md = RenderMarkdown(*run, ComputeGroups(*run));
  EXPECT_THAT(md, HasSubstr("| 24 = 24 |"));
  EXPECT_THAT(md, HasSubstr("| 36 = 36 |"));
  EXPECT_THAT(md, Not(HasSubstr("DIFFERS")));
  // 8 tokens in 5 sampling rows per request; no speculation counters.
  EXPECT_THAT(md, HasSubstr("| 1.60 | n/a | n/a |"));
}

// "document": "words": the documents are fresh words, not completions, so
// the server sees only the recorded requests, each a document of exactly
// document_tokens tokens, a newline and the document's first quarter.
TEST(FakeServerTest, CopyPromptsOfWordsAskTheServerForNoDocument) {
  FakeOptions fake;
  fake.first_chunk_ms = 20;
  fake.gap_ms = 10;
  FakeServer server(fake);
  Workload w = TestWorkload({2}, 3);
  Stage& st = w.stages[0];
  st.mode = StageMode::kCopy;
  st.prompt_tokens.values = {4};
  st.document_tokens.values = {20};
  st.copy_prefix_fraction = 0.25;
  st.document_from_words = true;
  absl::StatusOr<RunResult> run =
      RunWorkload(w, Options(server, ServerKind::kRinglane, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->samples.size(), 3u);
  std::set<std::string> prompts;
  for (const json& b : server.completion_bodies()) {
    EXPECT_EQ(b["max_tokens"], 8);
    const std::string prompt = b["prompt"];
    const size_t nl = prompt.find('\n');
    ASSERT_NE(nl, std::string::npos) << prompt;
    const std::vector<std::string> doc = absl::StrSplit(prompt.substr(0, nl), ' ');
    EXPECT_EQ(doc.size(), 19u);  // 20 tokens with the BOS
    EXPECT_EQ(prompt.substr(nl + 1), absl::StrJoin(doc.begin(), doc.begin() + 5, " "));
    prompts.insert(prompt);
  }
  EXPECT_EQ(prompts.size(), 3u);  // a fresh document per request
  EXPECT_EQ(run->levels[0].document_requests, 0);
  for (const RequestSample& s : run->samples) EXPECT_TRUE(s.ok()) << s.error;
}

TEST(FakeServerTest, CopyPromptsRepeatTheServersOwnDocument) {
  FakeOptions fake;
  fake.first_chunk_ms = 20;
  fake.gap_ms = 10;
  fake.speculation = true;
  FakeServer server(fake);
  Workload w = TestWorkload({2}, 3);
  Stage& st = w.stages[0];
  st.mode = StageMode::kCopy;
  st.prompt_tokens.values = {4};
  st.document_tokens.values = {30};
  st.copy_prefix_fraction = 0.25;
  absl::StatusOr<RunResult> run =
      RunWorkload(w, Options(server, ServerKind::kRinglane, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  // The documents are not samples.
  ASSERT_EQ(run->samples.size(), 3u);
  // The fake streams " w0 w1 ... w7" whatever it is asked: that is every
  // document, and a quarter of its 8 words is 2.
  const std::string copy_prompt = "w0 w1 w2 w3 w4 w5 w6 w7\nw0 w1";
  int documents = 0, copies = 0;
  for (const json& b : server.completion_bodies()) {
    EXPECT_EQ(b["temperature"], 0);
    if (b["max_tokens"] == 30) {
      ++documents;
      EXPECT_NE(b["prompt"], copy_prompt);  // a fresh seed
    } else {
      ++copies;
      EXPECT_EQ(b["max_tokens"], 8);
      EXPECT_EQ(b["prompt"], copy_prompt);
    }
  }
  EXPECT_EQ(documents, 3);
  EXPECT_EQ(copies, 3);
  for (const RequestSample& s : run->samples) {
    EXPECT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.phase, "");
    EXPECT_TRUE(s.prompt_tokens_exact);
    EXPECT_EQ(s.prompt_tokens_expected, 11);  // 10 words + BOS
    EXPECT_EQ(s.usage_prompt_tokens, 11);
  }
  ASSERT_EQ(run->levels.size(), 1u);
  const LevelResult& level = run->levels[0];
  EXPECT_EQ(level.document_requests, 3);
  EXPECT_EQ(level.document_errors, 0);
  EXPECT_EQ(level.document_completion_tokens, 24);
  // The documents were written before the level's first read: its counters
  // cover the recorded requests only.
  EXPECT_EQ(level.delta.at("generation_tokens"), 24);
  EXPECT_EQ(level.delta.at("sampling_rows"), 15);
  EXPECT_EQ(level.delta.at("spec_drafted_tokens"), 18);
  const std::vector<GroupStats> groups = ComputeGroups(*run);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_DOUBLE_EQ(groups[0].steps.tokens_per_step.value(), 1.6);
  EXPECT_DOUBLE_EQ(groups[0].steps.draft_acceptance.value(), 0.5);
  EXPECT_DOUBLE_EQ(groups[0].steps.accepted_per_verify_row.value(), 1.0);
  const std::string md = RenderMarkdown(*run, groups);
  EXPECT_THAT(md, HasSubstr("| 24 = 24 |"));
  EXPECT_THAT(md, HasSubstr("| 1.60 | 50.0% | 1.00 |"));
  EXPECT_THAT(md, Not(HasSubstr("DIFFERS")));
  const json j = json::parse(RenderJson(*run, groups));
  EXPECT_DOUBLE_EQ(j["levels"][0]["tokens_per_step"].get<double>(), 1.6);
  EXPECT_DOUBLE_EQ(j["levels"][0]["draft_acceptance"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["levels"][0]["accepted_per_verify_row"].get<double>(), 1.0);
  EXPECT_EQ(j["levels"][0]["document_completion_tokens"], 24);
  EXPECT_DOUBLE_EQ(j["groups"][0]["tokens_per_step"].get<double>(), 1.6);
}

TEST(FakeServerTest, AgenticRepeatsFollowTheFirstPass) {
  FakeOptions fake;
  fake.first_chunk_ms = 20;
  fake.gap_ms = 10;
  FakeServer server(fake);
  Workload w = TestWorkload({2}, 5);
  Stage& st = w.stages[0];
  st.mode = StageMode::kAgentic;
  st.prompt_tokens.values = {6};
  st.distinct_prompts = 2;
  absl::StatusOr<RunResult> run =
      RunWorkload(w, Options(server, ServerKind::kRinglane, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->samples.size(), 5u);
  // The repeats start after the whole first pass has ended, so the bodies
  // arrive first pass first: two distinct prompts, then only those again.
  const std::vector<json> bodies = server.completion_bodies();
  ASSERT_EQ(bodies.size(), 5u);
  EXPECT_NE(bodies[0]["prompt"], bodies[1]["prompt"]);
  for (size_t i = 2; i < bodies.size(); ++i) {
    EXPECT_TRUE(bodies[i]["prompt"] == bodies[0]["prompt"] ||
                bodies[i]["prompt"] == bodies[1]["prompt"])
        << bodies[i].dump();
  }
  double first_end = 0;
  int first = 0, repeat = 0;
  for (const RequestSample& s : run->samples) {
    EXPECT_TRUE(s.ok()) << s.error;
    if (s.phase == "first") {
      ++first;
      first_end = std::max(first_end, s.start_s + s.e2e_ms / 1000);
    } else {
      EXPECT_EQ(s.phase, "repeat");
      ++repeat;
    }
  }
  EXPECT_EQ(first, 2);
  EXPECT_EQ(repeat, 3);
  for (const RequestSample& s : run->samples) {
    // A little slack: the first pass's end is measured by its clients.
    if (s.phase == "repeat") {
      EXPECT_GE(s.start_s, first_end - 0.005);
    }
  }
  // The counters split at the first pass's end.
  ASSERT_EQ(run->levels.size(), 1u);
  const LevelResult& level = run->levels[0];
  EXPECT_EQ(level.delta.at("generation_tokens"), 40);
  ASSERT_EQ(level.phase_delta.size(), 2u);
  EXPECT_EQ(level.phase_delta.at("first").at("generation_tokens"), 16);
  EXPECT_EQ(level.phase_delta.at("repeat").at("generation_tokens"), 24);
  const std::vector<GroupStats> groups = ComputeGroups(*run);
  ASSERT_EQ(groups.size(), 2u);
  for (const GroupStats& g : groups) {
    // The phases run one after the other, so each has a throughput.
    EXPECT_GT(g.aggregate_tps, 0) << g.phase;
    EXPECT_DOUBLE_EQ(g.steps.tokens_per_step.value(), 1.6) << g.phase;
    EXPECT_FALSE(g.steps.draft_acceptance.has_value());
  }
  const std::string md = RenderMarkdown(*run, groups);
  EXPECT_THAT(md, HasSubstr("| t (first) | 2 |"));
  EXPECT_THAT(md, HasSubstr("| t (repeat) | 2 |"));
  EXPECT_THAT(md, HasSubstr("| 16 = 16 |"));
  EXPECT_THAT(md, HasSubstr("| 24 = 24 |"));
  EXPECT_THAT(md, HasSubstr("| 40 = 40 |"));
  EXPECT_THAT(md, Not(HasSubstr("DIFFERS")));
  const json j = json::parse(RenderJson(*run, groups));
  EXPECT_EQ(j["samples"][0]["phase"], "first");
  ASSERT_EQ(j["levels"][0]["phases"].size(), 2u);
  EXPECT_EQ(j["levels"][0]["phases"][1]["phase"], "repeat");
  EXPECT_EQ(j["levels"][0]["phases"][1]["metrics_delta"]["generation_tokens"], 24);
  EXPECT_DOUBLE_EQ(j["levels"][0]["phases"][1]["tokens_per_step"].get<double>(), 1.6);
}

TEST(FakeServerTest, MetricsThatDisagreeAreFlagged) {
  FakeOptions fake;
  fake.metrics_error = -1;  // the server's counter misses a token per request
  FakeServer server(fake);
  absl::StatusOr<RunResult> run =
      RunWorkload(TestWorkload(), Options(server, ServerKind::kRinglane, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string md = RenderMarkdown(*run, ComputeGroups(*run));
  EXPECT_THAT(md, HasSubstr("**DIFFERS**: server 21, client 24"));
  EXPECT_THAT(md, HasSubstr("the server's generation_tokens grew by 21"));
}

TEST(FakeServerTest, ARestartIsSeenAndNotCompared) {
  FakeOptions first;
  first.first_chunk_ms = 20;
  first.gap_ms = 10;
  // The first process has counted a lot, so the restarted one's counters
  // are lower at any read.
  first.metrics_base = 1'000'000;
  auto server = std::make_unique<FakeServer>(first);
  FakeOptions second = first;
  second.metrics_base = 0;
  second.port = server->port();
  Workload w = TestWorkload();
  w.stages[0].requests = 0;
  w.stages[0].duration_s = 4;
  RunOptions options = Options(*server, ServerKind::kRinglane, /*logprobs=*/true);
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    server.reset();
    // Long enough for requests to find nobody listening.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    server = std::make_unique<FakeServer>(second);
  });
  absl::StatusOr<RunResult> run = RunWorkload(w, options);
  restart.join();
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->levels.size(), 1u);
  const LevelResult& level = run->levels[0];
  EXPECT_GE(level.counter_resets, 1);
  EXPECT_EQ(level.outages, 1);
  int64_t unreachable = 0, ok = 0;
  for (const RequestSample& s : run->samples) {
    unreachable += s.connection_failed;
    ok += s.ok();
  }
  EXPECT_GE(unreachable, 1);
  EXPECT_GE(ok, 10);
  const std::string md = RenderMarkdown(*run, ComputeGroups(*run));
  EXPECT_THAT(md, HasSubstr("the server restarted"));
  EXPECT_THAT(md, Not(HasSubstr("DIFFERS")));
}

TEST(FakeServerTest, SweepWritesEveryOutput) {
  FakeOptions fake;
  fake.first_chunk_ms = 20;
  fake.gap_ms = 10;
  FakeServer server(fake);
  Workload w = TestWorkload({1, 2, 3}, 3);
  absl::StatusOr<RunResult> run =
      RunWorkload(w, Options(server, ServerKind::kGeneric, /*logprobs=*/true));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->samples.size(), 9u);
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("bench-out-", getpid());
  absl::StatusOr<std::vector<std::string>> lines = WriteOutputs(*run, dir.string());
  ASSERT_TRUE(lines.ok()) << lines.status();
  const json j = json::parse(ReadFile(dir / "samples.json"));
  EXPECT_EQ(j["samples"].size(), 9u);
  EXPECT_EQ(j["groups"].size(), 3u);
  EXPECT_EQ(j["samples"][0]["chunk_ms"].size(), 5u);
  EXPECT_THAT(ReadFile(dir / "report.md"), HasSubstr("| t | 3 |"));
  EXPECT_THAT(ReadFile(dir / "t.dat"), HasSubstr("\n3 "));
  // The plot exists, or the report says why not (no gnuplot here).
  bool plotted = std::filesystem::exists(dir / "t.png");
  bool explained = false;
  for (const std::string& l : *lines) explained = explained || l.find("skipped") != l.npos;
  EXPECT_TRUE(plotted || explained);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ringlane::bench
