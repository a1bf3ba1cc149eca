#include "router/sched/group_loop.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "router/client/round_builder.h"
#include "router/request/choice_output.h"
#include "router/sched/applier.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

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

double Us(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

}  // namespace

// Turns sampled tokens into the client's messages.
class GroupLoop::Sink final : public ResultSink {
 public:
  Sink(const Tokenizer& tokenizer, Clock::time_point now, bool keep_finished,
       prometheus::Counter* sampling_rows, std::function<void(absl::Span<const int64_t>)> verified)
      : tokenizer_(tokenizer),
        now_(now),
        keep_finished_(keep_finished),
        sampling_rows_(sampling_rows),
        verified_(std::move(verified)) {}
  void OnSamplingRows(int64_t rows) override {
    if (sampling_rows_ != nullptr) sampling_rows_->Increment(static_cast<double>(rows));
  }
  void OnVerified(absl::Span<const int64_t> accepted_by_row) override {
    if (verified_) verified_(accepted_by_row);
  }
  void OnLaneTokens(Lane& lane, int count) override {
    NoteTokenTimes(*lane.req, lane.choice, count, now_);
  }
  bool OnToken(Lane& lane, const v1::SampledToken& t) override {
    const bool finished = OnSampledToken(*lane.req, lane.choice, t, tokenizer_);
    if (finished && keep_finished_) {
      finished_.push_back({lane.seq, static_cast<int64_t>(lane.req->p.prompt.size())});
    }
    return finished;
  }
  // Sequences of the choices that finished (with keep_finished), and their
  // prompt lengths: the drafter learns from them once the round's state is
  // settled, not while the client already has its last token.
  std::vector<std::pair<std::vector<int32_t>, int64_t>> finished_;

 private:
  const Tokenizer& tokenizer_;
  const Clock::time_point now_;
  const bool keep_finished_;
  prometheus::Counter* const sampling_rows_;
  const std::function<void(absl::Span<const int64_t>)> verified_;
};

GroupLoop::GroupLoop(GroupLoopOptions options, GroupLoopHooks hooks, const Tokenizer* tokenizer)
    : options_(std::move(options)),
      hooks_(std::move(hooks)),
      tokenizer_(tokenizer),
      tiering_(options_.kv_tiering, &mu_) {}

GroupLoop::~GroupLoop() { Stop(); }

void GroupLoop::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void GroupLoop::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

GroupLoop::Probe GroupLoop::ProbePrefix(absl::Span<const int32_t> prompt) const {
  absl::MutexLock l(&mu_);
  Probe p;
  p.ready = ready_ && kv_ != nullptr;
  if (!p.ready) return p;
  // Whole blocks only: a hit inside a block saves less than a block of
  // prefill, and BOS alone would pull every prompt to the group that saw
  // one first, whatever its load.
  const int64_t until = kv_->ChunkedUntil(static_cast<int64_t>(prompt.size()));
  p.cached_tokens = static_cast<int64_t>(kv_->MatchPrefix(prompt, until).block_ids.size()) *
                    kv_->block_size_tokens();
  p.load = static_cast<int64_t>(s_.lanes.size() + s_.waiting.size());
  return p;
}

absl::Status GroupLoop::Enqueue(std::shared_ptr<RequestState> req) {
  absl::MutexLock l(&mu_);
  if (!ready_) return absl::UnavailableError(NotReadyMessage());
  req->metrics = &metrics_;
  req->submitted = Clock::now();
  const int64_t n = static_cast<int64_t>(req->choices.size());
  if (!AdmitToQueue(static_cast<int64_t>(s_.waiting.size()), n, options_.max_waiting)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the router is overloaded: ", s_.waiting.size(),
                     " choices already wait for a lane on worker group ", options_.index,
                     " (--max_waiting=", options_.max_waiting, "); retry later"));
  }
  for (int i = 0; i < n; ++i) s_.waiting.push_back({req, i});
  if (req->p.default_temperature) metrics_.requests_default_temperature->Increment();
  if (req->p.grammar) metrics_.constrained_choices->Increment(static_cast<double>(n));
  UpdateGauges();
  return absl::OkStatus();
}

