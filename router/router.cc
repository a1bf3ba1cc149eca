#include "router/router.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "router/tokenizer/utf8.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

// ---------------------------------------------------------------------------
// ResponseQueue

void ResponseQueue::Push(v1::GenerateResponse msg) {
  absl::MutexLock l(&mu_);
  if (!done_) msgs_.push_back(std::move(msg));
}

void ResponseQueue::Finish(absl::Status status) {
  absl::MutexLock l(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
}

bool ResponseQueue::finished() const {
  absl::MutexLock l(&mu_);
  return done_;
}

bool ResponseQueue::Take(absl::Duration timeout, std::vector<v1::GenerateResponse>* out,
                         absl::Status* status) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !msgs_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  while (!msgs_.empty()) {
    out->push_back(std::move(msgs_.front()));
    msgs_.pop_front();
  }
  if (done_) *status = status_;
  return done_;
}

// ---------------------------------------------------------------------------
// Requests, choices and lanes (touched only under their group's mutex once
// submitted).

namespace {

struct RequestState;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Choice {
  int index = 0;
  std::vector<int32_t> generated;
  std::unique_ptr<IncrementalDecoder> decoder;
  std::optional<StopMatcher> matcher;
  // Absent when the watchdog is off for the request.
  std::optional<LoopDetector> loop;
  bool finished = false;
  Clock::time_point first_token;
  Clock::time_point last_token;
};

struct RequestState {
  PreparedRequest p;
  std::shared_ptr<ResponseQueue> queue;
  std::optional<StopTokens> stop_tokens;
  std::vector<Choice> choices;
  int choices_left = 0;
  int completion_tokens = 0;
  int64_t cached_tokens = -1;  // of choice 0's first lane
  bool failed = false;
  // Set when the request is queued on a group: its series, and when.
  GroupMetrics* metrics = nullptr;
  Clock::time_point submitted;
  bool any_token = false;
  // Its end (finished, failed or cancelled) was counted.
  bool accounted = false;

  bool dead() const { return failed || queue->cancelled(); }
  void Fail(absl::Status status) {
    if (failed) return;
    failed = true;
    Account(queue->cancelled() ? &GroupMetrics::requests_cancelled
                               : &GroupMetrics::requests_failed);
    queue->Finish(std::move(status));
  }
  // Counts the request's end once, in `outcome` and the end-to-end latency.
  void Account(prometheus::Counter* GroupMetrics::*outcome) {
    if (accounted || metrics == nullptr) return;
    accounted = true;
    (metrics->*outcome)->Increment();
    metrics->e2e_request_latency_s->Observe(Seconds(Clock::now() - submitted));
  }
};

struct Waiting {
  std::shared_ptr<RequestState> req;
  int choice = 0;
};

struct Lane {
  LaneId id = 0;
  std::shared_ptr<RequestState> req;
  int choice = 0;
  uint64_t admit_seq = 0;
  // The prompt this lane prefills (the request's prompt plus what the choice
  // generated before a preemption), then every token sampled since.
  std::vector<int32_t> seq;
  int64_t prompt_len = 0;
  int64_t fed = 0;  // positions whose KV the planned rounds write
  int64_t committed_blocks = 0;
  bool params_sent = false;
  bool in_plan = false;  // has a row in the plan being built
  bool gone = false;     // released; removed from the lane list at the next compaction
};

// A round sent to the workers whose result has not been applied yet.
struct InFlightRound {
  v1::RoundPlan plan;
  // Each lane the round feeds, with its planned positions once the round
  // ran: how far its blocks may be committed when the result arrives.
  std::vector<std::pair<LaneId, int64_t>> fed_after;
  std::chrono::steady_clock::time_point sent;
  // The round as the round log shows it; filled only when logging.
  std::optional<RoundLogEntry> log;
};

}  // namespace

// ---------------------------------------------------------------------------
// Group: one worker group and its scheduler thread.

class Router::Group {
 public:
  Group(Router* router, size_t index, std::vector<std::string> addresses)
      : router_(router), index_(index), addresses_(std::move(addresses)) {}
  ~Group() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  struct Probe {
    bool ready = false;
    int64_t cached_tokens = 0;
    int64_t load = 0;
  };
  Probe ProbePrefix(absl::Span<const int32_t> prompt) const {
    absl::MutexLock l(&mu_);
    Probe p;
    p.ready = ready_ && kv_ != nullptr;
    if (!p.ready) return p;
    p.cached_tokens = kv_->MatchPrefix(prompt).cached_tokens;
    p.load = static_cast<int64_t>(lanes_.size() + waiting_.size());
    return p;
  }

