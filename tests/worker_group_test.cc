// Worker daemons beyond one healthy group: KV blocks exported from one
// worker and imported into another, a group that forms only once its late
// rank arrives, re-forms after a rank is killed, gives up on a hung one,
// and a drain on SIGTERM. Real ringlane-worker processes on loopback,
// driven the way the router and the kvstore drive them.
#include "router/client/worker_group.h"

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ringlane/v1/worker.grpc.pb.h"
#include "tests/support/cluster.h"
#include "tests/support/group_driver.h"
#include "tests/support/lane_runner.h"
#include "tests/support/worker_rpc.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::ConnectGroup;
using testing::DriveLanes;
using testing::GoldenLanes;
using testing::Greedy;
using ::testing::HasSubstr;
using testing::StartGroup;
using testing::WorkerGroup;

using Golden = testing::GoldenCase;
const std::vector<Golden>& Goldens() { return testing::GoldenCases(); }

TEST(WorkerDaemonTest, KvBlocksMoveBetweenWorkers) {
  WorkerGroup a = StartGroup(1, {"--kv_blocks=16", "--block_size=16"});
  WorkerGroup b = StartGroup(1, {"--kv_blocks=16", "--block_size=16"});
  auto ca = ConnectGroup(a);
  auto cb = ConnectGroup(b);
  ASSERT_TRUE(ca && cb);
  const Golden& gold = Goldens()[3];  // one-token prompt, 200 generated
  // On A: the prompt plus the first 40 golden ids, fed as a prompt.
  std::vector<int32_t> prompt = gold.prompt;
  prompt.insert(prompt.end(), gold.ids.begin(), gold.ids.begin() + 40);
  auto ra = ca->Run(testing::OneRowPlan(1, 0, prompt, {0, 1, 2}));
  ASSERT_TRUE(ra.ok() && ra->error().code() == 0);
  EXPECT_EQ(ra->outputs(0).tokens(0).token_id(), gold.ids[40]);

  // Export A's two full blocks (32 positions) in small chunks, import them
  // on B at other block ids, and let B go on from position 32.
  v1::ExportKvBlocksRequest ereq = testing::ExportRequest({0, 1});
  ereq.set_max_chunk_bytes(4096);
  auto sa = testing::WorkerStub(a.rank(0).address());
  auto sb = testing::WorkerStub(b.rank(0).address());
  std::vector<v1::KvBlockChunk> chunks;
  ASSERT_TRUE(testing::ExportKv(*sa, ereq, &chunks).ok());
  ASSERT_GT(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].key().prefix_hash(), std::string(16, 'a'));
  EXPECT_EQ(chunks[0].total_bytes(), ca->info().kv_block_bytes());
  auto import = [&](std::vector<v1::KvBlockChunk> cs, v1::ImportKvBlocksResponse* resp) {
    for (auto& c : cs) c.set_block_id(c.block_id() == 0 ? 9 : 4);
    return testing::ImportKv(*sb, cs, resp);
  };
  {
    // A block for another rank layout, then a corrupted payload: refused.
    auto wrong = chunks;
    wrong[0].mutable_key()->set_tp_world_size(2);
    v1::ImportKvBlocksResponse resp;
    EXPECT_EQ(import(wrong, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    auto corrupt = chunks;
    (*corrupt[1].mutable_data())[7] ^= 1;
    EXPECT_EQ(import(corrupt, &resp).error_code(), grpc::StatusCode::DATA_LOSS);
  }
  v1::ImportKvBlocksResponse resp;
  grpc::Status st = import(chunks, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.num_blocks(), 2);
  std::vector<int32_t> rest(prompt.begin() + 32, prompt.end());
  auto rb = cb->Run(testing::OneRowPlan(1, 32, rest, {9, 4, 5}));
  ASSERT_TRUE(rb.ok() && rb->error().code() == 0) << rb->error().message();
  EXPECT_EQ(rb->outputs(0).tokens(0).token_id(), gold.ids[40]);
  EXPECT_EQ(rb->outputs(0).tokens(0).logprob(), ra->outputs(0).tokens(0).logprob());
}

TEST(WorkerDaemonTest, APeerThatNeverArrivesIsReportedAndTheGroupFormsWhenItComes) {
  // Rank 0 of a TP2 group, alone.
  WorkerGroup g(2, {"--log_level=info", "--join_timeout_ms=500"});
  ASSERT_TRUE(g.StartRank(0));
  EXPECT_TRUE(
      g.rank(0).WaitForStderr("rank(s) 1 of 2 never arrived within", std::chrono::seconds(20)))
      << g.rank(0).Stderr();
  auto none = router::WorkerGroupClient::Connect({g.rank(0).address(), "127.0.0.1:1"},
                                                 std::chrono::milliseconds(500));
  EXPECT_FALSE(none.ok());
  auto solo =
      router::WorkerGroupClient::Connect({g.rank(0).address()}, std::chrono::milliseconds(500));
  EXPECT_FALSE(solo.ok());  // rank 0 of 2 is not a group of 1
  // Rounds are refused while the group is not formed.
  {
    auto stub = v1::Worker::NewStub(
        grpc::CreateChannel(g.rank(0).address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto s = stub->Rounds(&ctx);
    v1::RoundResult r;
    EXPECT_FALSE(s->Read(&r));
    grpc::Status st = s->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(st.error_message(), HasSubstr("never arrived"));
  }
  ASSERT_TRUE(g.StartRank(1));
  auto c = ConnectGroup(g);
  ASSERT_NE(c, nullptr);
  auto out = DriveLanes(*c, {GoldenLanes(0)[1]});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].tokens, Goldens()[1].ids);
}

// Generates one long lane a token per round until `fault` has been applied
// after `after` rounds; returns how long after the fault the client saw the
// error, and the error.
std::pair<std::chrono::milliseconds, absl::Status> RunUntilFault(
    router::WorkerGroupClient& c, int after, const std::function<void()>& fault) {
  const Golden& gold = Goldens()[3];
  const int bs = c.info().block_size_tokens();
  std::chrono::steady_clock::time_point t_fault;
  int64_t pos = 0;
  for (int round = 0; round < 400; ++round) {
    if (round == after) {
      fault();
      t_fault = std::chrono::steady_clock::now();
    }
    v1::RoundPlan p;
    p.set_round_id(round + 1);
    v1::LaneStep* r = p.add_rows();
    r->set_lane_id(1);
    r->set_start_position(pos % 400);
    if (round == 0 || pos % 400 == 0) {
      // (Re)start the lane from its prompt when it would run out of context.
      r->set_start_position(0);
      r->mutable_token_ids()->Add(gold.prompt.begin(), gold.prompt.end());
      if (round == 0) *r->mutable_sampling() = Greedy();
      pos = 0;
    } else {
      r->set_use_last_sampled(true);
    }
    r->set_sample_last(true);
    const int64_t end = pos + (r->use_last_sampled() ? 1 : r->token_ids_size());
    for (int b = 0; b < (end + bs - 1) / bs; ++b) r->add_block_ids(b);
    pos = end;
    auto res = c.Run(p);
    if (!res.ok()) {
      return {std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t_fault),
              res.status()};
    }
  }
  return {std::chrono::milliseconds(0), absl::OkStatus()};
}

