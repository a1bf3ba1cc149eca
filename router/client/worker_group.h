// The router's end of one worker group: a Rounds stream to every rank, the
// same plans sent to all of them, rank 0's results returned. Ranks other
// than 0 answer every plan too (with no outputs); their results are read and
// checked so that a rank that failed or disagrees is noticed at once.
//
// Send() may run ahead of Receive() (pipelining): the ranks know every lane's
// last sampled token, so a decode plan can go out before the previous
// round's result has arrived. One thread sends, one receives (may be the
// same thread).
#ifndef RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_
#define RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ringlane/v1/worker.grpc.pb.h"

namespace ringlane::router {

// One worker group as the scheduler's loop drives it. WorkerGroupClient is
// the real one; the planner tests put a fake under the loop.
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  // Rank 0's info (model and KV geometry, limits, epoch).
  virtual const ringlane::v1::WorkerInfo& info() const = 0;
  // Sends the plan to every rank. Unavailable when a stream is gone.
  virtual absl::Status Send(const ringlane::v1::RoundPlan& plan) = 0;
  // The next result, in plan order. Unavailable when the group broke.
  virtual absl::StatusOr<ringlane::v1::RoundResult> Receive() = 0;
  // Whether every rank still serves the connected epoch (idle groups).
  virtual absl::Status Check(std::chrono::milliseconds timeout) = 0;
  virtual absl::Status Close() = 0;
};

class WorkerGroupClient final : public WorkerGroup {
 public:
  // Asks every rank (addresses in rank order) for its info, checks that they
  // form one formed group (same model, revision, group, epoch, world size =
  // number of addresses, rank i at address i, same KV geometry), and opens
  // the Rounds streams. Waits up to `timeout` for the group to be formed.
  // Unavailable while it is not; FailedPrecondition when the ranks disagree.
  static absl::StatusOr<std::unique_ptr<WorkerGroupClient>> Connect(
      const std::vector<std::string>& addresses, std::chrono::milliseconds timeout);
  ~WorkerGroupClient();

  // Rank 0's info (model and KV geometry; group_epoch identifies the
  // formation whose KV contents the plans build on).
  const ringlane::v1::WorkerInfo& info() const override { return info_; }
  int world_size() const { return static_cast<int>(ranks_.size()); }

  // Sends the plan to every rank. Unavailable when a stream is gone.
  absl::Status Send(const ringlane::v1::RoundPlan& plan) override;
  // The next result, in plan order (rank 0's). Unavailable (with the rank's
  // reason) when any rank's stream ended; the group is then unusable and the
  // client must reconnect (a re-formed group has lost its KV contents).
  absl::StatusOr<ringlane::v1::RoundResult> Receive() override;
  // Send + Receive.
  absl::StatusOr<ringlane::v1::RoundResult> Run(const ringlane::v1::RoundPlan& plan);

  // Asks every rank whether it still serves the epoch this client connected
  // to: Unavailable when a rank is unreachable, not ready, or in another
  // epoch (its KV contents are gone). For idle groups, whose dead ranks no
  // round would reveal.
  absl::Status Check(std::chrono::milliseconds timeout) override;

  // Ends the streams (lanes on the workers are dropped).
  absl::Status Close() override;

 private:
  struct Rank {
    std::string address;
    std::unique_ptr<ringlane::v1::Worker::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<ringlane::v1::RoundPlan, ringlane::v1::RoundResult>>
        stream;
    bool done = false;
  };
  WorkerGroupClient() = default;
  // The status a failed stream of rank r ended with.
  absl::Status Fail(int r, const std::string& what);

  std::vector<Rank> ranks_;
  ringlane::v1::WorkerInfo info_;
  bool broken_ = false;
  absl::Status broken_status_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_