  absl::Status Enqueue(std::shared_ptr<RequestState> req) {
    absl::MutexLock l(&mu_);
    if (!ready_) return absl::UnavailableError(NotReadyMessage());
    req->metrics = &metrics_;
    req->submitted = Clock::now();
    const int64_t n = static_cast<int64_t>(req->choices.size());
    if (!AdmitToQueue(static_cast<int64_t>(waiting_.size()), n, router_->options_.max_waiting)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the router is overloaded: ", waiting_.size(),
                       " choices already wait for a lane on worker group ", index_,
                       " (--max_waiting=", router_->options_.max_waiting, "); retry later"));
    }
    for (int i = 0; i < n; ++i) waiting_.push_back({req, i});
    if (req->p.default_temperature) metrics_.requests_default_temperature->Increment();
    UpdateGauges();
    return absl::OkStatus();
  }

  GroupState State() const {
    absl::MutexLock l(&mu_);
    GroupState s;
    s.ready = ready_;
    s.status = status_;
    s.epoch = epoch_;
    s.lanes = static_cast<int>(lanes_.size());
    s.waiting = static_cast<int>(waiting_.size());
    s.prefilled_tokens = prefilled_tokens_;
    if (kv_) s.kv = kv_->stats();
    return s;
  }

  std::string Describe() const {
    absl::MutexLock l(&mu_);
    return NotReadyMessage();
  }

  std::string NotReadyMessage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::StrCat("worker group ", index_, " (", absl::StrJoin(addresses_, ","),
                        ") is not ready: ", status_.empty() ? "connecting" : status_);
  }

 private:
  void Loop();
  // Connects; false when it failed (status_ says why).
  bool Connect();
  void BuildPlan(InFlightRound* round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyResult(const InFlightRound& round, const v1::RoundResult& result, double round_us)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddRow(Lane& lane, int64_t chunk, InFlightRound* round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the lane's next row would be a decode row that still counts
  // (its planned rows have not sampled max_tokens yet).
  bool WantsDecodeRow(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogEntry(InFlightRound* round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers failed: every lane and in-flight round is lost.
  void OnGroupFailure(const absl::Status& status);
  void ReleaseLane(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Preempt(Lane& lane, v1::RoundPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnToken(Lane& lane, const v1::SampledToken& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAll(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Compact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds a sampled token to the choice's loop watchdog: flags (metric, log)
  // and says whether the loop has run long enough to stop the choice.
  // Latency series for `count` tokens of a lane arriving at `now` (they
  // share the gap since the choice's previous token).
  void NoteTokenTimes(Lane& lane, int count, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LoopShouldStop(const RequestState& req, Choice& c, int32_t token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !waiting_.empty() || !lanes_.empty() || !pending_release_.empty();
  }

  Router* const router_;
  const size_t index_;
  const std::vector<std::string> addresses_;
  std::thread thread_;
  // Only the group's thread uses the client and the in-flight rounds.
  std::unique_ptr<WorkerGroupClient> client_;
  std::deque<InFlightRound> in_flight_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string status_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<KvBlockManager> kv_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);  // admission order
  // Lanes finished by the last result whose worker state a release row drops.
  std::vector<LaneId> pending_release_ ABSL_GUARDED_BY(mu_);
  RoundCostModel cost_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lane_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_admit_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t round_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefilled_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t block_size_ ABSL_GUARDED_BY(mu_) = 16;
  // Series of this group; set at the first connection (the model id comes
  // from the workers), before any request can be queued here.
  GroupMetrics metrics_ ABSL_GUARDED_BY(mu_);
};

namespace {

std::string DTypeName(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return "f32";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_F16:
      return "f16";
    case v1::DTYPE_FP8_E4M3:
      return "fp8";
    default:
      return "unknown";
  }
}

}  // namespace

bool Router::Group::Connect() {
  auto c = WorkerGroupClient::Connect(addresses_, router_->options_.connect_timeout);
  if (!c.ok()) {
    absl::MutexLock l(&mu_);
    if (status_ != c.status().message()) {
      RL_LOG(WARNING) << "worker group " << index_ << " not ready: " << c.status();
    }
    status_ = std::string(c.status().message());
    return false;
  }
  const v1::WorkerInfo& info = (*c)->info();
  if (info.vocab_size() < router_->tokenizer_->vocab_size()) {
    absl::MutexLock l(&mu_);
    status_ = absl::StrCat("the workers' vocabulary (", info.vocab_size(),
                           ") is smaller than the tokenizer's (", router_->tokenizer_->vocab_size(),
                           "): wrong --tokenizer?");
    RL_LOG(ERROR) << "worker group " << index_ << ": " << status_;
    return false;
  }
  KvBlockManager::Options o;
  o.num_blocks = info.kv_pool_blocks();
  o.identity.model_id = info.model_id();
  o.identity.model_revision = info.model_revision();
  o.identity.kv_dtype = DTypeName(info.kv_dtype());
  o.identity.block_size_tokens = info.block_size_tokens();
  o.identity.tp_world_size = info.tp_world_size();
  auto kv = KvBlockManager::Create(o);
  if (!kv.ok()) {
    absl::MutexLock l(&mu_);
    status_ = absl::StrCat("bad KV geometry from the workers: ", kv.status().message());
    return false;
  }
  router_->SetModel(info);
  RL_LOG(INFO) << "worker group " << index_ << " ready: " << info.model_id() << ", TP"
               << info.tp_world_size() << ", epoch " << info.group_epoch() << ", "
               << info.kv_pool_blocks() << " KV blocks of " << info.block_size_tokens()
               << " tokens";
  const std::string model = router_->model()->model_id;
  absl::MutexLock l(&mu_);
  if (metrics_.rounds == nullptr)
    metrics_ = router_->metrics_.ForGroup(model, static_cast<int>(index_));
  kv_ = std::move(*kv);
  block_size_ = info.block_size_tokens();
  epoch_ = info.group_epoch();
  ready_ = true;
  metrics_.group_ready->Set(1);
  metrics_.group_epoch->Set(static_cast<double>(epoch_));
  UpdateGauges();
  status_.clear();
  client_ = std::move(*c);
  return true;
}

void Router::Group::OnGroupFailure(const absl::Status& status) {
  RL_LOG(ERROR) << "worker group " << index_ << " failed: " << status;
  in_flight_.clear();
  absl::MutexLock l(&mu_);
  FailAll(absl::UnavailableError(absl::StrCat(
      "worker group ", index_, " failed: ", status.message(), "; the request was lost, retry")));
  // A re-formed group has lost its KV contents: the ledger starts over.
  kv_->Reset();
  ready_ = false;
  metrics_.group_ready->Set(0);
  UpdateGauges();
  status_ = std::string(status.message());
  client_.reset();
}

void Router::Group::Loop() {
  const size_t depth = static_cast<size_t>(router_->options_.pipeline_depth);
  // When the last result arrived: a round sent ahead starts only then.
  auto previous_done = std::chrono::steady_clock::now();
  for (;;) {
    if (!client_) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) break;
      }
      if (!Connect()) {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stop_),
                             absl::FromChrono(router_->options_.reconnect_pause));
      }
      continue;
    }
    if (in_flight_.size() < depth) {
      InFlightRound round;
      bool idle = false;
      {
        absl::MutexLock l(&mu_);
        // With a round in flight there is always its result to wait for.
        if (in_flight_.empty() &&
            !mu_.AwaitWithTimeout(absl::Condition(this, &Group::HasWork), absl::Seconds(1))) {
          idle = true;
        }
        if (stop_) break;
        if (!idle) BuildPlan(&round);
      }
      if (idle) {
        // No round would reveal a dead or re-formed rank of an idle group:
        // ask the ranks, so that placement stops choosing it.
        idle = false;
        if (absl::Status st = client_->Check(std::chrono::seconds(2)); !st.ok()) {
          OnGroupFailure(st);
        }
        continue;
      }
      if (round.plan.rows_size() > 0) {
        if (round.log) {
          round.log->in_flight = static_cast<int64_t>(in_flight_.size());
          router_->WriteRoundLog(FormatRoundLog(*round.log));
        }
        round.sent = std::chrono::steady_clock::now();
        if (absl::Status st = client_->Send(round.plan); !st.ok()) {
          OnGroupFailure(st);
          continue;
        }
        in_flight_.push_back(std::move(round));
        continue;
      }
      if (in_flight_.empty()) continue;
    }
    absl::StatusOr<v1::RoundResult> r = client_->Receive();
    if (!r.ok()) {
      OnGroupFailure(r.status());
      continue;
    }
    const auto done = std::chrono::steady_clock::now();
    InFlightRound round = std::move(in_flight_.front());
    in_flight_.pop_front();
    auto us = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
    };
    const double busy_us = RoundBusyUs(us(round.sent), us(previous_done), us(done));
    previous_done = done;
    absl::MutexLock l(&mu_);
    if (r->round_id() != round.plan.round_id()) {
      RL_LOG(ERROR) << "worker group " << index_ << " answered round " << r->round_id()
                    << " where round " << round.plan.round_id() << " was due";
    }
    metrics_.rounds->Increment();
    metrics_.round_duration_s->Observe(Seconds(done - round.sent));
    ApplyResult(round, *r, busy_us);
    UpdateGauges();
  }
  in_flight_.clear();
  absl::MutexLock l(&mu_);
  FailAll(absl::UnavailableError("the router is shutting down"));
  ready_ = false;
  if (client_) client_->Close().IgnoreError();
}