GroupState GroupLoop::State() const {
  absl::MutexLock l(&mu_);
  GroupState s;
  s.ready = ready_;
  s.status = status_;
  s.epoch = epoch_;
  s.lanes = static_cast<int>(s_.lanes.size());
  s.waiting = static_cast<int>(s_.waiting.size());
  s.prefilled_tokens = prefilled_tokens_;
  if (kv_) s.kv = kv_->stats();
  return s;
}

std::string GroupLoop::Describe() const {
  absl::MutexLock l(&mu_);
  return NotReadyMessage();
}

std::string GroupLoop::NotReadyMessage() const {
  return absl::StrCat("worker group ", options_.index, " (", absl::StrJoin(options_.addresses, ","),
                      ") is not ready: ", status_.empty() ? "connecting" : status_);
}

bool GroupLoop::Connect() {
  auto c = hooks_.connect(options_.addresses, options_.connect_timeout);
  if (!c.ok()) {
    absl::MutexLock l(&mu_);
    if (status_ != c.status().message()) {
      RL_LOG(WARNING) << "worker group " << options_.index << " not ready: " << c.status();
    }
    status_ = std::string(c.status().message());
    return false;
  }
  const v1::WorkerInfo& info = (*c)->info();
  KvBlockManager::Options o;
  o.num_blocks = info.kv_pool_blocks();
  o.identity.model_id = info.model_id();
  o.identity.model_revision = info.model_revision();
  o.identity.kv_dtype = DTypeName(info.kv_dtype());
  o.identity.block_size_tokens = info.block_size_tokens();
  o.identity.tp_world_size = info.tp_world_size();
  // A model with recurrent layers resumes only where its state was kept: a
  // prefix hit ends at a state checkpoint (none without them), on a block
  // boundary; the kvstore keeps blocks with their checkpoints (so only with
  // checkpoints), and no more lanes than the workers have state slots.
  const bool recurrent = info.state_slots() > 0;
  const bool tiered = (!recurrent || info.state_checkpoints() > 0) &&
                      !info.kvstore_address().empty() &&
                      (options_.kv_tiering.offload || options_.kv_tiering.restore);
  if (tiered) o.max_recorded_registrations = options_.kv_tiering.max_pending_offloads;
  o.reuse_partial_blocks = options_.partial_block_reuse && info.kv_block_copies() && !recurrent;
  o.reuse_prefixes = !recurrent || info.state_checkpoints() > 0;
  if (recurrent) {
    o.state_checkpoints = info.state_checkpoints();
    o.checkpoint_interval = info.state_checkpoint_interval();
    o.linear_chunk = info.linear_chunk();
  }
  auto kv = KvBlockManager::Create(o);
  if (!kv.ok()) {
    absl::MutexLock l(&mu_);
    status_ = absl::StrCat("bad KV geometry from the workers: ", kv.status().message());
    return false;
  }
  absl::StatusOr<GroupMetrics> metrics = hooks_.on_connected(info);
  if (!metrics.ok()) {
    absl::MutexLock l(&mu_);
    status_ = std::string(metrics.status().message());
    RL_LOG(ERROR) << "worker group " << options_.index << ": " << status_;
    return false;
  }
  RL_LOG(INFO) << "worker group " << options_.index << " ready: " << info.model_id() << ", TP"
               << info.tp_world_size() << ", epoch " << info.group_epoch() << ", "
               << info.kv_pool_blocks() << " KV blocks of " << info.block_size_tokens() << " tokens"
               << (tiered ? ", kvstore " + info.kvstore_address() : "");
  absl::MutexLock l(&mu_);
  if (metrics_.rounds == nullptr) metrics_ = *metrics;
  kv_ = std::move(*kv);
  planner_ = options_.planner;
  if (recurrent) {
    planner_.max_lanes = std::min(planner_.max_lanes, info.state_slots());
    RL_LOG(INFO) << "worker group " << options_.index << ": recurrent layers, "
                 << info.state_slots() << " state slots of " << info.state_bytes_per_slot()
                 << " bytes; at most " << planner_.max_lanes << " lanes; "
                 << info.state_checkpoints() << " state checkpoints every "
                 << info.state_checkpoint_interval() << " positions, prefix hits resume from them"
                 << (info.linear_chunk() > 0
                         ? absl::StrCat("; prefill in KDA chunks of ", info.linear_chunk())
                         : "")
                 << (tiered ? " and the kvstore keeps them with their blocks" : "");
  }
  epoch_ = info.group_epoch();
  ready_ = true;
  metrics_.group_ready->Set(1);
  metrics_.group_epoch->Set(static_cast<double>(epoch_));
  UpdateGauges();
  status_.clear();
  client_ = std::move(*c);
  last_applied_round_ = s_.round_id;
  tiering_.Connected(client_, tiered, &metrics_);
  return true;
}

