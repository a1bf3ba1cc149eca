// The rendezvous of a worker group over gRPC: the service one rank (or a
// separate address) serves, and the Gloo store the ranks use through it.
#ifndef RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_
#define RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
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
  RendezvousService();

  grpc::Status Set(grpc::ServerContext* ctx, const ringlane::v1::RendezvousSetRequest* req,
                   ringlane::v1::RendezvousSetResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const ringlane::v1::RendezvousGetRequest* req,
                   ringlane::v1::RendezvousGetResponse* resp) override;
  grpc::Status Join(grpc::ServerContext* ctx, const ringlane::v1::RendezvousJoinRequest* req,
                    ringlane::v1::RendezvousJoinResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const ringlane::v1::RendezvousWatchRequest* req,
                     ringlane::v1::RendezvousWatchResponse* resp) override;

 private:
  // Formation state of one group.
  struct Group {
    int world_size = 0;
    // The epoch in force (0: none yet) and whether a member has left it.
    int64_t epoch = 0;
    bool broken = false;
    std::string broken_reason;
    // Ranks enrolled for the next formation.
    std::set<int> pending;
  };

  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  const uint64_t instance_;
};

// A formed epoch of a group, as Join returned it.
struct GroupEpoch {
  int64_t epoch = 0;
  uint64_t service_instance = 0;
  // The store group the ranks connect their collectives under.
  std::string store_group;
};

// Joins `group` at the Rendezvous service at `address` and waits up to `wait`
// for every rank. DeadlineExceeded naming the missing ranks, Unavailable when
// the service cannot be reached, FailedPrecondition on a world-size mismatch.
absl::StatusOr<GroupEpoch> JoinGroup(const std::string& address, const std::string& group, int rank,
                                     int world_size, std::chrono::milliseconds wait);

// Waits up to `wait` for `epoch` of `group` to break. True (with the reason in
// *reason) when it has, or when the service is gone or has restarted; false
// when the wait ended with the epoch still in force.
bool WatchGroupBroken(const std::string& address, const std::string& group, int64_t epoch,
                      std::chrono::milliseconds wait, std::string* reason);

// A Gloo store that keeps its entries in a Rendezvous service at `address`
// (host:port), under `group`. Failures throw gloo's IoException, as Gloo's
// stores do; CreateGlooCommunicator turns that into Unavailable.
std::unique_ptr<gloo::rendezvous::Store> CreateGrpcStore(const std::string& address,
                                                         const std::string& group,
                                                         std::chrono::milliseconds timeout);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_RENDEZVOUS_RENDEZVOUS_H_
