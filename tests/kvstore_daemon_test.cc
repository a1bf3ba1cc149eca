// ringlane-kvstore as a real process, driven through services/kvstore_client
// over gRPC: put, the longest stored prefix, lookup, stats, delete by model,
// a rank-shared block, restarts on the same directory (graceful, and kill -9
// with --write_through), /metrics, and the flags that stop it from starting.
// Faults (bad input, a frozen or killed store, a crash mid-put) are in
// kvstore_faults_test.cc.
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/rdma.h"
#include "tests/support/kvstore.h"

namespace ringlane::testing {
namespace {

using services::KvBlockToPut;

constexpr size_t kBlockBytes = 100 << 10;  // two chunks of the client's 64 KiB

std::vector<KvBlockToPut> Blocks(const std::vector<std::string>& payloads, int first,
                                 const std::string& model = "m") {
  std::vector<KvBlockToPut> v;
  for (size_t i = 0; i < payloads.size(); ++i) {
    v.push_back({KvKey(first + static_cast<int>(i), model), payloads[i], std::nullopt});
  }
  return v;
}

std::vector<std::string> Payloads(int n, int seed0 = 0) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back(KvPayload(seed0 + i, kBlockBytes));
  return v;
}

std::vector<v1::BlockKey> Chain(int first, int n, const std::string& model = "m") {
  std::vector<v1::BlockKey> v;
  for (int i = 0; i < n; ++i) v.push_back(KvKey(first + i, model));
  return v;
}

services::KvStoreClientOptions ShmOptions(int64_t shm_bytes) {
  services::KvStoreClientOptions o;
  o.deadline = std::chrono::milliseconds(2000);
  o.max_chunk_bytes = 64 << 10;
  o.shm_bytes = shm_bytes;
  return o;
}

// The same-node transport: payloads through a shared-memory segment both
// ends map, checked like gRPC's; a store that will not attach it (shared
// memory off, or another node) is served over gRPC; a restarted store is
// attached again.
TEST(KvstoreDaemonTest, SharedMemoryCarriesPayloadsAndFallsBackToGrpc) {
  auto d = StartKvstore({});
  ASSERT_NE(d, nullptr);
  // Room for 3 of the 4 blocks: the 4th goes inline in the same call.
  auto c = services::KvStoreClient::Connect(d->address("kvstore"),
                                            ShmOptions(3 * kBlockBytes + services::kShmTokenBytes));
  const std::vector<std::string> p = Payloads(4);
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 4);
  EXPECT_TRUE(c->shm_attached());
  EXPECT_EQ(c->shm_bytes_moved(), static_cast<int64_t>(3 * kBlockBytes));
  // Attached, the segment needs no name: nothing is left in /dev/shm for a
  // client that is killed.
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(
        e.path().filename().string().rfind("ringlane-kv-" + std::to_string(getpid()) + "-", 0), 0u)
        << e.path();
  }
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(0, 4));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->blocks.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got->blocks[i].payload, p[i]) << i;
  EXPECT_EQ(c->shm_bytes_moved(), static_cast<int64_t>(6 * kBlockBytes));
  // A gRPC-only client reads what went in through shared memory.
  got = KvClient(*d)->GetPrefix(Chain(0, 4));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks.size(), 4u);

  // Restarted on its address: the first call finds the segment unknown and
  // fails (fail open), the next attaches again.
  const std::string address = d->address("kvstore");
  d->Signal(SIGKILL);
  d->Wait(std::chrono::seconds(10));
  d = StartKvstore({}, address);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(PollUntil([&] { return c->Put(Blocks(p, 0)).ok() && c->shm_attached(); }));
  got = c->GetPrefix(Chain(0, 4));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks.size(), 4u);

  // Shared memory off on the store: everything over gRPC, nothing refused.
  auto off = StartKvstore({"--shm_dir="});
  ASSERT_NE(off, nullptr);
  auto g = services::KvStoreClient::Connect(off->address("kvstore"), ShmOptions(1 << 20));
  ASSERT_TRUE(g->Put(Blocks(p, 0)).ok());
  got = g->GetPrefix(Chain(0, 4));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks.size(), 4u);
  EXPECT_FALSE(g->shm_attached());
  EXPECT_EQ(g->shm_bytes_moved(), 0);
}

