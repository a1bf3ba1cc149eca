#include "router/client/worker_group.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "services/grpc_security.h"
#include "services/status_grpc.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

// Fields every rank of one group must agree on.
std::string Geometry(const v1::WorkerInfo& i) {
  return absl::StrCat("model ", i.model_id(), "@", i.model_revision(), ", group ", i.group(),
                      " epoch ", i.group_epoch(), ", world ", i.tp_world_size(), ", KV ",
                      i.kv_pool_blocks(), "x", i.block_size_tokens(), " dtype ", i.kv_dtype());
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerGroupClient>> WorkerGroupClient::Connect(
    const std::vector<std::string>& addresses, std::chrono::milliseconds timeout) {
  if (addresses.empty()) return absl::InvalidArgumentError("no worker addresses");
  std::unique_ptr<WorkerGroupClient> c(new WorkerGroupClient());
  const auto deadline = std::chrono::system_clock::now() + timeout;
  for (const std::string& a : addresses) {
    Rank r;
    r.address = a;
    r.stub = v1::Worker::NewStub(grpc::CreateChannel(a, services::PeerChannelCredentials()));
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
      grpc::Status st = c->ranks_[i].stub->GetInfo(&ctx, v1::GetInfoRequest(), &infos[i]);
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
      break;
    }
    if (std::chrono::system_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("worker group not ready: ", why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (Rank& r : c->ranks_) {
    r.ctx = std::make_unique<grpc::ClientContext>();
    r.stream = r.stub->Rounds(r.ctx.get());
  }
  return c;
}

WorkerGroupClient::~WorkerGroupClient() {
  for (Rank& r : ranks_) {
    if (r.ctx) r.ctx->TryCancel();
    if (r.stream && !r.done) r.stream->Finish().ok();
  }
}

absl::Status WorkerGroupClient::Fail(int r, const std::string& what) {
  Rank& k = ranks_[r];
  grpc::Status st = k.stream->Finish();
  k.done = true;
  broken_ = true;
  broken_status_ = absl::UnavailableError(
      absl::StrCat("worker rank ", r, " (", k.address, ") ", what, ": ",
                   st.ok() ? std::string("stream closed") : st.error_message()));
  return broken_status_;
}

absl::Status WorkerGroupClient::Send(const v1::RoundPlan& plan) {
  if (broken_) return broken_status_;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r].stream->Write(plan)) return Fail(static_cast<int>(r), "took no plan");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RoundResult> WorkerGroupClient::Receive() {
  if (broken_) return broken_status_;
  v1::RoundResult first;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    v1::RoundResult res;
    if (!ranks_[r].stream->Read(&res)) return Fail(static_cast<int>(r), "ended its stream");
    if (r == 0) {
      first = std::move(res);
      continue;
    }
    if (res.round_id() != first.round_id() || res.error().code() != first.error().code()) {
      broken_ = true;
      broken_status_ = absl::InternalError(absl::StrCat(
          "ranks disagree on round ", first.round_id(), ": rank 0 says code ", first.error().code(),
          ", rank ", r, " round ", res.round_id(), " code ", res.error().code()));
      return broken_status_;
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
  for (size_t r = 0; r < ranks_.size(); ++r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    v1::WorkerInfo i;
    grpc::Status st = ranks_[r].stub->GetInfo(&ctx, v1::GetInfoRequest(), &i);
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
      broken_ = true;
      broken_status_ = absl::UnavailableError(
          absl::StrCat("worker rank ", r, " (", ranks_[r].address, ") ", why));
      return broken_status_;
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerGroupClient::Close() {
  absl::Status out;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& k = ranks_[r];
    if (k.done) continue;
    k.stream->WritesDone();
    v1::RoundResult unread;
    while (k.stream->Read(&unread)) {
    }
    grpc::Status st = k.stream->Finish();
    k.done = true;
    if (!st.ok() && out.ok()) {
      out = absl::UnavailableError(absl::StrCat("worker rank ", r, ": ", st.error_message()));
    }
  }
  return out;
}

}  // namespace ringlane::router
