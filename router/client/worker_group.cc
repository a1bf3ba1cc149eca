#include "router/client/worker_group.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "services/grpc_security.h"
#include "services/log.h"
#include "services/status_grpc.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

// Fields every rank of one group must agree on.
std::string Geometry(const v1::WorkerInfo& i) {
  return absl::StrCat("model ", i.model_id(), "@", i.model_revision(), ", group ", i.group(),
                      " epoch ", i.group_epoch(), ", world ", i.tp_world_size(), ", KV ",
                      i.kv_pool_blocks(), "x", i.block_size_tokens(), " dtype ", i.kv_dtype(),
                      i.moe_sharding().empty() ? "" : ", experts " + i.moe_sharding(),
                      i.state_slots() == 0 ? ""
                                           : absl::StrCat(", state slots ", i.state_slots(),
                                                          ", checkpoints ", i.state_checkpoints(),
                                                          " every ", i.state_checkpoint_interval(),
                                                          ", KDA chunk ", i.linear_chunk()));
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const WorkerGroupOptions& options) {
  grpc::ChannelArguments args;
  // A frozen or partitioned worker keeps its TCP connection open (the kernel
  // still acknowledges), so only an unanswered HTTP/2 ping reveals it between
  // rounds. Ping about twice per round deadline, bounded so that a long
  // deadline still notices within seconds and a short one does not flood;
  // the workers permit pings this often (worker/main.cc).
  const int ping_ms =
      static_cast<int>(std::clamp<int64_t>(options.round_deadline.count() / 2, 1000, 10000));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ping_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ping_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(address, services::PeerChannelCredentials(), args);
}

absl::StatusOr<std::unique_ptr<WorkerGroupClient>> WorkerGroupClient::Connect(
    const std::vector<std::string>& addresses, std::chrono::milliseconds timeout,
    const WorkerGroupOptions& options) {
  if (addresses.empty()) return absl::InvalidArgumentError("no worker addresses");
  std::unique_ptr<WorkerGroupClient> c(new WorkerGroupClient(options));
  const auto deadline = std::chrono::system_clock::now() + timeout;
  for (const std::string& a : addresses) {
    auto r = std::make_unique<Rank>();
    r->address = a;
    r->stub = v1::Worker::NewStub(MakeWorkerChannel(a, options));
    c->ranks_.push_back(std::move(r));
  }
  // Wait until every rank reports the same formed epoch.
  std::string why;
  for (;;) {
    std::vector<v1::WorkerInfo> infos(addresses.size());
    bool all = true;
    for (size_t i = 0; i < addresses.size() && all; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      ctx.set_wait_for_ready(true);
      grpc::Status st = c->ranks_[i]->stub->GetInfo(&ctx, v1::GetInfoRequest(), &infos[i]);
      if (!st.ok()) {
        return absl::UnavailableError(
            absl::StrCat("worker ", addresses[i], ": ", st.error_message()));
      }
      if (infos[i].tp_world_size() != static_cast<int>(addresses.size()) ||
          infos[i].tp_rank() != static_cast<int>(i)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", addresses[i], " is rank ", infos[i].tp_rank(), " of ",
            infos[i].tp_world_size(), ", expected rank ", i, " of ", addresses.size()));
      }
      if (!infos[i].group_ready()) {
        all = false;
        why = absl::StrCat("worker ", addresses[i], ": ", infos[i].group_status());
      } else if (Geometry(infos[i]) != Geometry(infos[0])) {
        all = false;  // the ranks may be between epochs
        why = absl::StrCat("ranks disagree: ", Geometry(infos[0]), " vs ", Geometry(infos[i]));
      }
    }
    if (all) {
      c->info_ = infos[0];
      c->info_.set_kv_block_copies(std::all_of(infos.begin(), infos.end(),
                                               [](const auto& i) { return i.kv_block_copies(); }));
      break;
    }
    if (std::chrono::system_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("worker group not ready: ", why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& r : c->ranks_) {
    r->ctx = std::make_unique<grpc::ClientContext>();
    r->stream = r->stub->Rounds(r->ctx.get());
  }
  c->last_result_ = std::chrono::steady_clock::now();
  for (auto& r : c->ranks_) {
    Rank* rank = r.get();
    WorkerGroupClient* client = c.get();
    r->reader = std::thread([client, rank] { client->ReadLoop(rank); });
  }
  return c;
}

WorkerGroupClient::~WorkerGroupClient() {
  CancelAll();
  for (auto& r : ranks_) {
    if (r->reader.joinable()) r->reader.join();
    // Every read has returned, so Finish only collects the status.
    if (r->stream && !r->finished) r->stream->Finish().ok();
  }
}

void WorkerGroupClient::ReadLoop(Rank* rank) {
  for (;;) {
    v1::RoundResult res;
    const bool ok = rank->stream->Read(&res);
    absl::MutexLock l(&mu_);
    if (!ok) {
      rank->ended = true;
      return;
    }
    rank->results.push_back(std::move(res));
  }
}