TEST(WorkerDaemonTest, AKilledRankFailsTheRoundAndTheGroupReformsWhenItReturns) {
  WorkerGroup g = StartGroup(2, {"--kv_blocks=64", "--collective_timeout_ms=5000"});
  ASSERT_EQ(g.started(), 2);
  auto c = ConnectGroup(g);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->info().group_epoch(), 1);
  auto [after, err] = RunUntilFault(*c, 30, [&] { g.rank(1).Signal(SIGKILL); });
  ASSERT_FALSE(err.ok()) << "the group went on without rank 1";
  EXPECT_LT(after, std::chrono::seconds(10)) << err;
  EXPECT_TRUE(absl::IsUnavailable(err)) << err;
  // The survivor is alive and says why the group is down.
  EXPECT_TRUE(g.rank(0).WaitForStderr("broke", std::chrono::seconds(10))) << g.rank(0).Stderr();
  EXPECT_FALSE(g.rank(0).Wait(std::chrono::milliseconds(0)).has_value());
  c.reset();

  // Rank 1 comes back: the whole group forms again, epoch 2, empty KV.
  ASSERT_TRUE(g.StartRank(1));
  auto c2 = ConnectGroup(g);
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(c2->info().group_epoch(), 2);
  EXPECT_TRUE(
      g.rank(0).WaitForStderr("KV contents of earlier epochs are gone", std::chrono::seconds(5)));
  auto out = DriveLanes(*c2, {GoldenLanes(0)[0]});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].tokens, Goldens()[0].ids);
}

TEST(WorkerDaemonTest, AHungRankFailsTheRoundAfterTheCollectiveTimeout) {
  WorkerGroup g = StartGroup(2, {"--kv_blocks=64", "--collective_timeout_ms=1500"});
  ASSERT_EQ(g.started(), 2);
  auto c = ConnectGroup(g);
  ASSERT_NE(c, nullptr);
  auto [after, err] = RunUntilFault(*c, 20, [&] { g.rank(1).Signal(SIGSTOP); });
  ASSERT_FALSE(err.ok());
  EXPECT_LT(after, std::chrono::seconds(10)) << err;
  EXPECT_FALSE(g.rank(0).Wait(std::chrono::milliseconds(0)).has_value());
  g.rank(1).Signal(SIGKILL);
}

TEST(WorkerDaemonTest, SigtermDrainsAndExitsZero) {
  WorkerGroup g = StartGroup(1, {"--kv_blocks=16", "--drain_timeout_ms=3000", "--metrics_port=0"});
  ASSERT_EQ(g.started(), 1);
  auto c = ConnectGroup(g);
  ASSERT_NE(c, nullptr);
  auto out = DriveLanes(*c, {GoldenLanes(0)[2]});
  ASSERT_TRUE(out.ok());
  g.rank(0).Signal(SIGTERM);
  std::optional<int> code = g.rank(0).Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "did not exit";
  EXPECT_EQ(*code, 0) << g.rank(0).Stderr();
  EXPECT_THAT(g.rank(0).Stderr(), HasSubstr("draining"));
}

}  // namespace
}  // namespace ringlane