void Router::Group::FailAll(const absl::Status& status) {
  for (auto& lane : lanes_) lane->req->Fail(status);
  for (Waiting& w : waiting_) w.req->Fail(status);
  lanes_.clear();
  waiting_.clear();
  pending_release_.clear();
}

void Router::Group::UpdateGauges() {
  if (metrics_.rounds == nullptr) return;
  int64_t live = 0;
  for (const auto& lane : lanes_) live += lane->gone ? 0 : 1;
  metrics_.lanes_running->Set(static_cast<double>(live));
  metrics_.lanes_waiting->Set(static_cast<double>(waiting_.size()));
  if (kv_) {
    const KvBlockStats st = kv_->stats();
    metrics_.kv_blocks_total->Set(static_cast<double>(st.num_blocks));
    metrics_.kv_blocks_used->Set(
        static_cast<double>(st.num_blocks - st.free_blocks - st.evictable_blocks));
  }
}

void Router::Group::Compact() {
  lanes_.erase(std::remove_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->gone; }),
               lanes_.end());
}

void Router::Group::ReleaseLane(Lane& lane) {
  kv_->Release(lane.id).IgnoreError();
  pending_release_.push_back(lane.id);
  lane.gone = true;
}

void Router::Group::Preempt(Lane& lane, v1::RoundPlan* plan) {
  RL_LOG(INFO) << "worker group " << index_ << ": KV pool full, preempting lane " << lane.id
               << " (request " << lane.req->p.request_id << ", choice " << lane.choice
               << "); it restarts from its prompt and "
               << lane.req->choices[lane.choice].generated.size() << " generated tokens";
  kv_->Release(lane.id).IgnoreError();
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane.id);
  row->set_release_lane(true);
  lane.gone = true;
  waiting_.push_front({lane.req, lane.choice});
  metrics_.preemptions->Increment();
}

bool Router::Group::WantsDecodeRow(const Lane& lane) const {
  const int64_t generated_before =
      lane.prompt_len - static_cast<int64_t>(lane.req->p.prompt.size());
  return TokensAfterPlannedRounds(generated_before, lane.prompt_len, lane.fed) <
         lane.req->p.max_tokens;
}

void Router::Group::AddRow(Lane& lane, int64_t chunk, InFlightRound* round) {
  v1::LaneStep* row = round->plan.add_rows();
  row->set_lane_id(lane.id);
  row->set_start_position(lane.fed);
  int64_t n;
  if (lane.fed >= lane.prompt_len) {
    // Decode: the worker feeds the token it sampled last.
    n = 1;
    row->set_use_last_sampled(true);
    row->set_sample_last(true);
  } else {
    n = chunk;
    prefilled_tokens_ += n;
    row->mutable_token_ids()->Add(lane.seq.begin() + lane.fed, lane.seq.begin() + lane.fed + n);
    row->set_sample_last(lane.fed + n == lane.prompt_len);
  }
  if (!lane.params_sent) {
    *row->mutable_sampling() = lane.req->p.sampling;
    row->set_choice_index(lane.choice);
    lane.params_sent = true;
  }
  absl::Span<const BlockId> table = *kv_->BlockTable(lane.id);
  const int64_t blocks = (lane.fed + n + block_size_ - 1) / block_size_;
  row->mutable_block_ids()->Add(table.begin(), table.begin() + blocks);
  lane.fed += n;
  lane.in_plan = true;
  round->fed_after.emplace_back(lane.id, lane.fed);
}

