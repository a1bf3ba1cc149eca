#include "worker/rendezvous/rendezvous.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <thread>
#include <vector>

#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override { server_->Shutdown(); }

  RendezvousService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

TEST_F(RendezvousTest, SetThenGetWithinAGroup) {
  auto a = CreateGrpcStore(address_, "g1", std::chrono::seconds(5));
  auto b = CreateGrpcStore(address_, "g2", std::chrono::seconds(5));
  a->set("rank0", {'h', 'i'});
  EXPECT_EQ(a->get("rank0"), (std::vector<char>{'h', 'i'}));
  // Another group does not see it.
  EXPECT_THROW(b->wait({"rank0"}, std::chrono::milliseconds(100)), gloo::IoException);
}

TEST_F(RendezvousTest, MissingPeerTimesOutWithAClearMessage) {
  auto s = CreateGrpcStore(address_, "g", std::chrono::seconds(5));
  try {
    s->wait({"rank1"}, std::chrono::milliseconds(300));
    FAIL() << "no timeout";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("never arrived"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(address_));
  }
}

TEST_F(RendezvousTest, GetWaitsForALaterSet) {
  auto s = CreateGrpcStore(address_, "g", std::chrono::seconds(5));
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CreateGrpcStore(address_, "g", std::chrono::seconds(5))->set("k", {'1'});
  });
  EXPECT_EQ(s->get("k"), std::vector<char>{'1'});
  later.join();
}

TEST(Rendezvous, UnreachableServerFails) {
  auto s = CreateGrpcStore("127.0.0.1:1", "g", std::chrono::milliseconds(300));
  EXPECT_THROW(s->set("k", {'1'}), gloo::IoException);
}

}  // namespace
}  // namespace ringlane::worker
