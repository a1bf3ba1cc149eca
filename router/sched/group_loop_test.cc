// The group loop over a fake worker group (fake_worker_group.h): what a
// request's client sees on its ResponseQueue, what cancellation gives back,
// and what a broken worker group does to the requests on it and to its
// readiness.
#include "router/sched/group_loop.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/request_state.h"
#include "router/request/stop_matcher.h"
#include "router/router_metrics.h"
#include "router/sched/fake_worker_group.h"
#include "router/tokenizer/incremental_decoder.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {
namespace {

namespace v1 = ringlane::v1;
using ::testing::HasSubstr;

// The loop owns its client; the test keeps the fake to watch it and to
// inject faults after the loop dropped its client.
class SharedGroup final : public WorkerGroup {
 public:
  explicit SharedGroup(std::shared_ptr<FakeWorkerGroup> g) : g_(std::move(g)) {}
  const v1::WorkerInfo& info() const override { return g_->info(); }
  absl::Status Send(const v1::RoundPlan& plan) override { return g_->Send(plan); }
  absl::StatusOr<v1::RoundResult> Receive() override { return g_->Receive(); }
  absl::Status Check(std::chrono::milliseconds timeout) override { return g_->Check(timeout); }
  absl::Status Close() override { return g_->Close(); }
  int RestoreKvBlocks(const v1::RestoreKvBlocksRequest& req,
                      std::chrono::milliseconds deadline) override {
    return g_->RestoreKvBlocks(req, deadline);
  }

 private:
  const std::shared_ptr<FakeWorkerGroup> g_;
};

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

std::vector<int32_t> Prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + (salt * 11 + i * 3) % (kFakeVocab - 3));
  return p;
}

// What a client read from one request's queue.
struct Received {
  std::vector<int32_t> tokens;
  std::vector<v1::GenerateResponse> msgs;
  absl::Status status;
  bool done = false;
};

Received Drain(ResponseQueue& q, absl::Duration timeout = absl::Seconds(20)) {
  Received r;
  const absl::Time deadline = absl::Now() + timeout;
  while (!r.done && absl::Now() < deadline) {
    std::vector<v1::GenerateResponse> msgs;
    r.done = q.Take(absl::Milliseconds(100), &msgs, &r.status);
    for (v1::GenerateResponse& m : msgs) {
      r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
      r.msgs.push_back(std::move(m));
    }
  }
  return r;
}

class GroupLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok =
        LoadTokenizer(absl::StrCat(RINGLANE_SOURCE_DIR, "/deploy/models/stories260K/tok512.bin"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }

  // Starts a loop whose first connection gets `fake`; later ones (after a
  // failure) find the group unreachable, so it stays down.
  void Start(std::shared_ptr<FakeWorkerGroup> fake) {
    GroupLoopOptions o;
    o.addresses = {"fake:0"};
    o.planner = {.round_token_budget = 32, .min_prefill_chunk = 4};
    o.reconnect_pause = std::chrono::milliseconds(20);
    GroupLoopHooks h;
    h.connect = [this, fake](
                    const std::vector<std::string>&,
                    std::chrono::milliseconds) -> absl::StatusOr<std::unique_ptr<WorkerGroup>> {
      if (connects_++ > 0) return absl::UnavailableError("rank 0 (fake:0) is unreachable");
      return std::make_unique<SharedGroup>(fake);
    };
    h.on_connected = [this](const v1::WorkerInfo& info) -> absl::StatusOr<GroupMetrics> {
      return metrics_.ForGroup(info.model_id(), 0);
    };
    loop_ = std::make_unique<GroupLoop>(std::move(o), std::move(h), tokenizer_.get());
    loop_->Start();
    ASSERT_TRUE(WaitFor([&] { return loop_->State().ready; })) << loop_->Describe();
  }

  // A request as the router's Submit builds it: greedy, no stop strings, no
  // EOS (the fake never samples ids below 3 anyway).
  std::shared_ptr<RequestState> Request(std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_shared<RequestState>();
    r->queue = std::make_shared<ResponseQueue>();
    r->p.request_id = absl::StrCat("req-", ++requests_);
    r->p.prompt = std::move(prompt);
    r->p.max_tokens = max_tokens;
    r->p.sampling.set_temperature(0);
    r->p.sampling.set_seed(1);
    r->p.loop_watchdog = false;
    r->stop_tokens = *StopTokens::Create({}, {}, /*ignore_eos=*/true, tokenizer_->vocab_size());
    r->choices.resize(1);
    r->choices_left = 1;
    r->choices[0].decoder = std::make_unique<IncrementalDecoder>(*tokenizer_);
    r->choices[0].matcher = *StopMatcher::Create({});
    return r;
  }

  RouterMetrics metrics_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::atomic<int> connects_{0};
  int requests_ = 0;
  // Last: stopped before what it uses goes.
  std::unique_ptr<GroupLoop> loop_;
};