void Router::Group::BuildPlan(InFlightRound* round) {
  const RouterOptions& opt = router_->options_;
  v1::RoundPlan* plan = &round->plan;
  for (auto& lane : lanes_) lane->in_plan = false;
  for (LaneId id : pending_release_) {
    v1::LaneStep* row = plan->add_rows();
    row->set_lane_id(id);
    row->set_release_lane(true);
  }
  pending_release_.clear();

  // Cancelled or failed requests give their lanes and blocks back first.
  for (auto& lane : lanes_) {
    if (lane->req->dead()) {
      RL_LOG(DEBUG) << "dropping lane " << lane->id << " of request " << lane->req->p.request_id;
      lane->req->Account(&GroupMetrics::requests_cancelled);
      kv_->Release(lane->id).IgnoreError();
      v1::LaneStep* row = plan->add_rows();
      row->set_lane_id(lane->id);
      row->set_release_lane(true);
      lane->gone = true;
    }
  }
  Compact();
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [](const Waiting& w) {
                                  if (!w.req->dead()) return false;
                                  w.req->Account(&GroupMetrics::requests_cancelled);
                                  return true;
                                }),
                 waiting_.end());

  // Decode rows, oldest lane first; a lane that cannot grow takes blocks from
  // the youngest lane not yet in the round.
  int64_t decode_rows = 0;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (lane.gone || lane.fed < lane.prompt_len || !WantsDecodeRow(lane)) continue;
    bool ok = true;
    while (!kv_->AppendSlots(lane.id, lane.fed + 1).ok()) {
      std::vector<PreemptCandidate> c(lanes_.size());
      for (size_t j = 0; j < lanes_.size(); ++j) {
        c[j] = {lanes_[j]->admit_seq, lanes_[j]->in_plan || lanes_[j]->gone, true};
      }
      std::optional<size_t> v = PickPreemptionVictim(c);
      const bool alone =
          std::count_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return !l->gone; }) == 1;
      if (!v || alone) {
        lane.req->Fail(absl::ResourceExhaustedError(
            absl::StrCat("the KV pool (", kv_->num_blocks(), " blocks of ", block_size_,
                         " tokens) cannot hold this request's ", lane.fed + 1, " positions")));
        kv_->Release(lane.id).IgnoreError();
        v1::LaneStep* row = plan->add_rows();
        row->set_lane_id(lane.id);
        row->set_release_lane(true);
        lane.gone = true;
        ok = false;
        break;
      }
      Preempt(*lanes_[*v], plan);
      if (*v == i) {
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    AddRow(lane, 1, round);
    ++decode_rows;
  }

  double decode_attended = 0;
  for (const v1::LaneStep& row : plan->rows()) {
    decode_attended += AttendedPairs(row.start_position(),
                                     row.token_ids_size() + (row.use_last_sampled() ? 1 : 0));
  }
  int64_t prefill_start = 0;
  for (const auto& lp : lanes_) {
    if (!lp->gone && !lp->in_plan && lp->fed < lp->prompt_len) {
      prefill_start = lp->fed;
      break;
    }
  }
  int64_t limit = PrefillTokenLimit(decode_rows, opt.round_token_budget, opt.itl_target_ms * 1000,
                                    cost_, opt.min_prefill_chunk, decode_attended, prefill_start);
  for (auto& lp : lanes_) {
    Lane& lane = *lp;
    if (limit <= 0) break;
    if (lane.gone || lane.in_plan || lane.fed >= lane.prompt_len) continue;
    const int64_t chunk = std::min(limit, lane.prompt_len - lane.fed);
    AddRow(lane, chunk, round);
    limit -= chunk;
  }

  // Admission: waiting choices in order, while the round has prefill room, a
  // lane is free and the pool has the prompt's blocks.
  auto live = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::count_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return !l->gone; });
  };
  while (limit > 0 && !waiting_.empty() && live() < opt.max_lanes) {
    Waiting w = waiting_.front();
    Choice& c = w.req->choices[w.choice];
    auto lane = std::make_unique<Lane>();
    lane->id = next_lane_id_++;
    lane->req = w.req;
    lane->choice = w.choice;
    lane->admit_seq = next_admit_seq_++;
    lane->seq = w.req->p.prompt;
    lane->seq.insert(lane->seq.end(), c.generated.begin(), c.generated.end());
    lane->prompt_len = static_cast<int64_t>(lane->seq.size());
    absl::StatusOr<int64_t> cached =
        kv_->Allocate(lane->id, lane->seq, static_cast<int64_t>(lane->seq.size()));
    if (!cached.ok()) {
      if (live() > 0) break;  // wait for running lanes to give blocks back
      // No amount of waiting helps: the client's request is too large for
      // this deployment, which is a 400, not a 429 to retry.
      w.req->Fail(absl::InvalidArgumentError(absl::StrCat(
          "prompt: ", lane->seq.size(), " tokens need more KV blocks than the ", kv_->num_blocks(),
          " of worker group ", index_, " (", block_size_, " tokens each)")));
      waiting_.pop_front();
      continue;
    }
    waiting_.pop_front();
    if (w.choice == 0 && w.req->cached_tokens < 0) {
      w.req->cached_tokens = *cached;
      metrics_.prompt_tokens->Increment(static_cast<double>(w.req->p.prompt.size()));
      metrics_.cached_prompt_tokens->Increment(static_cast<double>(*cached));
      metrics_.prefix_cache_hit_rate->Set(metrics_.cached_prompt_tokens->Value() /
                                          metrics_.prompt_tokens->Value());
    }
    lane->fed = *cached;
    lane->committed_blocks = *cached / block_size_;
    const int64_t chunk = std::min(limit, lane->prompt_len - lane->fed);
    AddRow(*lane, chunk, round);
    limit -= chunk;
    lanes_.push_back(std::move(lane));
  }
  Compact();
  // Only plans that go out take an id, so ids on the stream stay consecutive
  // although a pipelined loop often finds nothing to plan ahead.
  if (plan->rows_size() == 0) return;
  plan->set_round_id(++round_id_);
  if (!opt.round_log_path.empty()) LogEntry(round);
}

void Router::Group::LogEntry(InFlightRound* round) const {
  std::map<LaneId, const std::string*> request_of;
  for (const auto& lane : lanes_) request_of[lane->id] = &lane->req->p.request_id;
  RoundLogEntry e;
  e.round_id = round->plan.round_id();
  e.group = index_;
  e.token_budget = router_->options_.round_token_budget;
  for (const v1::LaneStep& row : round->plan.rows()) {
    RoundLogRow r;
    r.lane_id = row.lane_id();
    r.start_position = row.start_position();
    r.tokens = (row.use_last_sampled() ? 1 : 0) + row.token_ids_size();
    r.kind = r.tokens == 0            ? RoundLogRow::Kind::kRelease
             : row.use_last_sampled() ? RoundLogRow::Kind::kDecode
                                      : RoundLogRow::Kind::kPrefill;
    r.sample = row.sample_last();
    if (auto it = request_of.find(row.lane_id()); it != request_of.end()) {
      r.request_id = *it->second;
    }
    e.rows.push_back(std::move(r));
  }
  round->log = std::move(e);
}

