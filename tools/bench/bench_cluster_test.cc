// Every shipped workload, run by the ringlane-bench binary for a few seconds
// against a real local cluster (a worker and the router with its HTTP
// gateway, on loopback), its report checked against the router's own
// metrics: the tokens the report counts are the tokens the server counted.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/daemon.h"
#include "tools/bench/client.h"
#include "tools/bench/metrics.h"
#include "tools/bench/workload.h"

namespace ringlane::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;
using ringlane::testing::Daemon;

const char* kWorker = RINGLANE_WORKER_BIN;
const char* kRouter = RINGLANE_ROUTER_BIN;
const char* kBench = RINGLANE_BENCH_BIN;

std::string Source(const std::string& relative) {
  return std::string(RINGLANE_SOURCE_DIR) + "/" + relative;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// What `binary --helpfull` prints (on stdout).
std::string Help(const std::string& binary) {
  std::string out;
  FILE* p = popen((binary + " --helpfull 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class BenchClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The gateway (issue 5) adds --http_listen; without it there is nothing
    // to measure yet.
    if (Help(kRouter).find("--http_listen") == std::string::npos) {
      GTEST_SKIP() << "this ringlane-router has no HTTP gateway (--http_listen) yet";
    }
    auto w =
        Daemon::Start(kWorker, {"--model=" + Source("deploy/models/stories260K/stories260K.bin"),
                                "--threads=1", "--listen=127.0.0.1:0"});
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = *std::move(w);
    auto r = Daemon::Start(kRouter,
                           {"--workers=" + worker_->address(),
                            "--tokenizer=" + Source("deploy/models/stories260K/tok512.bin"),
                            "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0"},
                           {"router", "http"});
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    http_ = "http://" + router_->address("http");

    ServerOptions sv;
    sv.base_url = http_ + "/v1";
    sv.kind = ServerKind::kRinglane;
    sv.metrics_url = http_ + "/metrics";
    auto c = ApiClient::Create(sv);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    // Ready once the model list answers (the worker group has connected).
    for (int i = 0; i < 300; ++i) {
      if (client_->ListModels().ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "the gateway never listed a model: " << router_->Stderr();
  }

  CounterValues Counters() {
    absl::StatusOr<std::string> text = client_->ScrapeMetrics();
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? ReadRinglaneCounters(ParsePrometheusText(*text)) : CounterValues{};
  }

  std::unique_ptr<Daemon> worker_;
  std::unique_ptr<Daemon> router_;
  std::string http_;
  std::unique_ptr<ApiClient> client_;
};

TEST_F(BenchClusterTest, ShippedWorkloadsMatchTheRoutersMetrics) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("bench-cluster-", getpid());
  for (const std::string& name : ShippedWorkloadNames()) {
    SCOPED_TRACE(name);
    const CounterValues before = Counters();
    const std::filesystem::path out = root / name;
    ringlane::testing::RunResult run = ringlane::testing::RunToExit(
        kBench,
        {"--base_url=" + http_ + "/v1", "--workload=" + name, "--server=ringlane",
         "--out=" + out.string(), "--duration_s=3", "--progress=false"},
        std::chrono::minutes(3));
    ASSERT_EQ(run.code, 0) << run.err;
    const CounterValues after = Counters();

    const json j = json::parse(ReadFile(out / "samples.json"));
    ASSERT_GT(j["samples"].size(), 0u);
    int64_t prompt = 0, completion = 0;
    for (const json& s : j["samples"]) {
      EXPECT_EQ(s["error"], "") << s.dump();
      // Logprob entries counted on the stream agree with usage.
      EXPECT_EQ(s["token_check"], "verified") << s.dump();
      prompt += s["usage_prompt_tokens"].get<int64_t>();
      completion += s["usage_completion_tokens"].get<int64_t>();
      if (name != "soak") {
        // ignore_eos with the watchdog off: exactly max_tokens every time.
        EXPECT_EQ(s["usage_completion_tokens"], s["max_tokens"]);
      }
      EXPECT_TRUE(s["prompt_tokens_exact"].get<bool>());
      EXPECT_EQ(s["usage_prompt_tokens"], s["prompt_tokens_expected"]);
      if (s["phase"] == "warm") {
        EXPECT_GT(s["usage_cached_tokens"].get<int64_t>(), 0);
      }
    }
    for (const json& l : j["levels"]) {
      // The bench's own per-level check, as recorded.
      ASSERT_TRUE(l["has_metrics"].get<bool>());
      prompt += l["warmup_prompt_tokens"].get<int64_t>();
      completion += l["warmup_completion_tokens"].get<int64_t>();
      // copy's documents, made before the level.
      prompt += l["document_prompt_tokens"].get<int64_t>();
      completion += l["document_completion_tokens"].get<int64_t>();
      EXPECT_EQ(l["document_errors"], 0);
      // Without speculation every sampling row yields one token (when the
      // router exports its sampling rows at all).
      const json& d = l["metrics_delta"];
      const bool drafted = d.contains("spec_drafted_tokens") && d["spec_drafted_tokens"] > 0;
      if (!drafted && !l["tokens_per_step"].is_null()) {
        EXPECT_NEAR(l["tokens_per_step"].get<double>(), 1.0, 1e-9) << l.dump();
      }
    }
    // Over the whole run, by our own scrapes around the binary: the tokens
    // the report counts are the tokens the router counted.
    EXPECT_EQ(std::llround(after.at("generation_tokens") - before.at("generation_tokens")),
              completion);
    EXPECT_EQ(std::llround(after.at("prompt_tokens") - before.at("prompt_tokens")), prompt);

    const std::string md = ReadFile(out / "report.md");
    EXPECT_THAT(md, Not(HasSubstr("MISMATCH")));
    EXPECT_THAT(md, Not(HasSubstr("DIFFERS")));
    EXPECT_THAT(md, HasSubstr("## Server metrics"));
    if (name == "sweep" && std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
      EXPECT_TRUE(std::filesystem::exists(out / "sweep.png"));
    }
    if (name == "soak") {
      EXPECT_THAT(md, HasSubstr("## Soak"));
    }
    if (name == "agentic") {
      EXPECT_THAT(md, HasSubstr("| agentic (first) |"));
      EXPECT_THAT(md, HasSubstr("| agentic (repeat) |"));
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ringlane::bench
