// The router over two worker groups: a worker that dies fails only its own
// group's requests (UNAVAILABLE), the other group keeps serving, and the
// router takes the group back when its worker returns on the same address.
// Also: text that is not UTF-8 is INVALID_ARGUMENT.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "tests/support/daemon.h"
#include "tests/support/lane_runner.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::Daemon;
using ::testing::HasSubstr;
using testing::SourcePath;

std::vector<std::string> WorkerArgs(const std::string& group, const std::string& listen) {
  return {"--model=" + SourcePath("deploy/models/stories260K/stories260K.bin"), "--threads=1",
          "--group=" + group, "--listen=" + listen};
}

int ReadyGroups(v1::Generate::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  if (!stub.ListModels(&ctx, {}, &resp).ok() || resp.models_size() != 1) return -1;
  return resp.models(0).num_ready_groups();
}

bool WaitReadyGroups(v1::Generate::Stub& stub, int n) {
  for (int i = 0; i < 300; ++i) {
    if (ReadyGroups(stub) == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Greedy ids of the golden case `i`, `max_tokens` long, with a session id
// (which pins the request to the group the router first chose for it).
v1::GenerateRequest Golden(int i, int max_tokens, const std::string& session) {
  v1::GenerateRequest r;
  const std::vector<int32_t>& prompt = testing::GoldenCases()[i].prompt;
  r.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  r.set_session_id(session);
  return r;
}

std::vector<int32_t> GoldenIds(int i, int n) {
  std::vector<int32_t> ids = testing::GoldenCases()[i].ids;
  ids.resize(n);
  return ids;
}

struct Out {
  grpc::Status status;
  std::vector<int32_t> ids;
};

Out Call(v1::Generate::Stub& stub, const v1::GenerateRequest& r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub.Generate(&ctx, r);
  v1::GenerateResponse m;
  Out o;
  while (reader->Read(&m)) o.ids.insert(o.ids.end(), m.token_ids().begin(), m.token_ids().end());
  o.status = reader->Finish();
  return o;
}

TEST(RouterGroupsTest, ADeadWorkerFailsOnlyItsGroupAndComesBack) {
  auto a = Daemon::Start(RINGLANE_WORKER_BIN, WorkerArgs("a", "127.0.0.1:0"));
  auto b = Daemon::Start(RINGLANE_WORKER_BIN, WorkerArgs("b", "127.0.0.1:0"));
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string b_addr = (*b)->address();
  auto router = Daemon::Start(
      RINGLANE_ROUTER_BIN,
      {"--workers=" + (*a)->address() + ";" + b_addr,
       "--tokenizer=" + SourcePath("deploy/models/stories260K/tok512.bin"), "--listen=127.0.0.1:0",
       "--http_listen=127.0.0.1:0", "--connect_timeout_ms=1000"},
      {"router"});
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel((*router)->address("router"), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(WaitReadyGroups(*stub, 2)) << (*router)->Stderr();

  // A reference run, then four identical long generations at once: placement
  // spreads them over both groups by load. Killing b's worker fails the ones
  // on b with UNAVAILABLE; the ones on a finish with the reference ids.
  v1::GenerateRequest req = Golden(3, 400, "");
  Out ref = Call(*stub, req);
  ASSERT_TRUE(ref.status.ok()) << ref.status.error_message();
  ASSERT_EQ(ref.ids.size(), 400u);
  EXPECT_EQ(std::vector<int32_t>(ref.ids.begin(), ref.ids.begin() + 200), GoldenIds(3, 200));
  std::vector<Out> outs(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { outs[i] = Call(*stub, req); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  (*b)->Signal(SIGKILL);
  for (auto& t : threads) t.join();
  int failed = 0, done = 0;
  for (const Out& o : outs) {
    if (o.status.ok()) {
      ++done;
      EXPECT_EQ(o.ids, ref.ids);
    } else {
      ++failed;
      EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE) << o.status.error_message();
    }
  }
  EXPECT_GE(failed, 1) << "nothing ran on the killed group";
  EXPECT_GE(done, 1) << "nothing ran on the healthy group";

  // The router goes on serving with group a.
  ASSERT_TRUE(WaitReadyGroups(*stub, 1));
  Out again = Call(*stub, Golden(0, 30, "s3"));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.ids, GoldenIds(0, 30));

  // Group b's worker returns on its address: the router takes it back.
  auto b2 = Daemon::Start(RINGLANE_WORKER_BIN, WorkerArgs("b", b_addr));
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_TRUE(WaitReadyGroups(*stub, 2)) << (*router)->Stderr();
}

TEST(RouterGroupsTest, TextThatIsNotUtf8IsInvalidArgument) {
  auto w = Daemon::Start(RINGLANE_WORKER_BIN, WorkerArgs("g", "127.0.0.1:0"));
  ASSERT_TRUE(w.ok());
  auto router = Daemon::Start(RINGLANE_ROUTER_BIN,
                              {"--workers=" + (*w)->address(),
                               "--tokenizer=" + SourcePath("deploy/models/stories260K/tok512.bin"),
                               "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0"},
                              {"router"});
  ASSERT_TRUE(router.ok());
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel((*router)->address("router"), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(WaitReadyGroups(*stub, 1));
  for (const std::string& bad : {std::string("Once upon \xff time"), std::string("caf\xc3"),
                                 std::string("\xed\xa0\x80 surrogate")}) {
    v1::GenerateRequest r;
    r.set_text(bad);
    r.set_max_tokens(4);
    Out o = Call(*stub, r);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << o.status.error_message();
    EXPECT_THAT(o.status.error_message(), HasSubstr("UTF-8"));
    v1::GenerateRequest s;
    s.set_text("Once upon a time");
    s.add_stop(bad);
    s.set_max_tokens(4);
    o = Call(*stub, s);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << o.status.error_message();
  }
  v1::GenerateRequest ok;
  ok.set_text("Once upon a time");
  ok.set_max_tokens(4);
  EXPECT_TRUE(Call(*stub, ok).status.ok());
}

}  // namespace
}  // namespace ringlane