void Router::Group::OnToken(Lane& lane, const v1::SampledToken& t) {
  RequestState& req = *lane.req;
  Choice& c = req.choices[lane.choice];
  if (c.finished || req.dead()) return;
  const Tokenizer& tok = *router_->tokenizer_;
  c.generated.push_back(t.token_id());
  ++req.completion_tokens;
  metrics_.generation_tokens->Increment();
  const bool loop_stop = LoopShouldStop(req, c, t.token_id());
  v1::GenerateResponse msg;
  msg.set_request_id(req.p.request_id);
  msg.set_index(c.index);
  msg.add_token_ids(t.token_id());
  if (req.p.logprobs) {
    v1::LogprobEntry* e = msg.add_logprobs();
    e->set_token_id(t.token_id());
    if (auto b = tok.TokenBytes(t.token_id()); b.ok()) e->set_token_bytes(*b);
    e->set_logprob(t.logprob());
    for (const v1::TokenLogprob& a : t.top_logprobs()) *e->add_top_logprobs() = a;
  }
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  const StopTokens::Kind kind = req.stop_tokens->Check(t.token_id());
  if (kind != StopTokens::Kind::kNone) {
    // The stop token's own text is not returned, but what it completes is.
    text = c.matcher->Feed(c.decoder->Flush()).text;
    if (!c.matcher->stopped()) text += c.matcher->Finish();
    finish = v1::FINISH_REASON_STOP;
    if (c.matcher->stopped()) {
      msg.set_stop_string(c.matcher->stop_strings()[c.matcher->matched_stop()]);
    } else {
      msg.set_stop_token_id(t.token_id());
    }
  } else {
    absl::StatusOr<std::string> piece = c.decoder->Add(t.token_id());
    StopMatcher::Output o = c.matcher->Feed(piece.ok() ? *piece : std::string());
    text = std::move(o.text);
    if (c.matcher->stopped()) {
      finish = v1::FINISH_REASON_STOP;
      msg.set_stop_string(c.matcher->stop_strings()[o.matched_stop]);
    } else if (loop_stop || static_cast<int>(c.generated.size()) >= req.p.max_tokens) {
      StopMatcher::Output rest = c.matcher->Feed(c.decoder->Flush());
      text += rest.text;
      if (c.matcher->stopped()) {
        finish = v1::FINISH_REASON_STOP;
        msg.set_stop_string(c.matcher->stop_strings()[rest.matched_stop]);
      } else {
        text += c.matcher->Finish();
        finish = loop_stop ? v1::FINISH_REASON_LOOP : v1::FINISH_REASON_LENGTH;
      }
    }
  }
  msg.set_text(std::move(text));
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    msg.set_finish_reason(finish);
    c.finished = true;
    ReleaseLane(lane);
    switch (finish) {
      case v1::FINISH_REASON_STOP:
        metrics_.finish_stop->Increment();
        break;
      case v1::FINISH_REASON_LOOP:
        metrics_.finish_loop->Increment();
        metrics_.loops_stopped->Increment();
        RL_LOG(WARNING) << "request " << req.p.request_id << " choice " << c.index
                        << ": the loop watchdog stopped it after " << c.generated.size()
                        << " tokens (finish reason loop)";
        break;
      default:
        metrics_.finish_length->Increment();
    }
    if (c.generated.size() >= 2) {
      metrics_.time_per_output_token_s->Observe(Seconds(c.last_token - c.first_token) /
                                                static_cast<double>(c.generated.size() - 1));
    }
    if (--req.choices_left == 0) {
      v1::Usage* u = msg.mutable_usage();
      u->set_prompt_tokens(static_cast<int32_t>(req.p.prompt.size()));
      u->set_completion_tokens(req.completion_tokens);
      u->set_cached_tokens(static_cast<int32_t>(std::max<int64_t>(0, req.cached_tokens)));
    }
  }
  req.queue->Push(std::move(msg));
  if (finish != v1::FINISH_REASON_UNSPECIFIED && req.choices_left == 0) {
    req.Account(&GroupMetrics::requests_finished);
    req.queue->Finish(absl::OkStatus());
  }
}

void Router::Group::NoteTokenTimes(Lane& lane, int count, Clock::time_point now) {
  RequestState& req = *lane.req;
  Choice& c = req.choices[lane.choice];
  if (c.finished || req.dead()) return;
  if (!req.any_token) {
    req.any_token = true;
    metrics_.time_to_first_token_s->Observe(Seconds(now - req.submitted));
  }
  if (c.generated.empty()) {
    c.first_token = now;
    --count;  // the first token has no gap
  } else if (count > 0) {
    const double gap = Seconds(now - c.last_token) / count;
    for (int i = 0; i < count; ++i) metrics_.inter_token_latency_s->Observe(gap);
  }
  c.last_token = now;
}

bool Router::Group::LoopShouldStop(const RequestState& req, Choice& c, int32_t token) {
  if (!c.loop) return false;
  const LoopDetector::Verdict v = c.loop->Feed(token);
  if (v.flagged_now) {
    metrics_.loops_detected->Increment();
    RL_LOG(WARNING) << "request " << req.p.request_id << " choice " << c.index
                    << ": loop detected, a cycle of " << v.period << " tokens repeats (after "
                    << c.generated.size() << " generated tokens)";
  }
  return v.should_stop;
}