// RDMA where there is no device (this machine, and every machine the
// project's tests run on so far): the store refuses AttachRdma cleanly and
// says why once in its log, knows no region, and a client asked to use RDMA
// falls back to shared memory or gRPC with identical, verified blocks. The
// verbs data path itself has never run here.
TEST(KvstoreDaemonTest, WithoutAnRdmaDeviceAttachIsRefusedAndClientsFallBack) {
  if (!services::RdmaDeviceNames().empty()) GTEST_SKIP() << "this machine has RDMA devices";
  const std::vector<std::string> p = Payloads(4);
  for (const std::string mode : {"auto", "off"}) {
    SCOPED_TRACE(mode);
    auto d = StartKvstore({"--rdma=" + mode});
    ASSERT_NE(d, nullptr);
    EXPECT_NE(d->Stderr().find(mode == "off" ? "RDMA is off" : "RDMA unavailable: no RDMA device"),
              std::string::npos)
        << d->Stderr();
    auto stub = v1::KvStore::NewStub(
        grpc::CreateChannel(d->address("kvstore"), grpc::InsecureChannelCredentials()));
    auto call = [](auto fn) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      return fn(&ctx);
    };
    // A well-formed request, as a client with a device would send it.
    services::RdmaQpAddress a;
    a.lid = 1;
    a.gid[15] = 1;
    a.qpn = 77;
    v1::AttachRdmaRequest attach;
    services::RdmaQpAddressToProto(a, attach.mutable_qp());
    attach.set_size_bytes(1 << 20);
    v1::AttachRdmaResponse attached;
    grpc::Status st =
        call([&](grpc::ClientContext* ctx) { return stub->AttachRdma(ctx, attach, &attached); });
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_NE(st.error_message().find(mode == "off" ? "RDMA is off" : "no RDMA device"),
              std::string::npos)
        << st.error_message();
    // A region it never attached.
    const std::string region = "rdma-" + std::string(32, '0');
    v1::PutRdmaRequest put;
    put.set_region(region);
    v1::RdmaBlock* b = put.add_blocks();
    *b->mutable_key() = KvKey(0);
    b->set_offset(0);
    b->set_length(1000);
    v1::PutResponse put_resp;
    EXPECT_EQ(call([&](grpc::ClientContext* ctx) {
                return stub->PutRdma(ctx, put, &put_resp);
              }).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
    v1::GetRdmaRequest get;
    get.set_region(region);
    *get.add_keys() = KvKey(0);
    v1::GetRdmaResponse get_resp;
    EXPECT_EQ(call([&](grpc::ClientContext* ctx) {
                return stub->GetRdma(ctx, get, &get_resp);
              }).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);

    // Clients that want RDMA (as --kvstore_rdma=on would make them, the
    // device check aside): with a shared-memory segment, and gRPC alone.
    for (const int64_t shm_bytes : {int64_t{1} << 20, int64_t{0}}) {
      SCOPED_TRACE(shm_bytes);
      services::KvStoreClientOptions o = ShmOptions(shm_bytes);
      o.rdma_bytes = 1 << 20;
      auto c = services::KvStoreClient::Connect(d->address("kvstore"), o);
      const int first = shm_bytes > 0 ? 0 : 10;
      absl::StatusOr<v1::PutResponse> r = c->Put(Blocks(p, first));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->num_blocks(), 4);
      absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(first, 4));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->stopped.ok()) << got->stopped;
      ASSERT_EQ(got->blocks.size(), 4u);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(got->blocks[i].payload, p[i]) << i;
        EXPECT_EQ(got->blocks[i].xxh64, XXH64(p[i].data(), p[i].size(), 0)) << i;
      }
      EXPECT_FALSE(c->rdma_attached());
      EXPECT_EQ(c->rdma_bytes_moved(), 0);
      EXPECT_EQ(c->checksum_failures(), 0);
      EXPECT_EQ(c->shm_attached(), shm_bytes > 0);
      EXPECT_EQ(c->shm_bytes_moved(), shm_bytes > 0 ? static_cast<int64_t>(8 * kBlockBytes) : 0);
    }
  }
}

