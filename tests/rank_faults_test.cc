// Faults of worker ranks and of the router, with real daemons on loopback:
// a rank frozen (SIGSTOP) or killed (SIGKILL) mid-stream fails its group's
// lanes with a clear error within the round deadline, readiness turns false
// while the group is down, new requests fail fast, and the group serves
// golden output again after SIGCONT or a restart of the rank, without
// restarting anything else. Other groups are not disturbed, and no KV block
// stays held afterwards. A router restarted over running workers serves.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
using testing::Daemon;
using testing::GetOnce;
using ::testing::HasSubstr;
using testing::Metric;
using testing::WorkerGroup;
using Clock = std::chrono::steady_clock;

constexpr char kModel[] = "stories260K";

// Short, so that the tests take seconds: the router's round deadline, and
// the workers' collective timeout (longer, so that the router notices first
// and the rank waiting in a collective gives up after it).
constexpr int kRoundDeadlineMs = 2000;
constexpr int kCollectiveTimeoutMs = 3000;
// What a failure may take beyond the deadline (scheduling on a busy
// two-core machine, the HTTP hop).
constexpr int kSlackMs = 2500;

double MsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}
double MsSince(Clock::time_point t) { return MsBetween(t, Clock::now()); }

// A JSON body to `path` on a connection of its own.
absl::StatusOr<services::HttpResponse> Post(const std::string& address, const std::string& path,
                                            const json& body) {
  return testing::PostOnce(address, path, body.dump());
}

// One tensor-parallel group of two ranks with metrics, named `name`; a rank
// can be stopped, killed and started again on its address.
WorkerGroup Group(const std::string& name) {
  return WorkerGroup(2,
                     {"--group=" + name, "--metrics_port=0",
                      absl::StrCat("--collective_timeout_ms=", kCollectiveTimeoutMs)},
                     {"worker", "metrics"});
}

std::unique_ptr<Daemon> StartRouter(const std::vector<WorkerGroup*>& groups) {
  std::vector<std::string> workers;
  for (WorkerGroup* g : groups) workers.push_back(g->Workers());
  return testing::StartRouter(
      absl::StrJoin(workers, ";"),
      {"--connect_timeout_ms=300", absl::StrCat("--round_deadline_ms=", kRoundDeadlineMs)});
}

// Polls /ready until it answers `status`; false after `timeout`.
bool WaitReady(const std::string& http, int status, std::chrono::milliseconds timeout) {
  return testing::WaitForHttpStatus(http, "/ready", status, timeout);
}

// Every golden case through the gateway, and that they all match.
void ExpectGolden(const std::string& http) {
  for (const testing::GoldenCase& g : testing::GoldenCases()) {
    const json body = testing::GoldenEchoBody(g);
    auto r = Post(http, "/v1/completions", body);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["text"], g.text) << "prompt '" << g.prompt_text << "'";
  }
}

// A long streamed completion: what came back and when.
struct StreamOut {
  int status = 0;
  std::string text;
  std::string error;  // the error event's message, if one came
  bool done = false;
  Clock::time_point first;
  Clock::time_point end;
};

json LongStreamBody(const std::string& prompt, int max_tokens) {
  return {{"model", kModel},  {"prompt", prompt},   {"max_tokens", max_tokens},
          {"temperature", 0}, {"ignore_eos", true}, {"loop_watchdog", false},
          {"stream", true}};
}

// Streams `body`; `on_first` runs at the first chunk.
StreamOut Stream(const std::string& http, const json& body,
                 const std::function<void()>& on_first = nullptr, bool may_break = false) {
  StreamOut s;
  auto c = testing::Connect(http);
  if (!c) return s;
  testing::SseStream sse =
      testing::PostSse(*c, "/v1/completions", body.dump(), on_first, absl::Seconds(60));
  if (!may_break) {
    EXPECT_TRUE(sse.transport.ok()) << sse.transport;
  }
  s.status = sse.status;
  s.done = sse.done;
  s.first = sse.first;
  s.end = sse.end;
  for (const json& j : sse.events) {
    if (j.contains("error")) {
      s.error = j["error"].value("message", std::string("?"));
    } else if (j.contains("choices") && !j["choices"].empty()) {
      s.text += j["choices"][0].value("text", std::string());
    }
  }
  return s;
}