void Router::Group::ApplyResult(const InFlightRound& round, const v1::RoundResult& result,
                                double round_us) {
  std::map<LaneId, Lane*> by_id;
  for (auto& lane : lanes_) {
    if (!lane->gone) by_id[lane->id] = lane.get();
  }
  if (result.error().code() != 0) {
    // A rejected plan changed nothing on the workers, but the lanes in it
    // were advanced here: they cannot continue consistently.
    RL_LOG(ERROR) << "worker group " << index_ << " rejected round " << result.round_id() << ": "
                  << result.error().message();
    for (const auto& [id, fed_after] : round.fed_after) {
      auto it = by_id.find(id);
      if (it == by_id.end()) continue;
      it->second->req->Fail(absl::InternalError(
          absl::StrCat("the workers rejected a round: ", result.error().message())));
    }
    return;
  }
  int64_t tokens = 0;
  double attended = 0;
  for (const v1::LaneStep& row : round.plan.rows()) {
    const int64_t n = (row.use_last_sampled() ? 1 : 0) + row.token_ids_size();
    tokens += n;
    attended += AttendedPairs(row.start_position(), n);
  }
  cost_.Observe(tokens, round_us, attended);
  metrics_.round_tokens->Observe(static_cast<double>(tokens));
  // Commit before the tokens can finish and release a lane, so a finished
  // request's blocks stay cached for a resend. Only up to what this round
  // fed: a later round in flight has not written its positions yet.
  for (const auto& [id, fed_after] : round.fed_after) {
    auto it = by_id.find(id);
    if (it == by_id.end()) continue;
    Lane& lane = *it->second;
    const int64_t full = fed_after / block_size_;
    if (full <= lane.committed_blocks) continue;
    if (static_cast<int64_t>(lane.seq.size()) < fed_after) {
      // Results arrive in plan order, so every token fed is known by now.
      RL_LOG(ERROR) << "lane " << lane.id << " fed " << fed_after << " positions but knows "
                    << lane.seq.size() << " tokens; not committing";
      continue;
    }
    absl::Status st = kv_->CommitFullBlocks(
        lane.id, absl::MakeConstSpan(lane.seq.data(), static_cast<size_t>(fed_after)));
    if (!st.ok()) RL_LOG(ERROR) << "commit of lane " << lane.id << ": " << st;
    lane.committed_blocks = full;
  }
  const Clock::time_point now = Clock::now();
  for (const v1::LaneOutput& o : result.outputs()) {
    auto it = by_id.find(o.lane_id());
    // A lane that finished or was dropped while this round was in flight:
    // what it sampled is past its end.
    if (it == by_id.end() || it->second->gone) continue;
    if (o.tokens_size() > 0) NoteTokenTimes(*it->second, o.tokens_size(), now);
    for (const v1::SampledToken& t : o.tokens()) {
      it->second->seq.push_back(t.token_id());
      OnToken(*it->second, t);
      if (it->second->gone) break;
    }
  }
  Compact();
}

void Router::WriteRoundLog(const std::string& line) {
  absl::MutexLock l(&log_mu_);
  if (!round_log_.is_open()) return;
  round_log_ << line << '\n';
  round_log_.flush();
}

// ---------------------------------------------------------------------------
// Router

Router::Router(RouterOptions options, std::unique_ptr<Tokenizer> tokenizer)
    : options_(std::move(options)),
      tokenizer_(std::move(tokenizer)),
      created_unix_s_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(RouterOptions options,
                                                       std::unique_ptr<Tokenizer> tokenizer) {
  if (!tokenizer) return absl::InvalidArgumentError("no tokenizer");
  if (options.groups.empty()) return absl::InvalidArgumentError("no worker groups");
  for (const auto& g : options.groups) {
    if (g.empty()) return absl::InvalidArgumentError("a worker group without addresses");
  }
  if (options.max_lanes < 1 || options.max_lanes >= options.round_token_budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_lanes must be in [1, round_token_budget) so that a round holding every decode row "
        "still has room for a prompt chunk; got ",
        options.max_lanes, " with a budget of ", options.round_token_budget));
  }
  if (options.max_waiting < 1) return absl::InvalidArgumentError("max_waiting must be >= 1");
  if (auto loop = LoopDetector::Create(options.loop_watchdog); !loop.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("loop watchdog: ", loop.status().message()));
  }
  if (options.min_prefill_chunk < 1) {
    return absl::InvalidArgumentError("min_prefill_chunk must be >= 1");
  }
  if (options.pipeline_depth < 1 || options.pipeline_depth > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_depth must be 1 or 2, got ", options.pipeline_depth));
  }
  std::unique_ptr<Router> r(new Router(std::move(options), std::move(tokenizer)));
  if (!r->options_.round_log_path.empty()) {
    absl::MutexLock l(&r->log_mu_);
    r->round_log_.open(r->options_.round_log_path, std::ios::out | std::ios::trunc);
    if (!r->round_log_) {
      return absl::InvalidArgumentError(
          absl::StrCat("round_log: cannot write ", r->options_.round_log_path));
    }
  }
  for (size_t i = 0; i < r->options_.groups.size(); ++i) {
    r->groups_.push_back(std::make_unique<Group>(r.get(), i, r->options_.groups[i]));
  }
  for (auto& g : r->groups_) g->Start();
  return r;
}

Router::~Router() {
  for (auto& g : groups_) g->Stop();
}

void Router::SetModel(const v1::WorkerInfo& info) {
  absl::MutexLock l(&info_mu_);
  if (model_) return;
  ModelDescription m;
  m.model_id = options_.model_id.empty() ? info.model_id() : options_.model_id;
  m.max_context_tokens = info.max_context_tokens();
  m.vocab_size = info.vocab_size();
  m.eos_ids = tokenizer_->StopIds();
  if (info.eos_token_id() >= 0) m.eos_ids.push_back(info.eos_token_id());
  model_ = std::move(m);
}

std::optional<ModelDescription> Router::model() const {
  absl::MutexLock l(&info_mu_);
  return model_;
}

std::vector<GroupState> Router::groups() const {
  std::vector<GroupState> out;
  for (const auto& g : groups_) out.push_back(g->State());
  return out;
}

bool Router::any_ready() const {
  for (const auto& g : groups_) {
    if (g->State().ready) return true;
  }
  return false;
}

namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