void GroupLoop::OnGroupFailure(const absl::Status& status) {
  RL_LOG(ERROR) << "worker group " << options_.index << " failed: " << status;
  in_flight_.clear();
  absl::MutexLock l(&mu_);
  FailAll(absl::UnavailableError(absl::StrCat("worker group ", options_.index, " failed: ",
                                              status.message(), "; the request was lost, retry")));
  // A re-formed group has lost its KV contents: the ledger starts over.
  kv_->Reset();
  ready_ = false;
  metrics_.group_ready->Set(0);
  UpdateGauges();
  status_ = std::string(status.message());
  client_.reset();
}

void GroupLoop::Loop() {
  const size_t depth = static_cast<size_t>(options_.pipeline_depth);
  // When the last result arrived: a round sent ahead starts only then.
  auto previous_done = Clock::now();
  for (;;) {
    if (!client_) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) break;
      }
      if (!Connect()) {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(options_.reconnect_pause));
      }
      continue;
    }
    if (in_flight_.size() < depth) {
      InFlight round;
      bool idle = false;
      std::string log_line;
      {
        absl::MutexLock l(&mu_);
        // With a round in flight there is always its result to wait for;
        // the round runs behind it only if it has rows that are not void.
        round.pipelined = std::any_of(in_flight_.begin(), in_flight_.end(), [](const InFlight& f) {
          return std::any_of(f.round.rows.begin(), f.round.rows.end(),
                             [](const PlannedRow& r) { return !r.voided && r.tokens > 0; });
        });
        round.after_idle = in_flight_.empty() && !HasWork();
        if (in_flight_.empty() &&
            !mu_.AwaitWithTimeout(absl::Condition(this, &GroupLoop::HasWork), absl::Seconds(1))) {
          idle = true;
        }
        if (stop_) break;
        if (!idle) {
          tiering_.Poll(s_, *kv_, s_.round_id, last_applied_round_);
          PlanRound(s_, *kv_, cost_, planner_, hooks_.drafter, &round.round);
          tiering_.AddOffloads(*kv_, &round.round.plan);
          RecordPlan(round.round);
          if (hooks_.round_log && round.round.plan.rows_size() > 0) {
            log_line = LogLine(round.round, static_cast<int64_t>(in_flight_.size()));
          }
        }
      }
      if (idle) {
        // No round would reveal a dead or re-formed rank of an idle group:
        // ask the ranks, so that placement stops choosing it.
        if (absl::Status st = client_->Check(std::chrono::seconds(2)); !st.ok()) {
          OnGroupFailure(st);
        }
        continue;
      }
      if (round.round.plan.rows_size() > 0) {
        if (!log_line.empty()) hooks_.round_log(log_line);
        round.sent = Clock::now();
        if (absl::Status st = client_->Send(round.round.plan); !st.ok()) {
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
    const auto done = Clock::now();
    InFlight round = std::move(in_flight_.front());
    in_flight_.pop_front();
    const double busy_us = RoundBusyUs(Us(round.sent), Us(previous_done), Us(done));
    // Rounds that fed nothing (release rows only) cost the workers nothing:
    // their period over worker time says nothing of a round's.
    std::optional<RoundObservation> observed;
    if (hooks_.drafter != nullptr && !round.after_idle && !round.round.rows.empty()) {
      observed.emplace();
      observed->pipelined = round.pipelined;
      observed->period_us = Us(done) - Us(previous_done);
      observed->worker_us = static_cast<double>(r->compute_time_us() + r->collective_time_us());
      observed->draft_tag = round.round.draft.tag;
      observed->prefilled_tokens = round.round.prefilled_tokens;
    }
    previous_done = done;
    absl::MutexLock l(&mu_);
    if (r->round_id() != round.round.plan.round_id()) {
      RL_LOG(ERROR) << "worker group " << options_.index << " answered round " << r->round_id()
                    << " where round " << round.round.plan.round_id() << " was due";
    }
    last_applied_round_ = round.round.plan.round_id();
    metrics_.rounds->Increment();
    metrics_.round_duration_s->Observe(Seconds(done - round.sent));
    Apply(round, *r, busy_us, observed ? &*observed : nullptr);
    UpdateGauges();
  }
  in_flight_.clear();
  absl::MutexLock l(&mu_);
  FailAll(absl::UnavailableError("the router is shutting down"));
  ready_ = false;
  if (client_) client_->Close().IgnoreError();
}

void GroupLoop::RecordPlan(const PlannedRound& round) {
  prefilled_tokens_ += round.prefilled_tokens;
  if (metrics_.spec_depth != nullptr) {  // set only for groups that draft
    for (const PlannedRow& row : round.rows) {
      if (row.decode) metrics_.spec_depth->Observe(static_cast<double>(row.drafts));
    }
    if (round.draft.tag >= 0) metrics_.spec_rounds[round.draft.drafting_allowed]->Increment();
  }
  if (round.preemptions > 0)
    metrics_.preemptions->Increment(static_cast<double>(round.preemptions));
  if (round.plan.block_copies_size() > 0 && metrics_.kv_block_copies != nullptr) {
    metrics_.kv_block_copies->Increment(static_cast<double>(round.plan.block_copies_size()));
  }
  if (round.admitted_any) {
    metrics_.prompt_tokens->Increment(static_cast<double>(round.admitted_prompt_tokens));
    metrics_.cached_prompt_tokens->Increment(static_cast<double>(round.admitted_cached_tokens));
    metrics_.prefix_cache_hit_rate->Set(metrics_.cached_prompt_tokens->Value() /
                                        metrics_.prompt_tokens->Value());
  }
}

std::string GroupLoop::LogLine(const PlannedRound& round, int64_t in_flight) const {
  std::map<LaneId, const std::string*> request_of;
  for (const auto& lane : s_.lanes) request_of[lane->id] = &lane->req->p.request_id;
  RoundLogEntry e;
  e.round_id = round.plan.round_id();
  e.group = options_.index;
  e.token_budget = options_.planner.round_token_budget;
  e.in_flight = in_flight;
  for (const v1::LaneStep& row : round.plan.rows()) {
    RoundLogRow r;
    r.lane_id = row.lane_id();
    r.start_position = row.start_position();
    r.tokens = RowTokens(row);
    r.kind = r.tokens == 0            ? RoundLogRow::Kind::kRelease
             : row.use_last_sampled() ? RoundLogRow::Kind::kDecode
                                      : RoundLogRow::Kind::kPrefill;
    r.sample = row.sample_last() || row.verify_offsets_size() > 0;
    if (auto it = request_of.find(row.lane_id()); it != request_of.end()) {
      r.request_id = *it->second;
    }
    e.rows.push_back(std::move(r));
  }
  return FormatRoundLog(e);
}

void GroupLoop::Apply(const InFlight& round, const v1::RoundResult& result, double busy_us,
                      RoundObservation* observed) {
  // The speculation counters are recorded before a client can have its last
  // token (and read /metrics): drafted == accepted + rejected at any read.
  Sink sink(*tokenizer_, Clock::now(), hooks_.drafter != nullptr, metrics_.sampling_rows,
            [&](absl::Span<const int64_t> accepted)
                ABSL_NO_THREAD_SAFETY_ANALYSIS { RecordVerifyMetrics(round.round, accepted); });
  std::vector<PlannedRound*> later;
  for (InFlight& f : in_flight_) later.push_back(&f.round);
  const AppliedRound a = ApplyRoundResult(round.round, result, s_, *kv_, sink, later);
  // A client may read the metrics the moment it has its last token.
  UpdateGauges();
  if (hooks_.drafter != nullptr) {
    hooks_.drafter->Sweep(s_);
    for (const auto& [seq, prompt_len] : sink.finished_)
      hooks_.drafter->OnFinished(seq, prompt_len);
    DeliverProposals(result);
  }
  if (result.error().code() != 0) return;
  // Proposing is priced per draft token (the drafter's), not per fed one.
  const double propose_us = static_cast<double>(result.draft_propose_time_us());
  if (hooks_.drafter != nullptr && result.draft_tokens_proposed() > 0) {
    hooks_.drafter->ObserveDraftCost(propose_us, result.draft_tokens_proposed());
  }
  const double worker_us =
      static_cast<double>(result.compute_time_us() + result.collective_time_us()) - propose_us;
  cost_.Observe(a.tokens, std::max(0.0, busy_us - propose_us), a.attended,
                std::max(0.0, worker_us));
  metrics_.round_tokens->Observe(static_cast<double>(a.tokens));
  RecordVerify(round.round, a);
  if (observed != nullptr) {
    observed->tokens = a.sampling_rows;
    for (int64_t accepted : a.accepted_by_row) observed->tokens += accepted;
    hooks_.drafter->ObserveRound(*observed);
  }
}

void GroupLoop::DeliverProposals(const v1::RoundResult& result) {
  for (const v1::LaneOutput& o : result.outputs()) {
    if (o.draft_token_ids_size() == 0) continue;
    for (const auto& lane : s_.lanes) {
      if (lane->id != o.lane_id() || lane->gone) continue;
      // The proposal follows the lane's sequence as this result left it.
      hooks_.drafter->OnProposed(lane->id, static_cast<int64_t>(lane->seq.size()),
                                 o.draft_token_ids());
      break;
    }
  }
}

void GroupLoop::RecordVerify(const PlannedRound& round, const AppliedRound& applied) {
  if (hooks_.drafter == nullptr) return;
  for (size_t i = 0; i < round.rows.size(); ++i) {
    const PlannedRow& row = round.rows[i];
    if (row.drafts == 0 || row.voided) continue;
    hooks_.drafter->OnVerified(row.lane, row.draft_source, static_cast<int>(row.drafts),
                               static_cast<int>(applied.accepted_by_row[i]));
  }
}

void GroupLoop::RecordVerifyMetrics(const PlannedRound& round,
                                    absl::Span<const int64_t> accepted_by_row) {
  if (hooks_.drafter == nullptr) return;
  int64_t verify_rows = 0;
  for (size_t i = 0; i < round.rows.size() && i < accepted_by_row.size(); ++i) {
    const PlannedRow& row = round.rows[i];
    if (row.drafts == 0) continue;
    if (row.voided) {
      // Drafted, never verified: rejected, so drafted == accepted +
      // rejected still holds; no verify row, no accepted-per-step sample.
      if (row.draft_source >= 0 && row.draft_source < static_cast<int>(metrics_.spec.size())) {
        const SpecSeries& s = metrics_.spec[row.draft_source][row.temperature_omitted ? 1 : 0];
        s.drafted->Increment(static_cast<double>(row.drafts));
        s.rejected->Increment(static_cast<double>(row.drafts));
      }
      continue;
    }
    ++verify_rows;
    const int64_t accepted = accepted_by_row[i];
    if (row.draft_source < 0 || row.draft_source >= static_cast<int>(metrics_.spec.size())) {
      continue;
    }
    const SpecSeries& s = metrics_.spec[row.draft_source][row.temperature_omitted ? 1 : 0];
    s.drafted->Increment(static_cast<double>(row.drafts));
    s.accepted->Increment(static_cast<double>(accepted));
    s.rejected->Increment(static_cast<double>(row.drafts - accepted));
    s.verify_rows->Increment();
    metrics_.spec_accepted_per_step[row.draft_source]->Observe(static_cast<double>(accepted));
  }
  if (metrics_.spec_verify_rows_per_round != nullptr) {
    metrics_.spec_verify_rows_per_round->Observe(static_cast<double>(verify_rows));
  }
}

void GroupLoop::FailAll(const absl::Status& status) {
  for (auto& lane : s_.lanes) lane->req->Fail(status);
  for (Waiting& w : s_.waiting) w.req->Fail(status);
  s_.lanes.clear();
  s_.waiting.clear();
  s_.pending_release.clear();
}

void GroupLoop::UpdateGauges() {
  if (metrics_.rounds == nullptr) return;
  metrics_.lanes_running->Set(static_cast<double>(s_.live_lanes()));
  metrics_.lanes_waiting->Set(static_cast<double>(s_.waiting.size()));
  if (kv_) {
    const KvBlockStats st = kv_->stats();
    metrics_.kv_blocks_total->Set(static_cast<double>(st.num_blocks));
    metrics_.kv_blocks_used->Set(
        static_cast<double>(st.num_blocks - st.free_blocks - st.evictable_blocks));
  }
}

}  // namespace ringlane::router
