// The kvstore daemon for end-to-end tests: start ringlane-kvstore on free
// ports (a disk directory of the test's own), keys and payloads, the client,
// and one Prometheus value read from /metrics. Header-only so that the
// kvstore tests link the daemon launcher and the services alone, not the
// worker and router libraries. Main-thread use.
#ifndef RINGLANE_TESTS_SUPPORT_KVSTORE_H_
#define RINGLANE_TESTS_SUPPORT_KVSTORE_H_

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/flags_util.h"
#include "services/http_client.h"
#include "services/kvstore_client.h"
#include "tests/support/daemon.h"

namespace ringlane::testing {

inline constexpr char kKvstoreBin[] = RINGLANE_KVSTORE_BIN;

// A new, not yet existing directory for a store.
inline std::string KvstoreDir(const std::string& name) {
  static std::atomic<int> n{0};
  const std::string d = ::testing::TempDir() + "/rl_kvd_" + name + "_" + std::to_string(getpid()) +
                        "_" + std::to_string(n++);
  std::filesystem::remove_all(d);
  return d;
}

// ringlane-kvstore on free gRPC and metrics ports with `flags` after those;
// null, after a failed expectation, when it does not come up.
inline std::unique_ptr<Daemon> StartKvstore(const std::vector<std::string>& flags,
                                            const std::string& listen = "127.0.0.1:0") {
  std::vector<std::string> args = {"--listen=" + listen, "--metrics_port=0"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto d = Daemon::Start(kKvstoreBin, args, {"kvstore", "metrics"}, std::chrono::seconds(30));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

inline v1::BlockKey KvKey(int i, const std::string& model = "m", int rank = 0, int world = 2) {
  v1::BlockKey k;
  k.set_model_id(model);
  std::string h(16, '\0');
  for (int b = 0; b < 4; ++b) h[b] = static_cast<char>((i >> (8 * b)) & 0xff);
  k.set_prefix_hash(h);
  k.set_rank(rank);
  k.set_tp_world_size(world);
  k.set_kv_dtype(v1::DTYPE_BF16);
  k.set_block_size_tokens(16);
  return k;
}

// `n` bytes that differ per seed.
inline std::string KvPayload(int seed, size_t n) {
  std::string p(n, '\0');
  uint32_t x = 0x2545f491u * static_cast<uint32_t>(seed + 1);
  for (auto& c : p) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return p;
}

inline std::unique_ptr<services::KvStoreClient> KvClient(
    const Daemon& d, std::chrono::milliseconds deadline = std::chrono::milliseconds(2000)) {
  services::KvStoreClientOptions o;
  o.deadline = deadline;
  o.max_chunk_bytes = 64 << 10;
  o.max_reconnect_backoff = std::chrono::milliseconds(200);
  return services::KvStoreClient::Connect(d.address("kvstore"), o);
}

// Calls `done` every 50 ms until it returns true; false after `timeout`.
template <typename F>
bool PollUntil(F done, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// The state letter of /proc/PID/stat ('T' once SIGSTOP took effect).
inline char ProcessState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// SIGSTOPs `pid` and waits until it is stopped (the signal is delivered
// asynchronously: a call made right after kill() may still be served).
inline bool Freeze(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  return PollUntil([&] { return ProcessState(pid) == 'T'; });
}

// Body of GET /metrics; empty, after a failed expectation, on failure.
inline std::string ScrapeMetrics(const Daemon& d) {
  auto hp = services::ParseHostPort(d.address("metrics"));
  if (!hp.ok()) return "";
  auto c = services::HttpClient::Connect(hp->first, hp->second, absl::Seconds(5));
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return "";
  services::HttpRequestSpec req;
  req.target = "/metrics";
  auto r = (*c)->Send(req, absl::Seconds(5));
  EXPECT_TRUE(r.ok() && r->status == 200);
  return r.ok() ? r->body : "";
}

// The value of the sample `series` (name with its labels, as exposed:
// `ringlane_kvstore_hits_total{tier="dram"}`); -1 when absent.
inline double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_KVSTORE_H_