absl::Status CheckUtf8(const std::string& field, std::string_view text) {
  const size_t bad = utf8::FirstInvalid(text);
  if (bad == text.size()) return absl::OkStatus();
  return Invalid(field, absl::StrCat("not valid UTF-8 (byte ", bad, " of ", text.size(), ")"));
}

namespace {}  // namespace

absl::StatusOr<std::vector<int32_t>> Router::EncodeChat(const v1::ChatMessages& chat) const {
  std::vector<ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    if (absl::Status st = CheckUtf8(absl::StrCat("messages[", i, "].content"), m.content());
        !st.ok()) {
      return st;
    }
    messages.push_back({m.role(), m.content()});
  }
  absl::StatusOr<std::string> text = options_.chat_template.Render(messages, true);
  if (!text.ok()) return Invalid("messages", std::string(text.status().message()));
  // Templates that spell out their framing tokens (Llama's BOS, GLM's
  // prefix) must not get another; the plain one relies on the tokenizer's.
  const bool add_special = options_.chat_template.family() == ChatTemplateFamily::kPlain;
  auto ids = tokenizer_->Encode(*text, add_special);
  if (!ids.ok()) return Invalid("messages", std::string(ids.status().message()));
  return ids;
}

absl::StatusOr<v1::TokenizeResponse> Router::Tokenize(const v1::TokenizeRequest& request) const {
  std::optional<ModelDescription> m = model();
  if (!request.model().empty() && m && request.model() != m->model_id) {
    return Invalid("model", absl::StrCat("unknown model '", request.model(),
                                         "'; this router serves '", m->model_id, "'"));
  }
  absl::StatusOr<std::vector<int32_t>> ids;
  if (request.input_case() == v1::TokenizeRequest::kChat) {
    ids = EncodeChat(request.chat());
  } else {
    if (absl::Status st = CheckUtf8("text", request.text()); !st.ok()) return st;
    ids = tokenizer_->Encode(request.text(), request.add_special_tokens());
    if (!ids.ok()) return Invalid("text", std::string(ids.status().message()));
  }
  if (!ids.ok()) return ids.status();
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids->begin(), ids->end());
  response.set_max_context_tokens(m ? m->max_context_tokens : 0);
  return response;
}

absl::StatusOr<PreparedRequest> Router::Prepare(const v1::GenerateRequest& request) const {
  std::optional<ModelDescription> m = model();
  if (!m) {
    std::vector<std::string> why;
    for (const auto& g : groups_) why.push_back(g->Describe());
    return absl::UnavailableError(absl::StrCat("no worker group has connected yet (",
                                               absl::StrJoin(why, "; "), "); retry later"));
  }
  if (!request.model().empty() && request.model() != m->model_id) {
    return Invalid("model", absl::StrCat("unknown model '", request.model(),
                                         "'; this router serves '", m->model_id, "'"));
  }
  PreparedRequest p;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= m->vocab_size) {
          return Invalid(
              absl::StrCat("prompt.token_ids[", i, "]"),
              absl::StrCat(ids[i], " is outside the vocabulary [0, ", m->vocab_size, ")"));
        }
      }
      p.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      auto ids = EncodeChat(request.chat());
      if (!ids.ok()) return ids.status();
      p.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kText:
    case v1::GenerateRequest::PROMPT_NOT_SET: {
      if (absl::Status st = CheckUtf8("prompt.text", request.text()); !st.ok()) return st;
      auto ids = tokenizer_->Encode(request.text(), /*add_special_tokens=*/true);
      if (!ids.ok()) return Invalid("prompt.text", std::string(ids.status().message()));
      p.prompt = std::move(*ids);
      break;
    }
  }
  if (p.prompt.empty()) {
    return Invalid("prompt", "empty, and the model's tokenizer adds no BOS token to start from");
  }
  const int64_t len = static_cast<int64_t>(p.prompt.size());
  if (len >= m->max_context_tokens) {
    return Invalid("prompt",
                   absl::StrCat(len, " tokens leave no room to generate in the context of ",
                                m->max_context_tokens, " tokens"));
  }

  // Sampling: the same ranges the workers' sampler enforces, checked here so
  // that the client learns which field is wrong.
  const v1::SamplingParams& s = request.sampling();
  const float temperature = s.has_temperature() ? s.temperature() : options_.default_temperature;
  if (!(std::isfinite(temperature) && temperature >= 0)) {
    return Invalid("sampling.temperature",
                   absl::StrCat("must be finite and >= 0, got ", temperature));
  }
  const float top_p = s.has_top_p() ? s.top_p() : 1.0f;
  if (!(top_p > 0 && top_p <= 1)) {
    return Invalid("sampling.top_p", absl::StrCat("must be in (0, 1], got ", top_p));
  }
  if (s.top_k() < 0)
    return Invalid("sampling.top_k", absl::StrCat("must be >= 0, got ", s.top_k()));
  if (!(s.min_p() >= 0 && s.min_p() <= 1)) {
    return Invalid("sampling.min_p", absl::StrCat("must be in [0, 1], got ", s.min_p()));
  }
  if (!(s.presence_penalty() >= -2 && s.presence_penalty() <= 2)) {
    return Invalid("sampling.presence_penalty",
                   absl::StrCat("must be in [-2, 2], got ", s.presence_penalty()));
  }
  if (!(s.frequency_penalty() >= -2 && s.frequency_penalty() <= 2)) {
    return Invalid("sampling.frequency_penalty",
                   absl::StrCat("must be in [-2, 2], got ", s.frequency_penalty()));
  }
  if (s.top_logprobs() < 0 || s.top_logprobs() > 20) {
    return Invalid("sampling.top_logprobs",
                   absl::StrCat("must be in [0, 20], got ", s.top_logprobs()));
  }
  if (request.n() < 0 || request.n() > options_.max_choices) {
    return Invalid("n",
                   absl::StrCat("must be in [1, ", options_.max_choices, "], got ", request.n()));
  }
  p.n = request.n() == 0 ? 1 : request.n();
  if (request.has_max_tokens() && request.max_tokens() <= 0) {
    return Invalid("max_tokens", absl::StrCat("must be >= 1, got ", request.max_tokens()));
  }
  const int64_t room = m->max_context_tokens - len;
  // An explicit max_tokens the context cannot hold is the client's mistake
  // (as in vLLM); silently generating fewer would look like a model stop.
  if (request.has_max_tokens() && request.max_tokens() > room) {
    return Invalid("max_tokens",
                   absl::StrCat(request.max_tokens(), " tokens after a prompt of ", len,
                                " tokens exceed the model's context of ", m->max_context_tokens,
                                " tokens (at most ", room, " can be generated)"));
  }
  int64_t max_tokens = request.has_max_tokens()          ? request.max_tokens()
                       : options_.max_tokens_default > 0 ? options_.max_tokens_default
                                                         : room;
  p.max_tokens = static_cast<int>(std::min(max_tokens, room));

  for (int i = 0; i < request.stop_size(); ++i) {
    if (absl::Status st = CheckUtf8(absl::StrCat("stop[", i, "]"), request.stop(i)); !st.ok()) {
      return st;
    }
  }
  p.stop.assign(request.stop().begin(), request.stop().end());
  if (auto sm = StopMatcher::Create(p.stop); !sm.ok()) {
    return Invalid("stop", std::string(sm.status().message()));
  }
  p.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  if (auto st = StopTokens::Create(p.stop_token_ids, {}, false, m->vocab_size); !st.ok()) {
    return Invalid("stop_token_ids", std::string(st.status().message()));
  }
  p.ignore_eos = request.ignore_eos();
  p.default_temperature = !s.has_temperature();
  p.loop_watchdog =
      request.has_loop_watchdog() ? request.loop_watchdog() : options_.loop_watchdog.enabled;
  p.logprobs = request.logprobs() || s.logprobs() || s.top_logprobs() > 0;
  p.echo = request.echo();
  p.session_id = request.session_id();
  p.request_id = request.request_id().empty() ? absl::StrCat("req-", next_request_id_.fetch_add(1))
                                              : request.request_id();

  p.sampling = s;
  p.sampling.set_temperature(temperature);
  p.sampling.set_top_p(top_p);
  p.sampling.set_logprobs(p.logprobs);
  SeedParams sp;
  sp.temperature = temperature;
  sp.top_k = s.top_k();
  sp.top_p = top_p;
  sp.min_p = s.min_p();
  sp.presence_penalty = s.presence_penalty();
  sp.frequency_penalty = s.frequency_penalty();
  p.sampling.set_seed(ResolveSeed(s.has_seed() ? std::optional<uint64_t>(s.seed()) : std::nullopt,
                                  options_.seed_policy, p.prompt, sp, [] {
                                    std::random_device rd;
                                    return (static_cast<uint64_t>(rd()) << 32) | rd();
                                  }));
  return p;
}

