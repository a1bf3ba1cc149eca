#include "worker/server/group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/log.h"
#include "worker/collectives/factory.h"
#include "worker/collectives/timed_communicator.h"
#include "worker/rendezvous/rendezvous.h"

namespace ringlane::worker {

GroupMember::GroupMember(std::shared_ptr<const ModelWeights> shard, GroupOptions options)
    : shard_(std::move(shard)),
      options_(std::move(options)),
      steps_(
          options_.rank,
          [this](int64_t epoch, int64_t installed) { return Admit(epoch, installed); },
          [this](const absl::Status& status) { ReportFailure(status); }) {
  state_.status = "starting";
}

GroupMember::~GroupMember() { Stop(); }

void GroupMember::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void GroupMember::RequestStop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void GroupMember::Stop() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
  steps_.Stop();
}

bool GroupMember::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

GroupMember::State GroupMember::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

void GroupMember::SetStatus(bool ready, int64_t epoch, std::string status) {
  State s;
  {
    absl::MutexLock lock(&mu_);
    if (ready && !state_.ready) ++state_.formations;
    state_.ready = ready;
    state_.epoch = epoch;
    state_.status = std::move(status);
    s = state_;
  }
  if (on_change_) on_change_(s);
}

void GroupMember::ReportFailure(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!broken_) {
    broken_ = true;
    broken_reason_ = std::string(status.message());
  }
}

absl::Status GroupMember::Admit(int64_t epoch, int64_t installed) const {
  absl::MutexLock lock(&mu_);
  const State& s = state_;
  if (!s.ready || installed == 0 || installed != s.epoch) {
    return absl::UnavailableError(
        absl::StrCat("worker group '", options_.name, "' is not formed: ", s.status));
  }
  if (broken_) {
    return absl::UnavailableError(
        absl::StrCat("worker group '", options_.name, "' broke in epoch ", s.epoch));
  }
  if (epoch != 0 && epoch != s.epoch) {
    return absl::UnavailableError(
        absl::StrCat("worker group '", options_.name, "' re-formed (epoch ", epoch, " -> ", s.epoch,
                     "): the KV contents and lanes of epoch ", epoch, " are gone"));
  }
  return absl::OkStatus();
}

void GroupMember::Loop() {
  while (!Stopping()) FormAndServe();
  SetStatus(false, 0, "stopped");
}

