// ringlane-kvstore under bad input and faults, as a real process: a table of
// requests that must fail with INVALID_ARGUMENT (or DATA_LOSS) without
// harming the daemon, a Put stream cut inside a block (by the client, and by
// a kill -9 of the daemon) that leaves nothing of that block, and a frozen
// (SIGSTOP) or killed store whose client calls return within their deadline
// and work again once it is back.
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ringlane/v1/kvstore.grpc.pb.h"
#include "services/grpc_security.h"
#include "services/rdma.h"
#include "services/shm_segment.h"
#include "tests/support/kvstore.h"

namespace ringlane::testing {
namespace {

using Clock = std::chrono::steady_clock;
using services::KvBlockToPut;

uint64_t Sum(const std::string& s) { return XXH64(s.data(), s.size(), 0); }

v1::KvBlockChunk Chunk(const v1::BlockKey& key, const std::string& payload, int64_t off,
                       int64_t n) {
  v1::KvBlockChunk c;
  *c.mutable_key() = key;
  c.set_offset_bytes(off);
  c.set_total_bytes(static_cast<int64_t>(payload.size()));
  c.set_data(payload.substr(off, n));
  c.set_payload_xxh64(Sum(payload));
  return c;
}

// Sends `chunks` on one Put stream and returns the call's status.
grpc::Status RawPut(v1::KvStore::Stub& stub, const std::vector<v1::KvBlockChunk>& chunks) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PutResponse resp;
  auto w = stub.Put(&ctx, &resp);
  for (const auto& c : chunks) {
    if (!w->Write(c)) break;
  }
  w->WritesDone();
  return w->Finish();
}

std::unique_ptr<v1::KvStore::Stub> Stub(const Daemon& d) {
  return v1::KvStore::NewStub(
      grpc::CreateChannel(d.address("kvstore"), grpc::InsecureChannelCredentials()));
}

constexpr int64_t kMaxChunk = 64 << 10;
constexpr int64_t kMaxBlock = 1 << 20;

TEST(KvstoreFaultsTest, BadInputIsInvalidArgumentAndHarmless) {
  auto d =
      StartKvstore({"--max_chunk_bytes=" + std::to_string(kMaxChunk),
                    "--max_block_bytes=" + std::to_string(kMaxBlock), "--max_keys_per_request=8"});
  ASSERT_NE(d, nullptr);
  auto stub = Stub(*d);
  const std::string p = KvPayload(1, 10000);
  const v1::BlockKey k = KvKey(1);
  auto with_key = [&](std::function<void(v1::BlockKey*)> f) {
    v1::KvBlockChunk c = Chunk(k, p, 0, static_cast<int64_t>(p.size()));
    f(c.mutable_key());
    return std::vector<v1::KvBlockChunk>{c};
  };
  auto whole = [&](std::function<void(v1::KvBlockChunk*)> f) {
    v1::KvBlockChunk c = Chunk(k, p, 0, static_cast<int64_t>(p.size()));
    f(&c);
    return std::vector<v1::KvBlockChunk>{c};
  };
  struct PutCase {
    const char* name;
    std::vector<v1::KvBlockChunk> chunks;
    grpc::StatusCode code;
  };
  const PutCase puts[] = {
      {"empty model id", with_key([](v1::BlockKey* k) { k->clear_model_id(); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"model id too long",
       with_key([](v1::BlockKey* k) { k->set_model_id(std::string(300, 'm')); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"8-byte prefix hash", with_key([](v1::BlockKey* k) { k->set_prefix_hash("12345678"); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"rank outside the group", with_key([](v1::BlockKey* k) { k->set_rank(5); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"unknown dtype",
       with_key([](v1::BlockKey* k) { k->set_kv_dtype(static_cast<v1::DType>(42)); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"total_bytes 0", whole([](v1::KvBlockChunk* c) { c->set_total_bytes(0); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"total over max_block_bytes",
       whole([](v1::KvBlockChunk* c) { c->set_total_bytes(kMaxBlock + 1); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"negative total", whole([](v1::KvBlockChunk* c) { c->set_total_bytes(-5); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"chunk over max_chunk_bytes",
       {Chunk(k, std::string(kMaxChunk + 1, 'b'), 0, kMaxChunk + 1)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"empty chunk", whole([](v1::KvBlockChunk* c) { c->clear_data(); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"first chunk not at 0", {Chunk(k, p, 100, 900)}, grpc::StatusCode::INVALID_ARGUMENT},
      {"a gap",
       {Chunk(k, p, 0, 1000), Chunk(k, p, 2000, 1000)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"an overlap",
       {Chunk(k, p, 0, 1000), Chunk(k, p, 500, 1000)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"more data than total", whole([](v1::KvBlockChunk* c) { c->set_total_bytes(9000); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"another key mid-block",
       {Chunk(k, p, 0, 1000), Chunk(KvKey(2), p, 1000, 9000)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"the stream ends mid-block", {Chunk(k, p, 0, 1000)}, grpc::StatusCode::INVALID_ARGUMENT},
      {"checksum mismatch", whole([](v1::KvBlockChunk* c) { c->set_payload_xxh64(7); }),
       grpc::StatusCode::DATA_LOSS},
  };
  for (const PutCase& c : puts) {
    grpc::Status st = RawPut(*stub, c.chunks);
    EXPECT_EQ(st.error_code(), c.code) << c.name << ": " << st.error_message();
    // Nothing of a rejected block is stored.
    v1::LookupRequest lr;
    *lr.add_keys() = k;
    v1::LookupResponse lresp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Lookup(&ctx, lr, &lresp).ok());
    EXPECT_FALSE(lresp.present(0)) << c.name;
  }

  struct GetCase {
    const char* name;
    std::function<void(v1::GetRequest*)> make;
    bool bad_keys = true;  // a Lookup of the same keys is invalid too
  };
  const GetCase gets[] = {
      {"9 keys",
       [&](v1::GetRequest* r) {
         for (int i = 0; i < 9; ++i) *r->add_keys() = KvKey(i);
       }},
      {"a bad key",
       [&](v1::GetRequest* r) {
         *r->add_keys() = k;
         r->add_keys()->set_model_id("m");
       }},
      {"negative chunk size",
       [&](v1::GetRequest* r) {
         *r->add_keys() = k;
         r->set_max_chunk_bytes(-1);
       },
       false},
      {"chunk size over the limit",
       [&](v1::GetRequest* r) {
         *r->add_keys() = k;
         r->set_max_chunk_bytes(kMaxChunk + 1);
       },
       false},
  };
  for (const GetCase& c : gets) {
    v1::GetRequest req;
    c.make(&req);
    grpc::ClientContext ctx;
    auto reader = stub->Get(&ctx, req);
    v1::KvBlockChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    if (!c.bad_keys) continue;
    v1::LookupRequest lr;
    *lr.mutable_keys() = req.keys();
    v1::LookupResponse lresp;
    grpc::ClientContext lctx;
    EXPECT_EQ(stub->Lookup(&lctx, lr, &lresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name;
  }
  {
    v1::DeleteModelRequest req;
    v1::DeleteModelResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->DeleteModel(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Still serving, and a good block goes in after all that.
  ASSERT_TRUE(RawPut(*stub, {Chunk(k, p, 0, 4000), Chunk(k, p, 4000, 6000)}).ok());
  auto c = KvClient(*d);
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix({k});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->blocks.size(), 1u);
  EXPECT_EQ(got->blocks[0].payload, p);
  const std::string text = ScrapeMetrics(*d);
  EXPECT_GE(MetricValue(text, "ringlane_kvstore_rejected_calls_total{reason=\"invalid\"}"), 20);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_checksum_failures_total{where=\"put\"}"), 1);
}

// AttachShm and shared-memory slices from a hostile or confused client: a
// name that reaches out of the directory, a file that is not the caller's
// (wrong token), an unknown segment, a slice past the segment's end.
TEST(KvstoreFaultsTest, BadSharedMemoryRequestsAreRefusedAndHarmless) {
  const std::string dir = ::testing::TempDir() + "/rl_shm_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto d = StartKvstore({"--shm_dir=" + dir});
  ASSERT_NE(d, nullptr);
  auto stub = Stub(*d);
  auto attach = [&](const std::string& name, const std::string& token) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::AttachShmRequest req;
    req.set_segment(name);
    req.set_token(token);
    v1::AttachShmResponse resp;
    return stub->AttachShm(&ctx, req, &resp).error_code();
  };
  const std::string token(services::kShmTokenBytes, 'x');
  EXPECT_EQ(attach("../../etc/passwd", token), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attach("ringlane-kv-../x", token), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attach("ringlane-kv-1", "short"), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attach("ringlane-kv-nothere", token), grpc::StatusCode::FAILED_PRECONDITION);
  auto seg = services::ShmSegment::Create(dir, 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(attach((*seg)->name(), token), grpc::StatusCode::FAILED_PRECONDITION);  // not its token
  // A link in the directory to a file outside it is not followed.
  std::filesystem::create_symlink("/etc/hostname", dir + "/ringlane-kv-link");
  EXPECT_NE(attach("ringlane-kv-link", token), grpc::StatusCode::OK);

  const v1::BlockKey key = KvKey(1);
  const std::string payload = KvPayload(1, 1000);
  v1::KvBlockChunk c = Chunk(key, payload, 0, 1000);
  c.clear_data();
  c.mutable_shm()->set_segment((*seg)->name());
  c.mutable_shm()->set_offset(services::kShmTokenBytes);
  c.mutable_shm()->set_length(1000);
  EXPECT_EQ(RawPut(*stub, {c}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // unattached
  ASSERT_EQ(attach((*seg)->name(), std::string((*seg)->token())), grpc::StatusCode::OK);
  c.mutable_shm()->set_offset(4000);  // 4000 + 1000 > 4096
  EXPECT_EQ(RawPut(*stub, {c}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  c.mutable_shm()->set_offset(0);  // over the token
  EXPECT_EQ(RawPut(*stub, {c}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Bytes that are not the payload's: its checksum refuses them.
  c.mutable_shm()->set_offset(services::kShmTokenBytes);
  EXPECT_EQ(RawPut(*stub, {c}).error_code(), grpc::StatusCode::DATA_LOSS);
  std::memcpy((*seg)->data() + services::kShmTokenBytes, payload.data(), payload.size());
  EXPECT_TRUE(RawPut(*stub, {c}).ok());
  auto client = KvClient(*d);
  auto got = client->GetPrefix({key});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->blocks.size(), 1u);
  EXPECT_EQ(got->blocks[0].payload, payload);
  std::filesystem::remove_all(dir);
}

// The RDMA calls from a hostile or confused client: every malformed
// AttachRdma, PutRdma and GetRdma is INVALID_ARGUMENT, checked before the
// store's RDMA state (so this runs on a store without a device), counted,
// and harmless.
TEST(KvstoreFaultsTest, BadRdmaRequestsAreInvalidArgumentAndHarmless) {
  auto d =
      StartKvstore({"--max_block_bytes=" + std::to_string(kMaxBlock), "--max_keys_per_request=8"});
  ASSERT_NE(d, nullptr);
  auto stub = Stub(*d);
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };
  services::RdmaQpAddress good;
  good.lid = 1;
  good.gid[15] = 1;
  good.qpn = 77;
  good.psn = 5;
  auto attach = [&](void (*spoil)(v1::AttachRdmaRequest*)) {
    v1::AttachRdmaRequest req;
    services::RdmaQpAddressToProto(good, req.mutable_qp());
    req.set_size_bytes(1 << 20);
    spoil(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::AttachRdmaResponse resp;
    return stub->AttachRdma(&ctx, req, &resp).error_code();
  };
  struct AttachCase {
    const char* what;
    void (*spoil)(v1::AttachRdmaRequest*);
  };
  const AttachCase attaches[] = {
      {"no address", [](v1::AttachRdmaRequest* r) { r->clear_qp(); }},
      {"gid of 3 bytes", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_gid("abc"); }},
      {"qpn 0", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_qpn(0); }},
      {"qpn over 24 bits", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_qpn(1 << 24); }},
      {"psn over 24 bits", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_psn(1 << 24); }},
      {"lid over 16 bits", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_lid(1 << 16); }},
      {"mtu 1500", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_mtu_bytes(1500); }},
      {"port 0", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_port(0); }},
      {"port 256", [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_port(256); }},
      {"device name of 65 bytes",
       [](v1::AttachRdmaRequest* r) { r->mutable_qp()->set_device(std::string(65, 'd')); }},
      {"size 0", [](v1::AttachRdmaRequest* r) { r->set_size_bytes(0); }},
      {"negative size", [](v1::AttachRdmaRequest* r) { r->set_size_bytes(-1); }},
      {"previous region not a region name",
       [](v1::AttachRdmaRequest* r) { r->set_previous_region("../x"); }},
  };
  for (const AttachCase& c : attaches) {
    EXPECT_EQ(attach(c.spoil), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
  }
  // The same request unspoiled is refused for want of a device, not as bad.
  EXPECT_EQ(attach([](v1::AttachRdmaRequest*) {}), grpc::StatusCode::FAILED_PRECONDITION);

  const std::string region = "rdma-" + std::string(32, 'a');
  auto put = [&](void (*spoil)(v1::PutRdmaRequest*)) {
    v1::PutRdmaRequest req;
    req.set_region(region);
    v1::RdmaBlock* b = req.add_blocks();
    *b->mutable_key() = KvKey(1);
    b->set_offset(0);
    b->set_length(1000);
    spoil(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::PutResponse resp;
    return stub->PutRdma(&ctx, req, &resp).error_code();
  };
  struct PutCase {
    const char* what;
    void (*spoil)(v1::PutRdmaRequest*);
  };
  const PutCase puts[] = {
      {"no region", [](v1::PutRdmaRequest* r) { r->clear_region(); }},
      {"a shared-memory name", [](v1::PutRdmaRequest* r) { r->set_region("ringlane-kv-1"); }},
      {"upper-case hex",
       [](v1::PutRdmaRequest* r) { r->set_region("rdma-" + std::string(32, 'A')); }},
      {"short id", [](v1::PutRdmaRequest* r) { r->set_region("rdma-abc"); }},
      {"bad key",
       [](v1::PutRdmaRequest* r) { r->mutable_blocks(0)->mutable_key()->clear_model_id(); }},
      {"length 0", [](v1::PutRdmaRequest* r) { r->mutable_blocks(0)->set_length(0); }},
      {"length over max_block_bytes",
       [](v1::PutRdmaRequest* r) { r->mutable_blocks(0)->set_length(kMaxBlock + 1); }},
      {"negative offset", [](v1::PutRdmaRequest* r) { r->mutable_blocks(0)->set_offset(-1); }},
      {"more blocks than max_keys_per_request",
       [](v1::PutRdmaRequest* r) {
         for (int i = 0; i < 8; ++i) *r->add_blocks() = r->blocks(0);
       }},
  };
  for (const PutCase& c : puts) {
    EXPECT_EQ(put(c.spoil), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
  }
  EXPECT_EQ(put([](v1::PutRdmaRequest*) {}), grpc::StatusCode::FAILED_PRECONDITION);

  auto get = [&](void (*spoil)(v1::GetRdmaRequest*)) {
    v1::GetRdmaRequest req;
    req.set_region(region);
    *req.add_keys() = KvKey(1);
    spoil(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::GetRdmaResponse resp;
    return stub->GetRdma(&ctx, req, &resp).error_code();
  };
  struct GetCase {
    const char* what;
    void (*spoil)(v1::GetRdmaRequest*);
  };
  const GetCase gets[] = {
      {"no region", [](v1::GetRdmaRequest* r) { r->clear_region(); }},
      {"a path", [](v1::GetRdmaRequest* r) { r->set_region("rdma-/../../etc/passwd"); }},
      {"bad key", [](v1::GetRdmaRequest* r) { r->mutable_keys(0)->set_prefix_hash("short"); }},
      {"more keys than max_keys_per_request",
       [](v1::GetRdmaRequest* r) {
         for (int i = 0; i < 8; ++i) *r->add_keys() = r->keys(0);
       }},
  };
  for (const GetCase& c : gets) {
    EXPECT_EQ(get(c.spoil), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
  }
  EXPECT_EQ(get([](v1::GetRdmaRequest*) {}), grpc::StatusCode::FAILED_PRECONDITION);

  // Counted as invalid, and the store serves on.
  const std::string text = ScrapeMetrics(*d);
  EXPECT_EQ(MetricValue(text, "ringlane_kvstore_rejected_calls_total{reason=\"invalid\"}"),
            static_cast<double>(std::size(attaches) + std::size(puts) + std::size(gets)));
  const std::string p = KvPayload(1, 1000);
  auto c = KvClient(*d);
  ASSERT_TRUE(c->Put({{KvBlockToPut{KvKey(1), p, std::nullopt}}}).ok());
  auto got = c->GetPrefix({KvKey(1)});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->blocks.size(), 1u);
  EXPECT_EQ(got->blocks[0].payload, p);
}

TEST(KvstoreFaultsTest, AKillMidPutLeavesNothingOfTheUnfinishedBlock) {
  const std::string dir = KvstoreDir("midput");
  const std::vector<std::string> flags = {"--disk_dir=" + dir, "--write_through"};
  const std::string done = KvPayload(1, 50000);
  const std::string cut = KvPayload(2, 50000);
  {
    auto d = StartKvstore(flags);
    ASSERT_NE(d, nullptr);
    auto stub = Stub(*d);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::PutResponse resp;
    auto w = stub->Put(&ctx, &resp);
    ASSERT_TRUE(w->Write(Chunk(KvKey(1), done, 0, 50000)));
    ASSERT_TRUE(w->Write(Chunk(KvKey(2), cut, 0, 20000)));
    // Let the daemon take both in (the first block is complete, so stored).
    auto c = KvClient(*d);
    ASSERT_TRUE(PollUntil([&] {
      return c->Lookup({KvKey(1)}).value_or(v1::LookupResponse()).num_leading_present() == 1;
    }));
    EXPECT_EQ(c->Lookup({KvKey(2)})->num_leading_present(), 0);
    d->Signal(SIGKILL);
    d->Wait(std::chrono::seconds(10));
    (void)w->Write(Chunk(KvKey(2), cut, 20000, 30000));
    EXPECT_FALSE(w->Finish().ok());
  }
  auto d = StartKvstore(flags);
  ASSERT_NE(d, nullptr);
  auto c = KvClient(*d);
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix({KvKey(1), KvKey(2)});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->blocks.size(), 1u);
  EXPECT_EQ(got->blocks[0].payload, done);
}

// Each call's time to fail, which must stay under 3x the deadline: a hang
// test, not a speed test.
void ExpectEveryCallFailsWithin(services::KvStoreClient& c, std::chrono::milliseconds deadline) {
  const std::string p = KvPayload(7, 200000);
  std::vector<std::function<absl::Status()>> calls = {
      [&] {
        return c.GetPrefix({KvKey(1), KvKey(2)}).status();
      },
      [&] {
        return c.Put({{KvBlockToPut{KvKey(7), p, std::nullopt}}}).status();
      },
      [&] { return c.Lookup({KvKey(1)}).status(); },
      [&] { return c.Stats().status(); },
      [&] { return c.DeleteModel("x").status(); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto t0 = Clock::now();
    const absl::Status st = calls[i]();
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    EXPECT_FALSE(st.ok()) << "call " << i;
    EXPECT_LT(took, 3 * deadline) << "call " << i << ": " << st;
  }
}

TEST(KvstoreFaultsTest, AFrozenStoreFailsCallsWithinTheDeadlineAndServesAgainAfterSigcont) {
  auto d = StartKvstore({});
  ASSERT_NE(d, nullptr);
  const auto deadline = std::chrono::milliseconds(250);
  auto c = KvClient(*d, deadline);
  ASSERT_TRUE(c->Put({{KvBlockToPut{KvKey(1), KvPayload(1, 1000), std::nullopt}}}).ok());
  d->Signal(SIGSTOP);
  ASSERT_TRUE(PollUntil([&] { return ProcessState(d->pid()) == 'T'; }));
  ExpectEveryCallFailsWithin(*c, deadline);
  d->Signal(SIGCONT);
  EXPECT_TRUE(PollUntil([&] { return c->Lookup({KvKey(1)}).ok(); }, std::chrono::seconds(10)));
  EXPECT_EQ(c->GetPrefix({KvKey(1)})->blocks.size(), 1u);
}

TEST(KvstoreFaultsTest, AKilledStoreFailsCallsFastAndTheClientReconnectsToItsReplacement) {
  const std::string dir = KvstoreDir("killed");
  auto d = StartKvstore({"--disk_dir=" + dir, "--write_through"});
  ASSERT_NE(d, nullptr);
  const std::string address = d->address("kvstore");
  const auto deadline = std::chrono::milliseconds(250);
  auto c = KvClient(*d, deadline);
  ASSERT_TRUE(c->Put({{KvBlockToPut{KvKey(1), KvPayload(1, 1000), std::nullopt}}}).ok());
  d->Signal(SIGKILL);
  d->Wait(std::chrono::seconds(10));
  ExpectEveryCallFailsWithin(*c, deadline);
  // The same address again, the same directory: the old client finds it.
  const auto t0 = Clock::now();
  d = StartKvstore({"--disk_dir=" + dir}, address);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(PollUntil(
      [&] {
        auto r = c->GetPrefix({KvKey(1)});
        return r.ok() && r->blocks.size() == 1;
      },
      std::chrono::seconds(10)));
  // About a second (the channel's retry after a broken connection); the
  // bound leaves room for a loaded machine.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(8));
}

}  // namespace
}  // namespace ringlane::testing