// --health_listen: plaintext health alone, for probes without a certificate.
TEST(KvstoreDaemonTest, TheHealthPortServesHealthAlone) {
  auto d = Daemon::Start(kKvstoreBin, {"--listen=127.0.0.1:0", "--health_listen=127.0.0.1:0"},
                         {"kvstore", "health"}, std::chrono::seconds(30));
  ASSERT_TRUE(d.ok()) << d.status();
  auto ch = grpc::CreateChannel((*d)->address("health"), grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("ringlane.v1.KvStore");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(ch)->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse st;
  EXPECT_EQ(v1::KvStore::NewStub(ch)->Stats(&ctx2, v1::StatsRequest(), &st).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST(KvstoreDaemonTest, PutGetLookupStatsAndDelete) {
  auto d = StartKvstore({"--disk_dir=" + KvstoreDir("basic"), "--disk_bytes=10000000"});
  ASSERT_NE(d, nullptr);
  auto c = KvClient(*d);
  const std::vector<std::string> p = Payloads(4);
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 4);
  EXPECT_EQ(put->total_bytes(), static_cast<int64_t>(4 * kBlockBytes));
  EXPECT_EQ(put->num_already_stored(), 0);
  put = c->Put(Blocks({p[0]}, 0));
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->num_already_stored(), 1);

  // A chain of 6 whose first 4 are stored: the prefix is 4 long.
  absl::StatusOr<v1::LookupResponse> look = c->Lookup(Chain(0, 6));
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->num_leading_present(), 4);
  ASSERT_EQ(look->present_size(), 6);
  EXPECT_FALSE(look->present(4));
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(0, 6));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->stopped.ok());
  ASSERT_EQ(got->blocks.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got->blocks[i].payload, p[i]) << i;
  // A hole ends the prefix even when later keys are stored.
  std::vector<v1::BlockKey> holed = {KvKey(0), KvKey(99), KvKey(2)};
  got = c->GetPrefix(holed);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks.size(), 1u);

  // A rank-shared block is one entry: rank 1 reads what rank 0 put.
  v1::BlockKey shared = KvKey(50, "m", 0);
  shared.set_rank_shared(true);
  const std::string latent = KvPayload(50, 3000);
  ASSERT_TRUE(c->Put({{KvBlockToPut{shared, latent, std::nullopt}}}).ok());
  shared.set_rank(1);
  got = c->GetPrefix({shared});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->blocks.size(), 1u);
  EXPECT_EQ(got->blocks[0].payload, latent);
  // ...and is not the per-rank block of the same hash.
  EXPECT_EQ(c->Lookup({KvKey(50, "m", 1)})->num_leading_present(), 0);

  absl::StatusOr<v1::StatsResponse> st = c->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->blocks_stored(), 5);
  EXPECT_EQ(st->dram().entries(), 5);
  EXPECT_EQ(st->dram().hits(), 4 + 1 + 1);
  EXPECT_EQ(st->misses(), 2);
  EXPECT_EQ(st->bytes_out(), static_cast<int64_t>(5 * kBlockBytes + 3000));
  EXPECT_GT(st->disk().capacity_bytes(), 0);

  ASSERT_TRUE(c->Put(Blocks(Payloads(2, 10), 0, "other")).ok());
  absl::StatusOr<v1::DeleteModelResponse> del = c->DeleteModel("m");
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(del->num_dram_deleted() + del->num_disk_deleted(), 5);
  EXPECT_EQ(c->Lookup(Chain(0, 4))->num_leading_present(), 0);
  EXPECT_EQ(c->Lookup(Chain(0, 2, "other"))->num_leading_present(), 2);
}

TEST(KvstoreDaemonTest, DramEvictionsDemoteAndARestartOnTheSameDirectoryKeepsEveryBlock) {
  const std::string dir = KvstoreDir("restart");
  // DRAM holds about two blocks; the rest is demoted to disk as it goes.
  const std::vector<std::string> flags = {"--dram_bytes=250000", "--disk_dir=" + dir,
                                          "--disk_bytes=10000000"};
  const std::vector<std::string> p = Payloads(6);
  {
    auto d = StartKvstore(flags);
    ASSERT_NE(d, nullptr);
    auto c = KvClient(*d);
    ASSERT_TRUE(c->Put(Blocks(p, 0)).ok());
    absl::StatusOr<v1::StatsResponse> st = c->Stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->dram().entries(), 2);
    EXPECT_EQ(st->demotions(), 4);
    EXPECT_EQ(st->disk().entries(), 4);
    c.reset();
    d->Signal(SIGTERM);  // drains and writes DRAM to disk
    EXPECT_EQ(d->Wait(std::chrono::seconds(20)), 0) << d->Stderr();
  }
  auto d = StartKvstore(flags);
  ASSERT_NE(d, nullptr);
  auto c = KvClient(*d);
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(0, 6));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->blocks.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got->blocks[i].payload, p[i]) << i;
  absl::StatusOr<v1::StatsResponse> st = c->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk().entries(), 6);
  EXPECT_GE(st->disk().hits(), 4);
}

TEST(KvstoreDaemonTest, WithWriteThroughAKillDashNineLosesNothingAcknowledged) {
  const std::string dir = KvstoreDir("kill9");
  const std::vector<std::string> flags = {"--disk_dir=" + dir, "--write_through"};
  const std::vector<std::string> p = Payloads(3);
  {
    auto d = StartKvstore(flags);
    ASSERT_NE(d, nullptr);
    ASSERT_TRUE(KvClient(*d)->Put(Blocks(p, 0)).ok());
    d->Signal(SIGKILL);
    d->Wait(std::chrono::seconds(10));
  }
  auto d = StartKvstore(flags);
  ASSERT_NE(d, nullptr);
  absl::StatusOr<services::KvGetResult> got = KvClient(*d)->GetPrefix(Chain(0, 3));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->blocks.size(), 3u);
  EXPECT_EQ(got->blocks[2].payload, p[2]);
}

