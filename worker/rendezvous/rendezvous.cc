#include "worker/rendezvous/rendezvous.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"

namespace ringlane::worker {

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

namespace {

class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(const std::string& address, std::string group, std::chrono::milliseconds timeout)
      : stub_(ringlane::v1::Rendezvous::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
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
