// The rendezvous of a worker group over gRPC: the service one rank (or a
// separate address) serves, and the Gloo store the ranks use through it.
#ifndef RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_
#define RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "ringlane/v1/rendezvous.grpc.pb.h"

namespace gloo::rendezvous {
class Store;
}

namespace ringlane::worker {

// In-memory key-value store behind the Rendezvous RPCs. Thread-safe: gRPC
// handler threads call it concurrently; Get waits on mu_ for its key.
class RendezvousService final : public ringlane::v1::Rendezvous::Service {
 public:
  grpc::Status Set(grpc::ServerContext* ctx, const ringlane::v1::RendezvousSetRequest* req,
                   ringlane::v1::RendezvousSetResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const ringlane::v1::RendezvousGetRequest* req,
                   ringlane::v1::RendezvousGetResponse* resp) override;

 private:
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// A Gloo store that keeps its entries in a Rendezvous service at `address`
// (host:port), under `group`. Failures throw gloo's IoException, as Gloo's
// stores do; CreateGlooCommunicator turns that into Unavailable.
std::unique_ptr<gloo::rendezvous::Store> CreateGrpcStore(const std::string& address,
                                                         const std::string& group,
                                                         std::chrono::milliseconds timeout);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_
