// This rank's membership of its tensor-parallel group, through the group's
// life: join at the rendezvous, connect the collectives, build the backend
// and its (empty) KV pool, serve, and when the group breaks (a collective
// failed here, or another rank left and rejoined) tear everything down and
// join again. Each formation has a new epoch; KV contents never survive one.
//
// A group of one rank forms at once, with no rendezvous.
//
// The formation loop runs in a thread of its own; the formation it builds is
// handed to the step loop (step_loop.h), whose thread alone uses it. The
// public methods are thread-safe. Lock order: the two mutexes are never held
// together; the step loop calls Admit and ReportFailure without its own.
#ifndef RINGLANE_WORKER_SERVER_GROUP_H_
#define RINGLANE_WORKER_SERVER_GROUP_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/factory.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/server/step_loop.h"

namespace ringlane::worker {

struct GroupOptions {
  std::string name = "default";
  int rank = 0;
  int world_size = 1;
  // host:port of the Rendezvous service (world_size > 1).
  std::string rendezvous_address;
  // Address this rank's collectives bind to and advertise, and the port
  // range Gloo's TCP transport listens in (0, 0: the kernel picks).
  std::string host = "127.0.0.1";
  int port_min = 0;
  int port_max = 0;
  // How long one Join waits for the other ranks before it logs who is
  // missing (and tries again).
  std::chrono::milliseconds join_timeout{60000};
  // Longest wait inside one collective before the group counts as broken.
  std::chrono::milliseconds collective_timeout{30000};
  // Host collectives: "auto", "tcp" or "ibverbs", and how TCP ranks wait for
  // their peers (CommunicatorOptions).
  std::string transport = "auto";
  std::string tcp_wait = "blocking";
  KvPoolSpec kv_pool;
  // Its kind also picks the collectives (CollectivesForBackend).
  BackendOptions backend;
  // A draft model (the whole of it, unsharded) that rank 0 runs beside its
  // shard to propose drafts (DraftRunner); null for none. Other ranks
  // ignore it.
  std::shared_ptr<const ModelWeights> draft_model;
};

class GroupMember {
 public:
  GroupMember(std::shared_ptr<const ModelWeights> shard, GroupOptions options);
  ~GroupMember();  // Stop()s

  // Where the rendezvous is, when only known after construction (rank 0
  // serving it on a port picked at start). Call before Start().
  void set_rendezvous_address(std::string address) {
    options_.rendezvous_address = std::move(address);
  }

  // Starts the formation loop in a thread of its own.
  void Start();
  // Ends the loop and, after the operations already queued on the step loop,
  // releases the backend.
  void Stop();
  // Tells the loop to end without waiting for it (so that a server shutting
  // down next is not taken for a broken group); Stop() still must be called.
  void RequestStop();

  // The step loop that runs every operation on this group's formations:
  // rounds and KV block moves enqueue there.
  StepLoop& steps() { return steps_; }

  // A round failed inside a collective or the backend: the group is broken;
  // the loop tears it down and joins again. The step loop calls it.
  void ReportFailure(const absl::Status& status);

  // For GetInfo and health.
  struct State {
    int64_t epoch = 0;
    bool ready = false;
    std::string status;  // why not ready, or "serving"
    int64_t formations = 0;
  };
  State state() const;
  // Called (from the loop's thread) whenever ready changes.
  void set_on_change(std::function<void(const State&)> f) { on_change_ = std::move(f); }

 private:
  void Loop();
  // One formation: returns when it broke or Stop() was called.
  void FormAndServe();
  void SetStatus(bool ready, int64_t epoch, std::string status);
  // StepLoop::AdmitFn: whether an operation for `epoch` may run now.
  absl::Status Admit(int64_t epoch, int64_t installed) const;
  bool Stopping() const;

  const std::shared_ptr<const ModelWeights> shard_;
  GroupOptions options_;  // fixed once Start() is called
  std::function<void(const State&)> on_change_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::string broken_reason_ ABSL_GUARDED_BY(mu_);

  // Last, so that it is destroyed (and its thread ends) before the state its
  // admission callback reads.
  StepLoop steps_;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_GROUP_H_
