#include "worker/rendezvous/rendezvous.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"
#include "services/grpc_security.h"
#include "services/status_grpc.h"

namespace ringlane::worker {

RendezvousService::RendezvousService()
    : instance_(std::random_device()() * 0x100000000ull ^ std::random_device()()) {}

grpc::Status RendezvousService::Set(grpc::ServerContext*,
                                    const ringlane::v1::RendezvousSetRequest* req,
                                    ringlane::v1::RendezvousSetResponse*) {
  if (req->key().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty key");
  absl::MutexLock lock(&mu_);
  values_[{req->group(), req->key()}] = req->value();
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Get(grpc::ServerContext*,
                                    const ringlane::v1::RendezvousGetRequest* req,
                                    ringlane::v1::RendezvousGetResponse* resp) {
  const auto id = std::make_pair(req->group(), req->key());
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(id) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present),
                            absl::Milliseconds(std::max<int64_t>(0, req->wait_ms())))) {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("rendezvous key '", req->key(), "' of group '", req->group(),
                     "' not set within ", req->wait_ms(), " ms: a peer never arrived"));
  }
  resp->set_value(values_[id]);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Join(grpc::ServerContext*,
                                     const ringlane::v1::RendezvousJoinRequest* req,
                                     ringlane::v1::RendezvousJoinResponse* resp) {
  if (req->world_size() < 1 || req->rank() < 0 || req->rank() >= req->world_size()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank ", req->rank(), " of world size ", req->world_size()));
  }
  absl::MutexLock lock(&mu_);
  Group& g = groups_[req->group()];
  if (g.world_size == 0) g.world_size = req->world_size();
  if (g.world_size != req->world_size()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("group '", req->group(), "' has world size ", g.world_size,
                                     ", rank ", req->rank(), " says ", req->world_size()));
  }
  if (g.epoch > 0 && !g.broken) {
    // Every member of the epoch in force is in it until it leaves; a member
    // joining again has left (it restarted, or its collectives failed).
    g.broken = true;
    g.broken_reason = absl::StrCat("rank ", req->rank(), " rejoined group '", req->group(),
                                   "' after epoch ", g.epoch);
  }
  g.pending.insert(req->rank());
  const int64_t target = g.epoch + 1;
  if (static_cast<int>(g.pending.size()) == g.world_size) {
    g.epoch = target;
    g.broken = false;
    g.broken_reason.clear();
    g.pending.clear();
  } else {
    auto formed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return g.epoch >= target; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&formed),
                              absl::Milliseconds(std::max<int64_t>(0, req->wait_ms())))) {
      std::vector<int> missing;
      for (int r = 0; r < g.world_size; ++r) {
        if (!g.pending.count(r)) missing.push_back(r);
      }
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("group '", req->group(), "': rank(s) ", absl::StrJoin(missing, ","), " of ",
                       g.world_size, " never arrived within ", req->wait_ms(), " ms"));
    }
  }
  resp->set_epoch(target);
  resp->set_service_instance(instance_);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Watch(grpc::ServerContext*,
                                      const ringlane::v1::RendezvousWatchRequest* req,
                                      ringlane::v1::RendezvousWatchResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(req->group());
  if (it == groups_.end() || it->second.epoch < req->epoch()) {
    resp->set_broken(true);
    resp->set_reason(absl::StrCat("the rendezvous service does not know epoch ", req->epoch(),
                                  " of group '", req->group(), "' (it restarted)"));
    return grpc::Status::OK;
  }
  Group& g = it->second;
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return g.epoch != req->epoch() || g.broken;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ended),
                       absl::Milliseconds(std::max<int64_t>(0, req->wait_ms())));
  if (ended()) {
    resp->set_broken(true);
    resp->set_reason(g.broken_reason.empty()
                         ? absl::StrCat("group '", req->group(), "' moved on to epoch ", g.epoch)
                         : g.broken_reason);
  }
  return grpc::Status::OK;
}

namespace {

std::unique_ptr<ringlane::v1::Rendezvous::Stub> RendezvousStub(const std::string& address) {
  return ringlane::v1::Rendezvous::NewStub(services::NewPeerChannel(address));
}

}  // namespace

