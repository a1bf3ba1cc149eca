// The RDMA transport's protocol without a device: the KvStore service in
// this process with a region of plain memory (AttachRdmaRegionForTesting)
// and the client over a fake link that copies to and from that memory as
// RDMA WRITE and READ would. Covers PutRdma and GetRdma (slices, checksums,
// a full region continued over gRPC), the client's fallbacks (a failed
// transfer, a region the store dropped) and a corrupted transfer read as a
// miss. The verbs under the link (services/rdma.cc) need a device and are
// not run here; AttachRdma's refusals are in tests/kvstore_*_test.cc.
#include "kvstore/server/kvstore_service.h"

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/store.h"
#include "kvstore/test_util.h"
#include "services/kvstore_client.h"

namespace ringlane::kvstore {
namespace {

using services::KvBlockToPut;
using testing::TestKey;
using testing::TestPayload;

constexpr int64_t kBlockBytes = 100 << 10;

// What the fake link does to the next transfers.
struct LinkFaults {
  std::atomic<bool> fail_write{false};
  std::atomic<bool> fail_read{false};
  std::atomic<bool> corrupt_read{false};
  std::atomic<int> attaches{0};
};

// RDMA WRITE and READ as memcpy between the client's buffer and the
// store's region (same offsets).
class FakeLink final : public services::KvRdmaLink {
 public:
  FakeLink(uint8_t* region, size_t size, LinkFaults* faults)
      : region_(region), local_(size), faults_(faults) {}
  uint8_t* data() override { return local_.data(); }
  size_t size() const override { return local_.size(); }
  absl::Status Write(size_t offset, size_t length, std::chrono::steady_clock::time_point) override {
    if (faults_->fail_write) return absl::UnavailableError("work completion: retry exceeded");
    EXPECT_LE(offset + length, local_.size());
    std::memcpy(region_ + offset, local_.data() + offset, length);
    return absl::OkStatus();
  }
  absl::Status Read(size_t offset, size_t length, std::chrono::steady_clock::time_point) override {
    if (faults_->fail_read) return absl::DeadlineExceededError("RDMA READ not completed");
    EXPECT_LE(offset + length, local_.size());
    std::memcpy(local_.data() + offset, region_ + offset, length);
    if (faults_->corrupt_read && length > 0) local_[offset] ^= 1;
    return absl::OkStatus();
  }

 private:
  uint8_t* const region_;
  std::vector<uint8_t> local_;
  LinkFaults* const faults_;
};

class RdmaProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*max_rdma_clients=*/16); }

  void Start(int max_rdma_clients) {
    StoreOptions so;
    so.dram_bytes = 64 << 20;
    auto store = Store::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ServiceLimits limits;
    limits.max_rdma_clients = max_rdma_clients;
    service_ = std::make_unique<KvStoreService>(store_.get(), limits);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // A client whose RDMA attach makes a region of `region_bytes` in the
  // store and a fake link to it.
  std::unique_ptr<services::KvStoreClient> Client(int64_t region_bytes) {
    services::KvStoreClientOptions o;
    o.deadline = std::chrono::milliseconds(5000);
    o.max_chunk_bytes = 64 << 10;
    o.rdma_bytes = region_bytes;
    o.rdma_attach_for_testing = [this,
                                 region_bytes]() -> absl::StatusOr<services::KvRdmaAttachment> {
      ++faults_.attaches;
      uint8_t* region = nullptr;
      services::KvRdmaAttachment a;
      a.region = service_->AttachRdmaRegionForTesting(static_cast<size_t>(region_bytes), &region);
      a.link = std::make_unique<FakeLink>(region, static_cast<size_t>(region_bytes), &faults_);
      a.size_bytes = region_bytes;
      return a;
    };
    return std::make_unique<services::KvStoreClient>(channel_, o);
  }

  std::unique_ptr<services::KvStoreClient> GrpcClient() {
    services::KvStoreClientOptions o;
    o.deadline = std::chrono::milliseconds(5000);
    o.max_chunk_bytes = 64 << 10;
    return std::make_unique<services::KvStoreClient>(channel_, o);
  }

  static std::vector<std::string> Payloads(int n, int seed0) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back(TestPayload(seed0 + i, kBlockBytes));
    return v;
  }
  static std::vector<KvBlockToPut> Blocks(const std::vector<std::string>& p, int first) {
    std::vector<KvBlockToPut> v;
    for (size_t i = 0; i < p.size(); ++i) {
      v.push_back({TestKey(first + static_cast<int>(i)), p[i], std::nullopt});
    }
    return v;
  }
  static std::vector<v1::BlockKey> Chain(int first, int n) {
    std::vector<v1::BlockKey> v;
    for (int i = 0; i < n; ++i) v.push_back(TestKey(first + i));
    return v;
  }
  // Every block of `keys` read back by `c` equals `p`.
  static void ExpectBlocks(services::KvStoreClient& c, int first,
                           const std::vector<std::string>& p) {
    absl::StatusOr<services::KvGetResult> got =
        c.GetPrefix(Chain(first, static_cast<int>(p.size())));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->stopped.ok()) << got->stopped;
    ASSERT_EQ(got->blocks.size(), p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(got->blocks[i].payload, p[i]) << i;
      EXPECT_EQ(got->blocks[i].xxh64, XXH64(p[i].data(), p[i].size(), 0)) << i;
    }
  }

  LinkFaults faults_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RdmaProtocolTest, PayloadsGoThroughTheRegionBothWays) {
  auto c = Client(1 << 20);
  const std::vector<std::string> p = Payloads(4, 0);
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 4);
  EXPECT_EQ(put->total_bytes(), 4 * kBlockBytes);
  EXPECT_TRUE(c->rdma_attached());
  EXPECT_EQ(c->rdma_bytes_moved(), 4 * kBlockBytes);
  EXPECT_EQ(store_->Stats().blocks_stored(), 4);
  ExpectBlocks(*c, 0, p);
  EXPECT_EQ(c->rdma_bytes_moved(), 8 * kBlockBytes);
  // What went in by RDMA is an ordinary block to everyone else.
  ExpectBlocks(*GrpcClient(), 0, p);
  // A prefix that stops at a key the store lacks.
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(2, 5));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->stopped.ok());
  EXPECT_EQ(got->blocks.size(), 2u);
  EXPECT_EQ(faults_.attaches, 1);
  EXPECT_EQ(service_->rdma_regions(), 1);
}

