// The router with its workers' kvstore (issue 14), end to end: a prompt
// whose blocks the device pool evicted comes back from the store (cached
// tokens reported, the same tokens and log-probabilities as cold), a second
// worker group reuses a prefix the first computed, and a store that is frozen
// or killed under five streams costs recomputation, never a client error.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/kvstore.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::CallOut;
using testing::ClusterOptions;

// A prompt of `n` ids that differs per `seed` from its first token on.
std::vector<int32_t> Prompt(int seed, int n) {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (seed * 131 + i * 7) % 500);
  return p;
}

v1::GenerateRequest Request(const std::vector<int32_t>& prompt) {
  v1::GenerateRequest r = testing::GreedyRequest(prompt, 12);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(2);
  return r;
}

// 12 blocks of 16: one 100-token prompt with its 12 tokens takes 8, so every
// new prompt evicts most of the one before.
ClusterOptions SmallPool(const testing::Daemon& kv) {
  ClusterOptions o;
  o.worker_flags = {"--kv_blocks=12", "--block_size=16", "--metrics_port=0",
                    "--kvstore=" + kv.address("kvstore")};
  return o;
}

double RouterMetric(const testing::Cluster& c, const std::string& name) {
  auto r = testing::GetOnce(c.http(), "/metrics");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? testing::Metric(r->body, name) : -1;
}

void ExpectSameOutput(const CallOut& got, const CallOut& want, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
  ASSERT_EQ(got.choices.size(), 1u) << what;
  const testing::ChoiceOut& g = got.choices.at(0);
  const testing::ChoiceOut& w = want.choices.at(0);
  EXPECT_EQ(g.ids, w.ids) << what;
  EXPECT_EQ(g.logprobs, w.logprobs) << what;
  EXPECT_EQ(g.top_ids, w.top_ids) << what;
  EXPECT_EQ(g.top_logprobs, w.top_logprobs) << what;
}

// Waits until the store holds at least `blocks` blocks (uploads are
// asynchronous).
bool StoreHolds(const testing::Daemon& kv, int64_t blocks) {
  auto client = testing::KvClient(kv);
  return testing::PollUntil([&] {
    auto s = client->Stats();
    return s.ok() && s->blocks_stored() >= blocks;
  });
}

TEST(RouterKvstoreTest, AnEvictedPromptComesBackFromTheStoreWithTheSameOutput) {
  auto kv = testing::StartKvstore({});
  ASSERT_NE(kv, nullptr);
  auto c = testing::StartCluster(SmallPool(*kv));
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> p = Prompt(0, 100);
  const CallOut cold = testing::Call(*c->stub, Request(p));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0);
  ASSERT_TRUE(StoreHolds(*kv, 6)) << "the prompt's 6 full blocks were never offloaded";

  // Two other prompts evict it from the 12-block pool.
  for (int seed : {1, 2}) {
    const CallOut other = testing::Call(*c->stub, Request(Prompt(seed, 100)));
    ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  }
  const double restored_before = RouterMetric(*c, "ringlane_kvstore_restored_tokens_total");
  const CallOut back = testing::Call(*c->stub, Request(p));
  ExpectSameOutput(back, cold, "the prompt served from the kvstore");
  // 6 blocks of 16 are all a 100-token prompt can reuse (its last token is
  // always fed), and some of them came from the store, not the pool.
  EXPECT_EQ(back.usage.cached_tokens(), 96);
  EXPECT_GT(RouterMetric(*c, "ringlane_kvstore_restored_tokens_total"), restored_before);
  EXPECT_GT(c->workers->RankMetric("ringlane_worker_kvstore_restored_blocks_total"), 0);
}

TEST(RouterKvstoreTest, ASecondGroupReusesAPrefixTheFirstComputed) {
  auto kv = testing::StartKvstore({});
  ASSERT_NE(kv, nullptr);
  auto first = testing::StartCluster(SmallPool(*kv));
  auto second = testing::StartCluster(SmallPool(*kv));
  ASSERT_TRUE(first && second);
  const std::vector<int32_t> p = Prompt(7, 100);
  const CallOut a = testing::Call(*first->stub, Request(p));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(StoreHolds(*kv, 6));
  const CallOut b = testing::Call(*second->stub, Request(p));
  ExpectSameOutput(b, a, "the other group's prefix");
  EXPECT_EQ(b.usage.cached_tokens(), 96);
}

// Flips a byte in the middle of every file of the store that holds payloads
// (RocksDB's write-ahead log and blob files), never its manifest.
int CorruptPayloadFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if ((ext != ".log" && ext != ".blob") || e.file_size() < 64) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff at = static_cast<std::streamoff>(e.file_size() / 2);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
    ++n;
  }
  return n;
}