TEST_F(GroupLoopTest, ResponsesReachTheRequestsQueues) {
  auto fake = std::make_shared<FakeWorkerGroup>(64, 4);
  Start(fake);
  auto a = Request(Prompt(9, 1), 6);
  auto b = Request(Prompt(17, 2), 11);
  ASSERT_TRUE(loop_->Enqueue(a).ok());
  ASSERT_TRUE(loop_->Enqueue(b).ok());
  for (const auto& req : {a, b}) {
    Received r = Drain(*req->queue);
    ASSERT_TRUE(r.done) << req->p.request_id << " did not finish";
    EXPECT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, FakeReference(req->p.prompt, req->p.max_tokens)) << req->p.request_id;
    ASSERT_FALSE(r.msgs.empty());
    EXPECT_EQ(r.msgs.back().finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.msgs.back().usage().completion_tokens(), req->p.max_tokens);
  }
  // Both lanes were released on the workers and in the ledger.
  EXPECT_TRUE(WaitFor([&] { return fake->live_lanes() == 0 && loop_->State().lanes == 0; }));
  EXPECT_EQ(loop_->State().kv.in_use_blocks, 0);
  EXPECT_THAT(fake->errors(), ::testing::IsEmpty());
}

TEST_F(GroupLoopTest, CancellationReleasesTheLane) {
  auto fake = std::make_shared<FakeWorkerGroup>(1024, 4);
  // Slow rounds: the request is still running when the client goes away.
  fake->set_round_delay(std::chrono::milliseconds(2));
  Start(fake);
  // 4000 rounds of 2 ms: seconds longer than the test needs.
  auto req = Request(Prompt(8, 3), 4000);
  ASSERT_TRUE(loop_->Enqueue(req).ok());
  std::vector<v1::GenerateResponse> msgs;
  absl::Status st;
  ASSERT_TRUE(WaitFor([&] {
    req->queue->Take(absl::Milliseconds(10), &msgs, &st);
    return !msgs.empty();
  }));
  ASSERT_EQ(loop_->State().lanes, 1);
  EXPECT_GT(loop_->State().kv.in_use_blocks, 0);
  req->queue->Cancel();
  // The lane, its blocks and the workers' state for it all go.
  EXPECT_TRUE(WaitFor([&] {
    const GroupState s = loop_->State();
    return s.lanes == 0 && s.kv.in_use_blocks == 0 && fake->live_lanes() == 0;
  }));
  EXPECT_EQ(fake->released_lanes(), 1);
  // The group goes on serving.
  fake->set_round_delay(std::chrono::microseconds(0));
  auto next = Request(Prompt(5, 4), 4);
  ASSERT_TRUE(loop_->Enqueue(next).ok());
  Received r = Drain(*next->queue);
  EXPECT_TRUE(r.done && r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, FakeReference(next->p.prompt, 4));
  EXPECT_THAT(fake->errors(), ::testing::IsEmpty());
}

// The kvstore tier over the fake's store: a prompt evicted from a 12-block
// pool by two others is restored before it is admitted, reported as cached,
// and decodes exactly as a solo run; with the store down it is recomputed,
// with the same tokens.
class GroupLoopKvstoreTest : public GroupLoopTest, public ::testing::WithParamInterface<bool> {};