TEST_F(RdmaProtocolTest, WhatDoesNotFitTheRegionGoesOverGrpcInTheSameCall) {
  // Room for two and a half blocks.
  auto c = Client(5 * kBlockBytes / 2);
  const std::vector<std::string> p = Payloads(5, 10);
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 5);
  EXPECT_EQ(put->total_bytes(), 5 * kBlockBytes);
  EXPECT_EQ(c->rdma_bytes_moved(), 2 * kBlockBytes);
  ExpectBlocks(*c, 0, p);
  EXPECT_EQ(c->rdma_bytes_moved(), 4 * kBlockBytes);
  EXPECT_TRUE(c->rdma_attached());
}

TEST_F(RdmaProtocolTest, AFailedTransferFallsBackForThatCallAndBacksOff) {
  auto c = Client(1 << 20);
  const std::vector<std::string> p = Payloads(3, 20);
  faults_.fail_write = true;
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 3);
  EXPECT_FALSE(c->rdma_attached());
  EXPECT_EQ(c->rdma_bytes_moved(), 0);
  faults_.fail_write = false;
  // Within the backoff the client does not attach again: gRPC it is.
  ExpectBlocks(*c, 0, p);
  EXPECT_EQ(faults_.attaches, 1);
  EXPECT_EQ(c->rdma_bytes_moved(), 0);

  // A READ that fails (here: times out) after the store wrote the region.
  auto d = Client(1 << 20);
  ASSERT_TRUE(d->Put(Blocks(p, 0)).ok());
  EXPECT_TRUE(d->rdma_attached());
  faults_.fail_read = true;
  ExpectBlocks(*d, 0, p);
  EXPECT_FALSE(d->rdma_attached());

  // After the backoff (1 s after a first failure) RDMA is attached again.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  faults_.fail_read = false;
  ASSERT_TRUE(c->Put(Blocks(p, 0)).ok());
  EXPECT_TRUE(c->rdma_attached());
  EXPECT_EQ(faults_.attaches, 3);
  EXPECT_EQ(c->rdma_bytes_moved(), 3 * kBlockBytes);
}

TEST_F(RdmaProtocolTest, ACorruptedReadIsAMissNeverServed) {
  auto c = Client(1 << 20);
  const std::vector<std::string> p = Payloads(3, 30);
  ASSERT_TRUE(c->Put(Blocks(p, 0)).ok());
  faults_.corrupt_read = true;  // flips the first byte read: block 0's
  absl::StatusOr<services::KvGetResult> got = c->GetPrefix(Chain(0, 3));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->blocks.empty());
  EXPECT_EQ(got->stopped.code(), absl::StatusCode::kDataLoss) << got->stopped;
  EXPECT_EQ(c->checksum_failures(), 1);
  faults_.corrupt_read = false;
  ExpectBlocks(*c, 0, p);
}

TEST_F(RdmaProtocolTest, BytesThatDoNotMatchTheirChecksumAreRefusedAsOnEveryPath) {
  auto c = Client(1 << 20);
  const std::string p = TestPayload(40, 1000);
  absl::StatusOr<v1::PutResponse> put = c->Put({{KvBlockToPut{TestKey(40), p, 42}}});
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss) << put.status();
  EXPECT_EQ(store_->Stats().checksum_failures_put(), 1);
  EXPECT_EQ(store_->Stats().blocks_stored(), 0);
}

TEST_F(RdmaProtocolTest, ARegionTheStoreDroppedFallsBackAndTheCallSucceeds) {
  server_->Shutdown();
  Start(/*max_rdma_clients=*/1);
  auto c = Client(1 << 20);
  const std::vector<std::string> p = Payloads(2, 50);
  ASSERT_TRUE(c->Put(Blocks(p, 0)).ok());
  EXPECT_TRUE(c->rdma_attached());
  // Another client takes the one region the store keeps: c's PutRdma is
  // FAILED_PRECONDITION, and the call goes on over gRPC.
  auto other = Client(1 << 20);
  ASSERT_TRUE(other->Put(Blocks(p, 10)).ok());
  EXPECT_EQ(service_->rdma_regions(), 1);
  absl::StatusOr<v1::PutResponse> put = c->Put(Blocks(p, 20));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->num_blocks(), 2);
  EXPECT_FALSE(c->rdma_attached());
  ExpectBlocks(*GrpcClient(), 20, p);
}

}  // namespace
}  // namespace ringlane::kvstore