absl::Status Router::Submit(PreparedRequest request, std::shared_ptr<ResponseQueue> queue) {
  std::optional<ModelDescription> m = model();
  if (!m) return absl::UnavailableError("no worker group has connected yet");
  auto req = std::make_shared<RequestState>();
  req->queue = std::move(queue);
  auto stops =
      StopTokens::Create(request.stop_token_ids, m->eos_ids, request.ignore_eos, m->vocab_size);
  if (!stops.ok()) return Invalid("stop_token_ids", std::string(stops.status().message()));
  req->stop_tokens = std::move(*stops);
  req->choices.resize(request.n);
  req->choices_left = request.n;
  for (int i = 0; i < request.n; ++i) {
    Choice& c = req->choices[i];
    c.index = i;
    c.decoder = std::make_unique<IncrementalDecoder>(*tokenizer_);
    // Decoding the prompt first puts the decoder in the state the completion
    // continues from (llama2.c drops the space of a token after BOS).
    std::string prompt_text;
    for (int32_t id : request.prompt) {
      if (auto piece = c.decoder->Add(id); piece.ok()) prompt_text += *piece;
    }
    auto matcher = StopMatcher::Create(request.stop);
    if (!matcher.ok()) return Invalid("stop", std::string(matcher.status().message()));
    c.matcher = std::move(*matcher);
    if (request.loop_watchdog) {
      LoopWatchdogOptions lo = options_.loop_watchdog;
      lo.enabled = true;
      auto loop = LoopDetector::Create(lo);
      if (!loop.ok()) return loop.status();
      c.loop = std::move(*loop);
    }
    if (request.echo) {
      v1::GenerateResponse msg;
      msg.set_request_id(request.request_id);
      msg.set_index(i);
      msg.mutable_token_ids()->Add(request.prompt.begin(), request.prompt.end());
      msg.set_text(prompt_text);
      req->queue->Push(std::move(msg));
    }
  }
  req->p = std::move(request);

  absl::MutexLock l(&mu_);
  std::optional<size_t> chosen;
  if (!req->p.session_id.empty()) {
    auto it = sessions_.find(req->p.session_id);
    if (it != sessions_.end() && groups_[it->second]->ProbePrefix({}).ready) chosen = it->second;
  }
  if (!chosen) {
    Group::Probe best;
    for (size_t i = 0; i < groups_.size(); ++i) {
      Group::Probe p = groups_[i]->ProbePrefix(req->p.prompt);
      if (!p.ready) continue;
      if (!chosen || p.cached_tokens > best.cached_tokens ||
          (p.cached_tokens == best.cached_tokens && p.load < best.load)) {
        chosen = i;
        best = p;
      }
    }
  }
  if (!chosen) {
    std::vector<std::string> why;
    for (const auto& g : groups_) why.push_back(g->Describe());
    return absl::UnavailableError(
        absl::StrCat("no worker group is ready (", absl::StrJoin(why, "; "), "); retry later"));
  }
  if (absl::Status st = groups_[*chosen]->Enqueue(req); !st.ok()) return st;
  if (!req->p.session_id.empty()) {
    // Forget sessions wholesale rather than track their ends: losing one only
    // costs a cache-aware placement instead of a sticky one.
    if (sessions_.size() >= 100000) sessions_.clear();
    sessions_[req->p.session_id] = *chosen;
  }
  return absl::OkStatus();
}

}  // namespace ringlane::router