absl::StatusOr<GroupEpoch> JoinGroup(const std::string& address, const std::string& group, int rank,
                                     int world_size, std::chrono::milliseconds wait) {
  auto stub = RendezvousStub(address);
  ringlane::v1::RendezvousJoinRequest req;
  req.set_group(group);
  req.set_rank(rank);
  req.set_world_size(world_size);
  req.set_wait_ms(wait.count());
  ringlane::v1::RendezvousJoinResponse resp;
  grpc::ClientContext ctx;
  // The service (rank 0) may still be starting: wait for it as long as for
  // the peers, plus a margin for the call.
  ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(5));
  ctx.set_wait_for_ready(true);
  grpc::Status st = stub->Join(&ctx, req, &resp);
  if (!st.ok()) {
    absl::Status s = services::FromGrpcStatus(st);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        st.error_message().find("never arrived") == std::string::npos) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous service at ", address, " did not answer: ", st.error_message()));
    }
    return absl::Status(s.code(), absl::StrCat("rendezvous at ", address, ": ", s.message()));
  }
  GroupEpoch e;
  e.epoch = resp.epoch();
  e.service_instance = resp.service_instance();
  e.store_group = absl::StrCat(group, "/", resp.service_instance(), "/epoch-", resp.epoch());
  return e;
}

bool WatchGroupBroken(const std::string& address, const std::string& group, int64_t epoch,
                      std::chrono::milliseconds wait, std::string* reason) {
  auto stub = RendezvousStub(address);
  ringlane::v1::RendezvousWatchRequest req;
  req.set_group(group);
  req.set_epoch(epoch);
  req.set_wait_ms(wait.count());
  ringlane::v1::RendezvousWatchResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(5));
  grpc::Status st = stub->Watch(&ctx, req, &resp);
  if (!st.ok()) {
    *reason = absl::StrCat("rendezvous service at ", address, " lost: ", st.error_message());
    return true;
  }
  if (resp.broken()) *reason = resp.reason();
  return resp.broken();
}

namespace {

class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(const std::string& address, std::string group, std::chrono::milliseconds timeout)
      : stub_(ringlane::v1::Rendezvous::NewStub(services::NewPeerChannel(address))),
        address_(address),
        group_(std::move(group)),
        timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    ringlane::v1::RendezvousSetRequest req;
    req.set_group(group_);
    req.set_key(key);
    req.set_value(std::string(data.begin(), data.end()));
    ringlane::v1::RendezvousSetResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    ctx.set_wait_for_ready(true);  // the server may still be starting
    Check(stub_->Set(&ctx, req, &resp), key);
  }

  std::vector<char> get(const std::string& key) override {
    ringlane::v1::RendezvousGetResponse resp = Fetch(key, timeout_);
    return std::vector<char>(resp.value().begin(), resp.value().end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (const std::string& k : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      Fetch(k, std::max(left, std::chrono::milliseconds(0)));
    }
  }

 private:
  ringlane::v1::RendezvousGetResponse Fetch(const std::string& key,
                                            std::chrono::milliseconds wait) {
    ringlane::v1::RendezvousGetRequest req;
    req.set_group(group_);
    req.set_key(key);
    req.set_wait_ms(wait.count());
    ringlane::v1::RendezvousGetResponse resp;
    grpc::ClientContext ctx;
    // The server answers within wait_ms; allow a margin for the call itself.
    ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    Check(stub_->Get(&ctx, req, &resp), key);
    return resp;
  }

  void Check(const grpc::Status& st, const std::string& key) {
    if (!st.ok()) {
      throw gloo::IoException(
          absl::StrCat("rendezvous at ", address_, " (key '", key, "'): ", st.error_message()));
    }
  }

  std::unique_ptr<ringlane::v1::Rendezvous::Stub> stub_;
  const std::string address_;
  const std::string group_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> CreateGrpcStore(const std::string& address,
                                                         const std::string& group,
                                                         std::chrono::milliseconds timeout) {
  return std::make_unique<GrpcStore>(address, group, timeout);
}

}  // namespace ringlane::worker