void WorkerGroupClient::CancelAll() {
  for (auto& r : ranks_) {
    if (r->ctx) r->ctx->TryCancel();
  }
}

std::string WorkerGroupClient::Name(int r) const {
  return absl::StrCat("worker group '", info_.group(), "' rank ", r, " (", ranks_[r]->address, ")");
}

absl::Status WorkerGroupClient::Break(absl::Status status) {
  if (!broken_) {
    broken_ = true;
    broken_status_ = std::move(status);
  }
  CancelAll();
  return broken_status_;
}

absl::Status WorkerGroupClient::FailEnded(int r, const std::string& what) {
  Rank& k = *ranks_[r];
  {
    // Finish must not run beside a Read: wait for the reader to see the end.
    // A failed Write means the call is over, so its Read returns too; cancel
    // should it not within a second.
    absl::MutexLock l(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&k.ended), absl::Seconds(1))) {
      k.ctx->TryCancel();
      mu_.Await(absl::Condition(&k.ended));
    }
  }
  if (k.reader.joinable()) k.reader.join();
  grpc::Status st = k.stream->Finish();
  k.finished = true;
  return Break(absl::UnavailableError(absl::StrCat(
      Name(r), " ", what, ": ", st.ok() ? std::string("stream closed") : st.error_message())));
}

absl::Status WorkerGroupClient::FailAllEnded() {
  // When a rank dies, its peers' streams end too, soon after (their round
  // failed in a collective), and whichever the router sees first is luck.
  // A moment's wait lets the message name every rank that ended, the dead
  // one among them.
  std::vector<int> ended;
  {
    absl::MutexLock l(&mu_);
    auto all_ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& r : ranks_) {
        if (!r->ended) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&all_ended), absl::Milliseconds(200));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r]->ended) ended.push_back(static_cast<int>(r));
    }
  }
  std::vector<std::string> why;
  for (int r : ended) {
    Rank& k = *ranks_[r];
    if (k.reader.joinable()) k.reader.join();
    grpc::Status st = k.stream->Finish();
    k.finished = true;
    why.push_back(absl::StrCat("rank ", r, " (", k.address, ") ended its stream: ",
                               st.ok() ? std::string("stream closed") : st.error_message()));
  }
  return Break(absl::UnavailableError(
      absl::StrCat("worker group '", info_.group(), "' ", absl::StrJoin(why, "; "))));
}

absl::Status WorkerGroupClient::Send(const v1::RoundPlan& plan) {
  if (broken_) return broken_status_;
  // A Write to a frozen rank cannot block this thread past the deadline:
  // at most pipeline_depth plans go out before Receive() waits, and a few
  // plans fit in HTTP/2's stream window many times over.
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r]->stream->Write(plan)) {
      return FailEnded(static_cast<int>(r), "took no plan");
    }
  }
  due_.push_back({std::chrono::steady_clock::now(), plan.round_id()});
  return absl::OkStatus();
}

absl::StatusOr<v1::RoundResult> WorkerGroupClient::Receive() {
  if (broken_) return broken_status_;
  if (due_.empty()) return absl::FailedPreconditionError("Receive() without a round in flight");
  const auto deadline = std::max(due_.front().sent, last_result_) + options_.round_deadline;
  int ended = -1;
  std::vector<int> silent;
  std::vector<v1::RoundResult> got(ranks_.size());
  {
    absl::MutexLock l(&mu_);
    // Ready once every rank has this round's result, or one rank's stream
    // ended with nothing left to read: then the round can never complete.
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      bool all = true;
      for (const auto& r : ranks_) {
        if (!r->results.empty()) continue;
        if (r->ended) return true;
        all = false;
      }
      return all;
    };
    const auto left = deadline - std::chrono::steady_clock::now();
    mu_.AwaitWithTimeout(absl::Condition(&ready),
                         absl::FromChrono(std::max(left, decltype(left)::zero())));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r]->results.empty()) continue;
      if (ranks_[r]->ended && ended < 0) ended = static_cast<int>(r);
      if (!ranks_[r]->ended) silent.push_back(static_cast<int>(r));
    }
    if (ended < 0 && silent.empty()) {
      for (size_t r = 0; r < ranks_.size(); ++r) {
        got[r] = std::move(ranks_[r]->results.front());
        ranks_[r]->results.pop_front();
      }
    }
  }
  if (ended >= 0) return FailAllEnded();
  if (!silent.empty()) {
    // Every rank waiting in a collective for the one that stopped is silent
    // too; a short question tells the operator which rank to look at.
    const auto probe = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(300),
                                                           options_.round_deadline / 4);
    std::vector<std::string> gone;
    std::vector<std::string> waiting;
    for (int r : silent) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + probe);
      v1::WorkerInfo i;
      const std::string who = absl::StrCat(r, " (", ranks_[r]->address, ")");
      if (ranks_[r]->stub->GetInfo(&ctx, v1::GetInfoRequest(), &i).ok()) {
        waiting.push_back(who);
      } else {
        gone.push_back(who);
      }
    }
    std::string detail;
    if (!gone.empty()) {
      absl::StrAppend(&detail, "; rank ", absl::StrJoin(gone, ", "),
                      " does not answer (frozen, dead or cut off)");
    }
    if (!waiting.empty()) {
      absl::StrAppend(&detail, "; rank ", absl::StrJoin(waiting, ", "),
                      " answers but sent no result (waiting for its peers, or overloaded)");
    }
    return Break(absl::UnavailableError(absl::StrCat(
        "worker group '", info_.group(), "' sent no result for round ", due_.front().round_id,
        " within the round deadline of ", options_.round_deadline.count(), " ms", detail,
        "; its streams were cancelled")));
  }
  due_.pop_front();
  last_result_ = std::chrono::steady_clock::now();
  v1::RoundResult first = std::move(got[0]);
  for (size_t r = 1; r < got.size(); ++r) {
    const v1::RoundResult& res = got[r];
    if (res.round_id() != first.round_id() || res.error().code() != first.error().code()) {
      return Break(absl::InternalError(
          absl::StrCat("worker group '", info_.group(), "': ranks disagree on round ",
                       first.round_id(), ": rank 0 says code ", first.error().code(), ", rank ", r,
                       " round ", res.round_id(), " code ", res.error().code())));
    }
    // The slowest rank decides how long the group spent in collectives.
    first.set_collective_time_us(std::max(first.collective_time_us(), res.collective_time_us()));
  }
  return first;
}