TEST(RouterKvstoreTest, ARestartedStoreStillServesAndACorruptedOneIsOnlyAMiss) {
  const std::string dir = testing::KvstoreDir("restart");
  auto kv = testing::StartKvstore({"--disk_dir=" + dir});
  ASSERT_NE(kv, nullptr);
  const std::string address = kv->address("kvstore");
  auto c = testing::StartCluster(SmallPool(*kv));
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> p = Prompt(3, 100);
  const CallOut cold = testing::Call(*c->stub, Request(p));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  ASSERT_TRUE(StoreHolds(*kv, 6));
  auto restart = [&] {
    kv->Signal(SIGTERM);  // writes its DRAM tier to disk
    EXPECT_TRUE(kv->Wait(std::chrono::seconds(20)).has_value());
    kv = testing::StartKvstore({"--disk_dir=" + dir}, address);
    ASSERT_NE(kv, nullptr);
  };
  auto evict = [&] {
    for (int seed : {4, 5}) {
      const CallOut other = testing::Call(*c->stub, Request(Prompt(seed, 100)));
      ASSERT_TRUE(other.status.ok()) << other.status.error_message();
    }
  };
  restart();
  evict();
  const double restored = RouterMetric(*c, "ringlane_kvstore_restored_tokens_total");
  const CallOut back = testing::Call(*c->stub, Request(p));
  ExpectSameOutput(back, cold, "served by the restarted store");
  EXPECT_EQ(back.usage.cached_tokens(), 96);
  EXPECT_GT(RouterMetric(*c, "ringlane_kvstore_restored_tokens_total"), restored);

  // Damaged on disk: whatever survives is checked, the rest is recomputed.
  kv->Signal(SIGTERM);
  ASSERT_TRUE(kv->Wait(std::chrono::seconds(20)).has_value());
  EXPECT_GT(CorruptPayloadFiles(dir), 0);
  kv = testing::StartKvstore({"--disk_dir=" + dir}, address);
  ASSERT_NE(kv, nullptr);
  evict();
  const CallOut hit = testing::Call(*c->stub, Request(p));
  ExpectSameOutput(hit, cold, "after the store's files were hit");
  // Where the flipped bytes land depends on RocksDB's file layout, so the
  // figures are recorded, not asserted (one run here: 16 cached tokens, one
  // block dropped on its storage checksum).
  auto stats = testing::KvClient(*kv)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  RecordProperty("cached_tokens_after_corruption", hit.usage.cached_tokens());
  RecordProperty("disk_checksum_failures", static_cast<int>(stats->checksum_failures_disk()));
}

TEST(RouterKvstoreTest, AFrozenOrKilledStoreCostsRecomputationNotErrors) {
  auto kv = testing::StartKvstore({});
  ASSERT_NE(kv, nullptr);
  ClusterOptions o = SmallPool(*kv);
  o.worker_flags[0] = "--kv_blocks=48";  // room for five lanes
  o.worker_flags.push_back("--kvstore_deadline_ms=200");
  o.router_flags = {"--kvstore_restore_deadline_ms=300"};
  auto c = testing::StartCluster(o);
  ASSERT_NE(c, nullptr);
  // Solo outputs first (and their blocks in the store).
  std::vector<CallOut> solo;
  for (int i = 0; i < 5; ++i) solo.push_back(testing::Call(*c->stub, Request(Prompt(10 + i, 100))));
  for (const CallOut& s : solo) ASSERT_TRUE(s.status.ok()) << s.status.error_message();

  // Five streams at once of new prompts whose first blocks are the solo
  // ones' and whose tails are new: every admission asks the store for them.
  auto prompt = [](int i, int tail_seed) {
    std::vector<int32_t> p = Prompt(10 + i, 100);
    p.resize(90);
    const std::vector<int32_t> tail = Prompt(tail_seed + i, 40);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    return p;
  };
  auto five = [&](int tail_seed, const std::string& what) {
    std::vector<CallOut> got(5);
    std::vector<std::thread> ts;
    for (int i = 0; i < 5; ++i) {
      ts.emplace_back([&, i] { got[i] = testing::Call(*c->stub, Request(prompt(i, tail_seed))); });
    }
    for (auto& t : ts) t.join();
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(got[i].status.ok())
          << what << " stream " << i << ": " << got[i].status.error_message();
    }
    return got;
  };
  const std::vector<CallOut> healthy = five(20, "store up");
  ASSERT_TRUE(testing::Freeze(kv->pid()));
  const double misses_before = RouterMetric(*c, "ringlane_kvstore_restores_total");
  const std::vector<CallOut> frozen = five(30, "store frozen");
  EXPECT_GT(RouterMetric(*c, "ringlane_kvstore_restores_total"), misses_before)
      << "no admission asked the frozen store";
  EXPECT_EQ(c->workers->RankMetric("ringlane_worker_kvstore_up"), 0);
  ASSERT_EQ(kill(kv->pid(), SIGKILL), 0);
  const std::vector<CallOut> dead = five(40, "store killed");
  // Each equals the same prompt run alone afterwards (with the store gone).
  for (auto [seed, got] : {std::pair{20, &healthy}, {30, &frozen}, {40, &dead}}) {
    for (int i = 0; i < 5; ++i) {
      ExpectSameOutput((*got)[i], testing::Call(*c->stub, Request(prompt(i, seed))),
                       "tail " + std::to_string(seed) + " stream " + std::to_string(i));
    }
  }
  EXPECT_EQ(c->workers->RankMetric("ringlane_worker_kvstore_up"), 0);
}

}  // namespace
}  // namespace ringlane