TEST_P(GroupLoopKvstoreTest, AnEvictedPromptComesBackOrIsRecomputed) {
  const bool store_down = GetParam();
  auto fake = std::make_shared<FakeWorkerGroup>(12, 4);
  fake->EnableKvstore();
  Start(fake);
  auto run = [&](int salt) {
    auto req = Request(Prompt(21, salt), 4);  // 25 positions: 7 of the 12 blocks
    EXPECT_TRUE(loop_->Enqueue(req).ok());
    Received r = Drain(*req->queue);
    EXPECT_TRUE(r.done && r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, FakeReference(req->p.prompt, 4)) << "salt " << salt;
    return req;
  };
  run(1);
  EXPECT_TRUE(WaitFor([&] { return fake->offloads_seen() >= 5; }))
      << "the prompt's full blocks were not offloaded: " << fake->offloads_seen();
  run(2);
  run(3);
  fake->set_store_down(store_down);
  const int64_t calls = fake->restore_calls();
  auto again = run(1);
  EXPECT_GT(fake->restore_calls(), calls);
  if (store_down) {
    EXPECT_EQ(fake->restored_blocks(), 0);
  } else {
    EXPECT_GT(fake->restored_blocks(), 0);
    // All 5 blocks a 21-token prompt can reuse (its last token is fed).
    EXPECT_EQ(again->cached_tokens, 20);
    // A store that lost them gets them again: the miss makes the router
    // offer the recomputed blocks anew instead of taking them for stored.
    fake->ClearStore();
    run(2);
    run(3);
    const int64_t restored = fake->restored_blocks();
    run(1);  // a miss, recomputed and offloaded again
    EXPECT_EQ(fake->restored_blocks(), restored);
    run(2);
    run(3);
    auto third = run(1);
    EXPECT_GT(fake->restored_blocks(), restored);
    EXPECT_EQ(third->cached_tokens, 20);
  }
  EXPECT_TRUE(WaitFor([&] { return loop_->State().lanes == 0; }));
  EXPECT_EQ(loop_->State().kv.in_use_blocks, 0) << "a placeholder kept its blocks";
  EXPECT_THAT(fake->errors(), ::testing::IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Store, GroupLoopKvstoreTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Down" : "Up";
                         });

// Which call of the client breaks.
enum class Fault { kSend, kReceive };

class GroupLoopFaultTest : public GroupLoopTest, public ::testing::WithParamInterface<Fault> {};

TEST_P(GroupLoopFaultTest, AWorkerFailureFailsItsRequestsAndDropsReadiness) {
  auto fake = std::make_shared<FakeWorkerGroup>(64, 4);
  const absl::Status broke = absl::UnavailableError("rank 1 (fake:1): the Rounds stream ended");
  if (GetParam() == Fault::kSend) {
    fake->FailSendAfter(5, broke);
  } else {
    fake->FailReceiveAfter(5, broke);
  }
  // Slow rounds, so that both requests are queued long before the fifth.
  fake->set_round_delay(std::chrono::milliseconds(20));
  Start(fake);
  auto a = Request(Prompt(6, 5), 40);
  auto b = Request(Prompt(10, 6), 40);
  ASSERT_TRUE(loop_->Enqueue(a).ok());
  ASSERT_TRUE(loop_->Enqueue(b).ok());
  for (const auto& req : {a, b}) {
    Received r = Drain(*req->queue);
    ASSERT_TRUE(r.done) << req->p.request_id << " did not end";
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("worker group 0 failed"));
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("the Rounds stream ended"));
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("retry"));
    EXPECT_LT(static_cast<int>(r.tokens.size()), 40);
  }
  EXPECT_TRUE(WaitFor([&] { return !loop_->State().ready; }));
  const GroupState s = loop_->State();
  EXPECT_EQ(s.lanes, 0);
  EXPECT_EQ(s.waiting, 0);
  // Placement stops choosing the group, and new requests are refused.
  EXPECT_FALSE(loop_->ProbePrefix({}).ready);
  absl::Status st = loop_->Enqueue(Request(Prompt(4, 7), 3));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("is not ready"));
  // It tries to reconnect and says why it cannot.
  EXPECT_TRUE(WaitFor([&] { return connects_.load() >= 2; }));
  EXPECT_TRUE(WaitFor([&] { return loop_->Describe().find("unreachable") != std::string::npos; }))
      << loop_->Describe();
}

INSTANTIATE_TEST_SUITE_P(Faults, GroupLoopFaultTest,
                         ::testing::Values(Fault::kSend, Fault::kReceive),
                         [](const ::testing::TestParamInfo<Fault>& info) {
                           return info.param == Fault::kSend ? "Send" : "Receive";
                         });

}  // namespace
}  // namespace ringlane::router