absl::StatusOr<v1::RoundResult> WorkerGroupClient::Run(const v1::RoundPlan& plan) {
  if (absl::Status st = Send(plan); !st.ok()) return st;
  return Receive();
}

absl::Status WorkerGroupClient::Check(std::chrono::milliseconds timeout) {
  if (broken_) return broken_status_;
  int ended = -1;
  {
    // A stream that ended while idle (a rank killed, or cut off by keepalive)
    // needs no question.
    absl::MutexLock l(&mu_);
    for (size_t r = 0; r < ranks_.size() && ended < 0; ++r) {
      if (ranks_[r]->ended) ended = static_cast<int>(r);
    }
  }
  if (ended >= 0) return FailEnded(ended, "ended its stream");
  timeout = std::min(timeout, options_.round_deadline);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    v1::WorkerInfo i;
    grpc::Status st = ranks_[r]->stub->GetInfo(&ctx, v1::GetInfoRequest(), &i);
    std::string why;
    if (!st.ok()) {
      why = st.error_message();
    } else if (!i.group_ready()) {
      why = absl::StrCat("not ready: ", i.group_status());
    } else if (i.group_epoch() != info_.group_epoch()) {
      why = absl::StrCat("re-formed (epoch ", info_.group_epoch(), " -> ", i.group_epoch(),
                         "): its KV contents are gone");
    }
    if (!why.empty()) {
      return Break(absl::UnavailableError(absl::StrCat(Name(static_cast<int>(r)), " ", why)));
    }
  }
  return absl::OkStatus();
}

int WorkerGroupClient::RestoreKvBlocks(const v1::RestoreKvBlocksRequest& req,
                                       std::chrono::milliseconds deadline) {
  if (req.blocks_size() == 0) return 0;
  std::vector<int> restored(ranks_.size(), 0);
  std::vector<std::thread> calls;
  calls.reserve(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    calls.emplace_back([&, r] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + deadline);
      v1::RestoreKvBlocksResponse resp;
      grpc::Status st = ranks_[r]->stub->RestoreKvBlocks(&ctx, req, &resp);
      restored[r] = st.ok() ? resp.num_restored() : 0;
      if (!st.ok() || resp.num_restored() < req.blocks_size()) {
        RL_LOG(DEBUG) << Name(static_cast<int>(r)) << " restored " << restored[r] << " of "
                      << req.blocks_size()
                      << " blocks: " << (st.ok() ? resp.stopped() : st.error_message());
      }
    });
  }
  for (std::thread& t : calls) t.join();
  return *std::min_element(restored.begin(), restored.end());
}

absl::Status WorkerGroupClient::Close() {
  absl::Status out;
  for (auto& k : ranks_) {
    if (!k->finished) k->stream->WritesDone();
  }
  // The workers end their streams once they have answered every plan; a
  // rank that does not within the round deadline is cut off.
  {
    absl::MutexLock l(&mu_);
    auto all_ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& r : ranks_) {
        if (!r->ended) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&all_ended), absl::FromChrono(options_.round_deadline));
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& k = *ranks_[r];
    if (k.finished) continue;
    {
      absl::MutexLock l(&mu_);
      if (!k.ended) k.ctx->TryCancel();
    }
    if (k.reader.joinable()) k.reader.join();
    grpc::Status st = k.stream->Finish();
    k.finished = true;
    if (!st.ok() && out.ok())
      out = absl::UnavailableError(absl::StrCat(Name(r), ": ", st.error_message()));
  }
  return out;
}

}  // namespace ringlane::router