// The text a long stream of `prompt` makes when nothing goes wrong.
std::string SoloText(const std::string& http, const std::string& prompt, int max_tokens) {
  json body = LongStreamBody(prompt, max_tokens);
  body["stream"] = false;
  auto r = Post(http, "/v1/completions", body);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->status != 200) return "";
  return json::parse(r->body)["choices"][0]["text"];
}

enum class Fault { kFreeze, kKill };

struct Case {
  Fault fault;
  int rank;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& p) {
  return absl::StrCat(p.param.fault == Fault::kFreeze ? "Frozen" : "Killed", "Rank", p.param.rank);
}

class RankFaultTest : public ::testing::TestWithParam<Case> {};

// A stream runs on a TP2 group; one rank is frozen or killed at its first
// chunk. The client gets an error naming the group within the deadline,
// /ready turns false, a new request fails fast, and after SIGCONT (or a
// restart of the rank on its address) the group serves golden output.
TEST_P(RankFaultTest, LanesFailWithinTheDeadlineAndTheGroupServesAgain) {
  const Case c = GetParam();
  WorkerGroup g = Group("faulty");
  ASSERT_TRUE(g.Start());
  auto router = StartRouter({&g});
  ASSERT_NE(router, nullptr);
  const std::string http = router->address("http");
  ASSERT_TRUE(WaitReady(http, 200, std::chrono::seconds(60))) << router->Stderr();

  Clock::time_point fault_at;
  StreamOut s = Stream(http, LongStreamBody("Once upon a time", 480), [&] {
    fault_at = Clock::now();
    g.rank(c.rank).Signal(c.fault == Fault::kFreeze ? SIGSTOP : SIGKILL);
  });
  ASSERT_EQ(s.status, 200);
  EXPECT_THAT(s.error, HasSubstr("worker group 0")) << "text: " << s.text;
  // The rank at fault is named as the one that does not answer.
  EXPECT_THAT(s.error, HasSubstr(absl::StrCat("rank ", c.rank, " (")));
  if (c.fault == Fault::kFreeze) {
    EXPECT_THAT(s.error, HasSubstr(absl::StrCat("rank ", c.rank, " (", g.rank(c.rank).address(),
                                                ") does not answer")));
  }
  EXPECT_LT(MsBetween(fault_at, s.end), kRoundDeadlineMs + kSlackMs) << s.error;
  EXPECT_TRUE(s.done) << "the stream ends with [DONE] after the error event";
  std::printf("fault at first chunk; error after %.0f ms: %s\n", MsBetween(fault_at, s.end),
              s.error.c_str());

  // Not serving: readiness false at once (the failure is already known),
  // and a new request is refused rather than queued behind a dead group.
  EXPECT_TRUE(WaitReady(http, 503, std::chrono::milliseconds(kSlackMs)));
  const auto asked = Clock::now();
  auto refused =
      Post(http, "/v1/completions", {{"model", kModel}, {"prompt", "Lily"}, {"max_tokens", 8}});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("worker group 0"));
  EXPECT_LT(MsSince(asked), kSlackMs);
  std::printf("new request refused after %.0f ms\n", MsSince(asked));

  if (c.fault == Fault::kFreeze) {
    // Frozen past the collective timeout, so that the peer gives up on it
    // and the woken rank must notice that and re-form.
    std::this_thread::sleep_for(std::chrono::milliseconds(kCollectiveTimeoutMs + 1000));
    g.rank(c.rank).Signal(SIGCONT);
  } else {
    ASSERT_TRUE(g.rank(c.rank).Wait(std::chrono::seconds(10)).has_value());
    ASSERT_TRUE(g.Restart(c.rank));
  }
  const auto resumed = Clock::now();
  ASSERT_TRUE(WaitReady(http, 200, std::chrono::seconds(60)))
      << "the group never re-formed\n--- router:\n"
      << router->Stderr() << "\n--- rank 0:\n"
      << g.rank(0).Stderr() << "\n--- rank 1:\n"
      << g.rank(1).Stderr();
  std::printf("ready again %.0f ms after %s\n", MsSince(resumed),
              c.fault == Fault::kFreeze ? "SIGCONT" : "the restart");
  ExpectGolden(http);
}

