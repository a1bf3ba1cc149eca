// The router's end of one worker group: a Rounds stream to every rank, the
// same plans sent to all of them, rank 0's results returned. Ranks other
// than 0 answer every plan too (with no outputs); their results are read and
// checked so that a rank that failed or disagrees is noticed at once.
//
// Send() may run ahead of Receive() (pipelining): the ranks know every lane's
// last sampled token, so a decode plan can go out before the previous
// round's result has arrived. One thread sends, one receives (may be the
// same thread).
//
// Every rank's results are read at once, by a reader thread per rank, so a
// rank that stops answering (frozen, partitioned, dead) is noticed within
// the round deadline whichever rank it is; keepalive pings on the channels
// notice a silent peer even between rounds. A missed deadline or a failed
// stream cancels every stream of the group (the workers drop its lanes) and
// leaves the client broken: the caller reconnects.
#ifndef RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_
#define RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Has every rank restore `req`'s chain from its kvstore into its pool
  // (Worker.RestoreKvBlocks), all ranks at once, and returns how many leading
  // blocks every rank wrote: the minimum, 0 when a rank fails or misses
  // `deadline`. Blocks past it hold garbage on some ranks. Safe to call from
  // another thread than the one that sends and receives; the default (a
  // group without kvstores) restores nothing.
  virtual int RestoreKvBlocks(const ringlane::v1::RestoreKvBlocksRequest& req,
                              std::chrono::milliseconds deadline) {
    static_cast<void>(req);
    static_cast<void>(deadline);
    return 0;
  }
};

struct WorkerGroupOptions {
  // Longest wait for one round's results, counted from when the round could
  // start (it was sent and the previous round's results were in).
  std::chrono::milliseconds round_deadline{30000};
};

// The channel to one worker. Kept apart so that credentials (TLS) and
// channel arguments are chosen in one place.
std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const WorkerGroupOptions& options);

class WorkerGroupClient final : public WorkerGroup {
 public:
  // Asks every rank (addresses in rank order) for its info, checks that they
  // form one formed group (same model, revision, group, epoch, world size =
  // number of addresses, rank i at address i, same KV geometry), and opens
  // the Rounds streams. Waits up to `timeout` for the group to be formed.
  // Unavailable while it is not; FailedPrecondition when the ranks disagree.
  static absl::StatusOr<std::unique_ptr<WorkerGroupClient>> Connect(
      const std::vector<std::string>& addresses, std::chrono::milliseconds timeout,
      const WorkerGroupOptions& options = {});
  ~WorkerGroupClient();  // cancels the streams and joins the readers

  // Rank 0's info (model and KV geometry; group_epoch identifies the
  // formation whose KV contents the plans build on).
  const ringlane::v1::WorkerInfo& info() const override { return info_; }
  int world_size() const { return static_cast<int>(ranks_.size()); }

  // Sends the plan to every rank. Unavailable when a stream is gone.
  absl::Status Send(const ringlane::v1::RoundPlan& plan) override;
  // The next result, in plan order (rank 0's). Unavailable (with the rank's
  // reason) when any rank's stream ended or a rank sent nothing within the
  // round deadline; the streams are then cancelled, the group is unusable
  // and the client must reconnect (a re-formed group has lost its KV
  // contents).
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
  int RestoreKvBlocks(const ringlane::v1::RestoreKvBlocksRequest& req,
                      std::chrono::milliseconds deadline) override;

 private:
  // One rank's stream. The fields above `reader` are fixed once the stream
  // is open; `results` and `ended` are written by the reader thread under
  // mu_; `finished` belongs to the thread that sends.
  struct Rank {
    std::string address;
    std::unique_ptr<ringlane::v1::Worker::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<ringlane::v1::RoundPlan, ringlane::v1::RoundResult>>
        stream;
    std::thread reader;
    std::deque<ringlane::v1::RoundResult> results;
    bool ended = false;
    bool finished = false;
  };
  explicit WorkerGroupClient(const WorkerGroupOptions& options) : options_(options) {}
  void ReadLoop(Rank* rank);
  // Cancels every stream: the workers drop the group's lanes and the
  // readers end.
  void CancelAll();
  // Marks the client broken with `status` (the first reason wins), cancels
  // the streams, and returns the status.
  absl::Status Break(absl::Status status);
  // The status rank r's ended stream finished with, as the broken status.
  absl::Status FailEnded(int r, const std::string& what);
  // Like FailEnded, for every rank whose stream ended (at least one has).
  absl::Status FailAllEnded();
  std::string Name(int r) const;

  const WorkerGroupOptions options_;
  // Fixed after Connect; the elements' reader fields as described above.
  std::vector<std::unique_ptr<Rank>> ranks_;
  ringlane::v1::WorkerInfo info_;

  absl::Mutex mu_;
  // Send times of the rounds whose results are due, oldest first, and when
  // the last result arrived (a round sent ahead only starts then). Only the
  // sending/receiving thread uses them; not guarded.
  struct Due {
    std::chrono::steady_clock::time_point sent;
    uint64_t round_id = 0;
  };
  std::deque<Due> due_;
  std::chrono::steady_clock::time_point last_result_;
  bool broken_ = false;
  absl::Status broken_status_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_CLIENT_WORKER_GROUP_H_