TEST(KvstoreDaemonTest, MetricsExposeTheCounters) {
  auto d = StartKvstore({"--dram_bytes=250000", "--disk_dir=" + KvstoreDir("metrics")});
  ASSERT_NE(d, nullptr);
  auto c = KvClient(*d);
  ASSERT_TRUE(c->Put(Blocks(Payloads(3), 0)).ok());
  ASSERT_EQ(c->GetPrefix(Chain(0, 4))->blocks.size(), 3u);
  // A payload that does not match the checksum its producer gave.
  const std::string bad = KvPayload(9, 1000);
  EXPECT_EQ(c->Put({{KvBlockToPut{KvKey(9), bad, 42}}}).status().code(),
            absl::StatusCode::kDataLoss);
  const std::string text = ScrapeMetrics(*d);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_blocks_stored_total"), 3) << text;
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_hits_total{tier=\"dram\"}") +
                MetricValue(text, "ringlane_kvstore_hits_total{tier=\"disk\"}"),
            3);
  EXPECT_GE(MetricValue(text, "ringlane_kvstore_hits_total{tier=\"disk\"}"), 1);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_misses_total"), 1);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_checksum_failures_total{where=\"put\"}"), 1);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_checksum_failures_total{where=\"disk\"}"), 0);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_bytes_in_total"), 3 * kBlockBytes);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_bytes_out_total"), 3 * kBlockBytes);
  EXPECT_GE(MetricValue(text, "ringlane_kvstore_demotions_total"), 1);
  EXPECT_GE(MetricValue(text, "ringlane_kvstore_evictions_total{tier=\"dram\"}"), 1);
  EXPECT_GE(MetricValue(text, "ringlane_kvstore_entries{tier=\"disk\"}"), 1);
  EXPECT_GT(MetricValue(text, "ringlane_kvstore_bytes{tier=\"dram\"}"), 0);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_capacity_bytes{tier=\"dram\"}"), 250000);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_rejected_calls_total{reason=\"busy\"}"), 0);
}

TEST(KvstoreDaemonTest, ItRefusesToStartWhenItCannotServe) {
  struct Case {
    std::vector<std::string> args;
    int code;
    const char* says;
  };
  const std::string file = KvstoreDir("file");
  { std::ofstream(file) << "x"; }
  const Case cases[] = {
      {{"--dram_bytes=-1"}, 2, "--dram_bytes"},
      {{"--max_chunk_bytes=10"}, 2, "--max_chunk_bytes"},
      {{"--max_concurrent_calls=0"}, 2, "--max_concurrent_calls"},
      {{"--disk_dir=" + KvstoreDir("d"), "--disk_bytes=0"}, 2, "--disk_bytes"},
      {{"--metrics_port=70000"}, 2, "--metrics_port"},
      {{"--listen=nonsense"}, 2, "--listen"},
      {{"--disk_dir=" + file}, 2, "not a directory"},
      {{"--listen=0.0.0.0:0"}, 2, "TLS is off"},
      {{"--tls_ca=/nonexistent"}, 2, "--tls"},
      {{"--rdma=yes"}, 2, "--rdma: 'yes' is none of auto, on, off"},
      {{"--rdma_device=mlx5_0:0"}, 2, "--rdma_device"},
      {{"--max_rdma_bytes=0"}, 2, "--max_rdma_bytes"},
      {{"--max_rdma_clients=0"}, 2, "--max_rdma_clients"},
  };
  for (const Case& c : cases) {
    RunResult r = RunToExit(kKvstoreBin, c.args, std::chrono::seconds(20));
    EXPECT_EQ(r.code, c.code) << c.args[0] << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args[0] << ": " << r.err;
  }
  // RDMA required (or a device named) where there is none: status 1, as
  // for any resource it cannot use.
  if (services::RdmaDeviceNames().empty()) {
    RunResult r =
        RunToExit(kKvstoreBin, {"--listen=127.0.0.1:0", "--rdma=on"}, std::chrono::seconds(20));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("--rdma=on: RDMA 'on' requested, but no RDMA device found"),
              std::string::npos)
        << r.err;
    r = RunToExit(kKvstoreBin, {"--listen=127.0.0.1:0", "--rdma_device=mlx5_0"},
                  std::chrono::seconds(20));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("RDMA device 'mlx5_0' not found"), std::string::npos) << r.err;
  }
  // A port in use, and a directory another kvstore holds: status 1.
  const std::string dir = KvstoreDir("held");
  auto first = StartKvstore({"--disk_dir=" + dir});
  ASSERT_NE(first, nullptr);
  RunResult r =
      RunToExit(kKvstoreBin, {"--listen=" + first->address("kvstore")}, std::chrono::seconds(20));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot listen"), std::string::npos) << r.err;
  r = RunToExit(kKvstoreBin, {"--listen=127.0.0.1:0", "--disk_dir=" + dir},
                std::chrono::seconds(20));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot open the store"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ringlane::testing