INSTANTIATE_TEST_SUITE_P(Faults, RankFaultTest,
                         ::testing::Values(Case{Fault::kFreeze, 0}, Case{Fault::kFreeze, 1},
                                           Case{Fault::kKill, 0}, Case{Fault::kKill, 1}),
                         CaseName);

// Five streams over two groups; rank 0 of group 0 freezes and then a rank of
// the re-formed group is killed. Only group 0's lanes fail (clearly, within
// the deadline); group 1's finish with the text they make alone. Afterwards
// no KV block is held: the router's ledger says none is in use, and the
// workers hold no lane that could name one.
TEST(ChaosTest, AFaultyGroupFailsOnlyItsOwnLanesAndLeaksNoBlocks) {
  WorkerGroup g0 = Group("g0");
  WorkerGroup g1 = Group("g1");
  ASSERT_TRUE(g0.Start());
  ASSERT_TRUE(g1.Start());
  auto router = StartRouter({&g0, &g1});
  ASSERT_NE(router, nullptr);
  const std::string http = router->address("http");
  ASSERT_TRUE(WaitReady(http, 200, std::chrono::seconds(60))) << router->Stderr();
  // Both groups, not just one, before the load starts.
  for (int i = 0; i < 600; ++i) {
    auto m = GetOnce(http, "/metrics");
    if (m.ok() && Metric(m->body, "ringlane_group_ready") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const std::vector<std::string> prompts = {"Once upon a time", "Lily", "The cat", "Tom was",
                                            "One day"};
  constexpr int kTokens = 450;
  std::vector<std::string> solo;
  for (const std::string& p : prompts) solo.push_back(SoloText(http, p, kTokens));

  for (const Fault fault : {Fault::kFreeze, Fault::kKill}) {
    SCOPED_TRACE(fault == Fault::kFreeze ? "SIGSTOP rank 0 of group 0"
                                         : "SIGKILL rank 1 of group 0");
    const int victim = fault == Fault::kFreeze ? 0 : 1;
    std::atomic<int> started{0};
    std::vector<StreamOut> out(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
      threads.emplace_back([&, i] {
        out[i] = Stream(http, LongStreamBody(prompts[i], kTokens), [&] { ++started; });
      });
    }
    const auto load_start = Clock::now();
    while (started < static_cast<int>(prompts.size()) && MsSince(load_start) < 30000) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const auto fault_at = Clock::now();
    g0.rank(victim).Signal(fault == Fault::kFreeze ? SIGSTOP : SIGKILL);
    for (auto& t : threads) t.join();

    int failed = 0;
    int completed = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("stream ", i, " '", prompts[i], "'"));
      EXPECT_EQ(out[i].status, 200);
      if (out[i].error.empty()) {
        ++completed;
        EXPECT_EQ(out[i].text, solo[i]);
      } else {
        ++failed;
        EXPECT_THAT(out[i].error, HasSubstr("worker group 0"));
        EXPECT_LT(MsBetween(fault_at, out[i].end), kRoundDeadlineMs + kSlackMs);
      }
    }
    std::printf("%d streams failed, %d completed\n", failed, completed);
    // Placement spreads five streams over two idle groups by load.
    EXPECT_GE(failed, 1);
    EXPECT_GE(completed, 1);

    if (fault == Fault::kFreeze) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kCollectiveTimeoutMs + 1000));
      g0.rank(victim).Signal(SIGCONT);
    } else {
      ASSERT_TRUE(g0.rank(victim).Wait(std::chrono::seconds(10)).has_value());
      ASSERT_TRUE(g0.Restart(victim));
    }
    bool both = false;
    for (int i = 0; i < 1200 && !both; ++i) {
      auto m = GetOnce(http, "/metrics");
      both = m.ok() && Metric(m->body, "ringlane_group_ready") == 2;
      if (!both) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(both) << "group 0 never re-formed\n" << router->Stderr();
  }
  ExpectGolden(http);

  // The ledger against the workers: nothing in use on the router's side, no
  // lane (and so no block table) on any rank, and the same pool size.
  auto m = GetOnce(http, "/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(Metric(m->body, "ringlane_kv_blocks_used"), 0) << m->body;
  EXPECT_EQ(Metric(m->body, "ringlane_lanes_running"), 0);
  EXPECT_EQ(Metric(m->body, "ringlane_lanes_waiting"), 0);
  // The last stream's release row may still be on its way when its client
  // has the final token: the workers must come to 0 lanes, not be there at
  // once.
  for (WorkerGroup* g : {&g0, &g1}) {
    double lanes = -1;
    for (int i = 0; i < 100 && lanes != 0; ++i) {
      lanes = g->RankMetric("ringlane_worker_lanes");
      if (lanes != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(lanes, 0);
  }
  EXPECT_EQ(Metric(m->body, "ringlane_kv_blocks_capacity", "group=\"0\""),
            g0.RankMetric("ringlane_worker_kv_pool_blocks") / 2);
  EXPECT_EQ(Metric(m->body, "ringlane_kv_blocks_capacity", "group=\"1\""),
            g1.RankMetric("ringlane_worker_kv_pool_blocks") / 2);
}

// The router killed mid-stream and started again over the same workers: the
// workers let go of the dead router's streams and the new one serves.
TEST(RouterRestartTest, ANewRouterServesTheWorkersOfAKilledOne) {
  WorkerGroup g = Group("kept");
  ASSERT_TRUE(g.Start());
  auto router = StartRouter({&g});
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(WaitReady(router->address("http"), 200, std::chrono::seconds(60)));
  StreamOut s = Stream(
      router->address("http"), LongStreamBody("Lily", 480), [&] { router->Signal(SIGKILL); },
      /*may_break=*/true);
  EXPECT_FALSE(s.done) << "the router died mid-stream";
  router->Wait(std::chrono::seconds(10));
  router.reset();

  auto again = StartRouter({&g});
  ASSERT_NE(again, nullptr);
  const std::string http = again->address("http");
  ASSERT_TRUE(WaitReady(http, 200, std::chrono::seconds(60))) << again->Stderr();
  // The killed router may have left one rank inside a round that the other
  // never received: that rank waits in a collective until its timeout, and
  // the group re-forms once (the new router's first rounds fail with
  // UNAVAILABLE meanwhile, which says "retry"). It serves within seconds.
  const auto start = Clock::now();
  bool served = false;
  while (!served && MsSince(start) < 30000) {
    auto r =
        Post(http, "/v1/completions", {{"model", kModel}, {"prompt", "Lily"}, {"max_tokens", 4}});
    served = r.ok() && r->status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(served) << again->Stderr();
  std::printf("the new router served %.0f ms after it was ready; workers in epoch %.0f\n",
              MsSince(start), g.RankMetric("ringlane_worker_group_epoch") / 2);
  ExpectGolden(http);
}

TEST(RoundDeadlineFlagTest, OutOfRangeValuesExitWithUsage) {
  for (const char* v : {"0", "-5", "99", "3600001", "x"}) {
    testing::RunResult r = testing::RunToExit(
        testing::kRouterBin,
        {"--workers=127.0.0.1:1", "--tokenizer=" + testing::StoriesTokenizer(),
         "--listen=127.0.0.1:0", "--http_listen=off", absl::StrCat("--round_deadline_ms=", v)});
    EXPECT_EQ(r.code, v == std::string("x") ? 1 : 2) << v << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("round_deadline_ms")) << v;
  }
}

}  // namespace
}  // namespace ringlane
