// The kvstore client against fake KvStore services in this process: how it
// chunks and checksums puts, that a block corrupted in transit ends the
// prefix (counted) and is never returned, and that a frozen or absent store
// fails a call within its deadline. The real daemon is exercised in
// tests/kvstore_daemon_test.cc.
#include "services/kvstore_client.h"

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

using Clock = std::chrono::steady_clock;

v1::BlockKey Key(int i) {
  v1::BlockKey k;
  k.set_model_id("m");
  k.set_prefix_hash(std::string(15, 'h') + static_cast<char>(i));
  k.set_tp_world_size(1);
  k.set_kv_dtype(v1::DTYPE_F32);
  k.set_block_size_tokens(16);
  return k;
}

uint64_t Sum(const std::string& s) { return XXH64(s.data(), s.size(), 0); }

// Records what Put received; Get answers every key with "block <i>" and a
// checksum that is wrong for key index `corrupt_at`; with `hang`, every call
// waits until the client gives up.
class FakeStore final : public v1::KvStore::Service {
 public:
  grpc::Status Put(grpc::ServerContext* ctx, grpc::ServerReader<v1::KvBlockChunk>* reader,
                   v1::PutResponse* resp) override {
    if (hang) return Hang(ctx);
    v1::KvBlockChunk c;
    while (reader->Read(&c)) {
      absl::MutexLock l(&mu);
      chunks.push_back(c);
    }
    resp->set_num_blocks(1);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetRequest* req,
                   grpc::ServerWriter<v1::KvBlockChunk>* writer) override {
    if (hang) return Hang(ctx);
    for (int i = 0; i < req->keys_size(); ++i) {
      const std::string payload = "block " + std::to_string(i) + std::string(3000, 'x');
      // Two chunks per block, the second flipped when this is the bad one.
      for (int part = 0; part < 2; ++part) {
        v1::KvBlockChunk c;
        *c.mutable_key() = req->keys(i);
        c.set_offset_bytes(part * 1500);
        c.set_total_bytes(static_cast<int64_t>(payload.size()));
        std::string data = payload.substr(part * 1500, part ? std::string::npos : 1500);
        if (i == corrupt_at && part == 1) data[10] ^= 1;
        c.set_data(data);
        c.set_payload_xxh64(Sum(payload));
        if (!writer->Write(c)) return grpc::Status::CANCELLED;
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest*,
                      v1::LookupResponse*) override {
    return hang ? Hang(ctx) : grpc::Status::OK;
  }
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                     v1::StatsResponse*) override {
    return hang ? Hang(ctx) : grpc::Status::OK;
  }

  grpc::Status Hang(grpc::ServerContext* ctx) {
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status::CANCELLED;
  }

  bool hang = false;
  int corrupt_at = -1;
  absl::Mutex mu;
  std::vector<v1::KvBlockChunk> chunks ABSL_GUARDED_BY(mu);
};

struct Server {
  explicit Server(FakeStore* s) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(s);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

std::unique_ptr<KvStoreClient> Client(const std::string& address, KvStoreClientOptions o = {}) {
  return std::make_unique<KvStoreClient>(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                KvStoreChannelArguments(o)),
      o);
}

TEST(KvStoreClientTest, PutChunksBlocksAndCarriesTheirChecksums) {
  FakeStore fake;
  Server server(&fake);
  auto c = Client(server.address(), {.max_chunk_bytes = 1000});
  const std::string a(2500, 'a');
  const std::string b(10, 'b');
  std::vector<KvBlockToPut> blocks = {{Key(0), a, std::nullopt}, {Key(1), b, 1234}};
  ASSERT_TRUE(c->Put(blocks).ok());
  absl::MutexLock l(&fake.mu);
  ASSERT_EQ(fake.chunks.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(fake.chunks[i].offset_bytes(), 1000 * i);
    EXPECT_EQ(fake.chunks[i].total_bytes(), 2500);
    EXPECT_EQ(fake.chunks[i].payload_xxh64(), Sum(a));
  }
  EXPECT_EQ(fake.chunks[2].data().size(), 500u);
  // The producer's checksum goes as given, so the store can catch bytes
  // that changed on the way.
  EXPECT_EQ(fake.chunks[3].payload_xxh64(), 1234u);
  EXPECT_EQ(c->Put({{KvBlockToPut{Key(2), "", std::nullopt}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreClientTest, ABlockCorruptedInTransitEndsThePrefixAndIsCounted) {
  FakeStore fake;
  fake.corrupt_at = 2;
  Server server(&fake);
  auto c = Client(server.address());
  std::vector<v1::BlockKey> keys = {Key(0), Key(1), Key(2), Key(3)};
  absl::StatusOr<KvGetResult> r = c->GetPrefix(keys);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->blocks.size(), 2u);
  EXPECT_EQ(r->blocks[1].payload.substr(0, 7), "block 1");
  EXPECT_EQ(r->stopped.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->checksum_failures(), 1);

  fake.corrupt_at = -1;
  r = c->GetPrefix(keys);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->blocks.size(), 4u);
  EXPECT_TRUE(r->stopped.ok());
}

TEST(KvStoreClientTest, AFrozenStoreFailsEveryCallWithinItsDeadline) {
  FakeStore fake;
  fake.hang = true;
  Server server(&fake);
  const auto deadline = std::chrono::milliseconds(200);
  auto c = Client(server.address(), {.deadline = deadline});
  std::vector<v1::BlockKey> keys = {Key(0)};
  const std::string payload(5000, 'p');
  std::vector<KvBlockToPut> blocks = {{Key(0), payload, std::nullopt}};
  auto timed = [&](auto&& call) {
    const auto t0 = Clock::now();
    const absl::StatusCode code = call();
    const auto took = Clock::now() - t0;
    EXPECT_LT(took, 3 * deadline);
    return code;
  };
  EXPECT_EQ(timed([&] { return c->GetPrefix(keys).status().code(); }),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(timed([&] { return c->Put(blocks).status().code(); }),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(timed([&] { return c->Lookup(keys).status().code(); }),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(timed([&] { return c->Stats().status().code(); }), absl::StatusCode::kDeadlineExceeded);
}

TEST(KvStoreClientTest, AnAbsentStoreFailsFastAndTheClientRecoversWhenItComes) {
  // A port nobody listens on (bound, then released).
  int port = 0;
  {
    FakeStore probe;
    Server s(&probe);
    port = s.port;
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const auto deadline = std::chrono::milliseconds(300);
  auto c = Client(address,
                  {.deadline = deadline, .max_reconnect_backoff = std::chrono::milliseconds(200)});
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    absl::StatusOr<v1::StatsResponse> r = c->Stats();
    EXPECT_FALSE(r.ok());
    EXPECT_LT(Clock::now() - t0, 3 * deadline);
  }
  // The store comes up on that port: the channel reconnects by itself.
  FakeStore fake;
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials());
  b.RegisterService(&fake);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  bool back = false;
  for (int i = 0; i < 50 && !back; ++i) {
    back = c->Stats().ok();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(back);
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace ringlane::services