void GroupMember::FormAndServe() {
  const GroupOptions& o = options_;
  const std::string who = absl::StrCat("group '", o.name, "' rank ", o.rank, " of ", o.world_size);
  int64_t epoch = 0;
  std::string store_group;
  if (o.world_size == 1) {
    epoch = state().formations + 1;
  } else {
    // Join in short waits so that Stop() is honoured promptly; report a
    // timeout once the configured wait has passed, then keep waiting.
    SetStatus(false, 0, absl::StrCat("waiting for the other ranks at ", o.rendezvous_address));
    const auto start = std::chrono::steady_clock::now();
    bool reported = false;
    for (;;) {
      if (Stopping()) return;
      const auto step =
          std::min<std::chrono::milliseconds>(o.join_timeout, std::chrono::milliseconds(2000));
      absl::StatusOr<GroupEpoch> e =
          JoinGroup(o.rendezvous_address, o.name, o.rank, o.world_size, step);
      if (e.ok()) {
        epoch = e->epoch;
        store_group = e->store_group;
        break;
      }
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      if (absl::IsFailedPrecondition(e.status()) || absl::IsInvalidArgument(e.status())) {
        SetStatus(false, 0, std::string(e.status().message()));
        RL_LOG(ERROR) << who << ": cannot join: " << e.status().message();
        absl::SleepFor(absl::Seconds(1));
        continue;
      }
      if (waited >= o.join_timeout && !reported) {
        // The service names the missing ranks; the wait is ours.
        std::string msg(e.status().message());
        if (size_t cut = msg.find(" within "); cut != std::string::npos) msg.resize(cut);
        msg = absl::StrCat("rendezvous timeout: ", msg, " within ", waited.count(),
                           " ms; still waiting");
        SetStatus(false, 0, msg);
        RL_LOG(WARNING) << who << ": " << msg;
        reported = true;
      }
      if (!absl::IsDeadlineExceeded(e.status())) absl::SleepFor(absl::Milliseconds(200));
    }
  }

  CommunicatorOptions co;
  co.kind = CollectivesForBackend(o.backend.kind);
  co.rank = o.rank;
  co.world_size = o.world_size;
  co.rendezvous_address = o.rendezvous_address;
  co.group = store_group;
  co.timeout = o.collective_timeout;
  co.host = o.host;
  co.port_min = o.port_min;
  co.port_max = o.port_max;
  co.transport = o.transport;
  co.tcp_wait = o.tcp_wait;
  absl::StatusOr<std::unique_ptr<Communicator>> c = CreateCommunicator(co);
  if (!c.ok()) {
    RL_LOG(WARNING) << who << ": connecting the collectives of epoch " << epoch
                    << " failed: " << c.status().message() << "; joining again";
    SetStatus(false, 0, std::string(c.status().message()));
    return;
  }
  auto comm = std::make_unique<TimedCommunicator>(std::move(*c));
  // An unsharded model has no collectives to run.
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(shard_, o.backend, o.world_size > 1 ? comm.get() : nullptr);
  if (!backend.ok()) {
    RL_LOG(ERROR) << who << ": " << backend.status().message();
    SetStatus(false, 0, absl::StrCat("backend: ", backend.status().message()));
    absl::SleepFor(absl::Seconds(5));
    return;
  }
  std::unique_ptr<Backend> draft;
  if (o.rank == 0 && o.draft_model != nullptr) {
    // Whole on this rank: no collectives, no split of its cache.
    BackendOptions bo = o.backend;
    bo.cpu.context_parallel = false;
    absl::StatusOr<std::unique_ptr<Backend>> d = CreateBackend(o.draft_model, bo, nullptr);
    if (d.ok()) {
      draft = std::move(*d);
    } else {
      RL_LOG(WARNING) << who << ": draft model: " << d.status().message()
                      << "; serving without proposals";
    }
  }
  if (absl::Status st =
          steps_.Install(epoch, std::move(comm), std::move(*backend), o.kv_pool, std::move(draft));
      !st.ok()) {
    RL_LOG(ERROR) << who << ": KV pool of " << o.kv_pool.num_blocks << " blocks: " << st.message();
    SetStatus(false, 0, absl::StrCat("KV pool: ", st.message()));
    absl::SleepFor(absl::Seconds(5));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    broken_ = false;
    broken_reason_.clear();
  }
  SetStatus(true, epoch, "serving");
  RL_LOG(INFO) << who << ": formed, epoch " << epoch << "; the KV pool (" << o.kv_pool.num_blocks
               << " blocks) starts empty"
               << (epoch > 1 ? ": KV contents of earlier epochs are gone" : "");

  std::string reason;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || broken_; };
      if (o.world_size == 1) mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Seconds(1));
      if (stopping_) return;
      if (broken_) {
        reason = broken_reason_;
        break;
      }
    }
    if (o.world_size > 1 && WatchGroupBroken(o.rendezvous_address, o.name, epoch,
                                             std::chrono::milliseconds(500), &reason)) {
      if (Stopping()) return;  // the service went away because we are shutting down
      break;
    }
  }
  SetStatus(false, epoch, absl::StrCat("epoch ", epoch, " broke (", reason, "); re-forming"));
  RL_LOG(WARNING) << who << ": epoch " << epoch << " broke: " << reason
                  << "; dropping the KV pool and joining again";
  // Behind whatever is queued: those operations fail admission now that the
  // group is not ready, and nothing runs on the old formation after this.
  steps_.Teardown();
}

}  // namespace ringlane::worker
