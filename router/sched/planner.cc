#include "router/sched/planner.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/client/round_builder.h"
#include "router/sched/task_pool.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

// Planning one round: the state it changes and the plan it writes.
class Planning {
 public:
  Planning(SchedState& state, KvBlockManager& kv, const RoundCostModel& cost,
           const PlannerOptions& options, Drafter* drafter, PlannedRound* out)
      : s_(state),
        kv_(kv),
        cost_(cost),
        opt_(options),
        drafter_(drafter),
        out_(out),
        block_size_(kv.block_size_tokens()) {}

  void Run();

 private:
  void ReleaseDead();
  void PlanDecodeRows();
  // Grows `lane` to `positions`, preempting younger lanes; false when the
  // lane itself was preempted or failed.
  bool Grow(Lane& lane, size_t index, int64_t positions);
  void PlanPrefillRows();
  void Admit();
  void Preempt(Lane& lane);
  void Drop(Lane& lane, absl::Status why);
  // Whether the lane's next decode row still counts (its planned rows have
  // not sampled max_tokens yet), and how many tokens it may still sample.
  int64_t TokensLeft(const Lane& lane) const {
    return lane.req->p.max_tokens -
           TokensAfterPlannedRounds(lane.generated_before(), lane.prompt_len, lane.fed);
  }
  void AddPrefill(Lane& lane, int64_t chunk);
  // The prompt tokens `lane` feeds this round out of `limit`.
  int64_t PrefillChunk(const Lane& lane, int64_t limit) const;
  int64_t ChunkedUntil(const Lane& lane) const {
    return kv_.ChunkedUntil(static_cast<int64_t>(lane.req->p.prompt.size()));
  }
  // `masks`: ConstrainRow's, for a constrained lane.
  void AddDecode(Lane& lane, absl::Span<const int32_t> drafts, std::vector<std::string> masks);
  // Grammar-constrained lanes: cuts `drafts` at the first token the grammar
  // refuses (or a stop token, or one that ends the grammar) and sets
  // `masks` to one mask per position the row samples, the k-th from the
  // grammar state after drafts 1..k-1. False when the grammar allows no
  // token at all (the lane cannot go on).
  bool ConstrainRow(const Lane& lane, std::vector<int32_t>* drafts,
                    std::vector<std::string>* masks) const;
  void PrefetchMasks(const std::function<bool(const Lane&)>& wants_row);
  void Account(Lane& lane, v1::LaneStep* row, int64_t tokens, int64_t drafts);
  // Models with recurrent layers: the checkpoint a lane's first row resumes
  // from, and the checkpoints a row saves at the interval's multiples it
  // runs through.
  void AddStateCheckpoints(const Lane& lane, v1::LaneStep* row);

  SchedState& s_;
  KvBlockManager& kv_;
  const RoundCostModel& cost_;
  const PlannerOptions& opt_;
  Drafter* const drafter_;
  PlannedRound* const out_;
  const int32_t block_size_;
  v1::RoundPlan* const plan_ = &out_->plan;
  int64_t decode_rows_ = 0;
  int64_t decode_tokens_ = 0;
  int64_t limit_ = 0;  // prefill tokens the round may still feed
};

void Planning::Account(Lane& lane, v1::LaneStep* row, int64_t tokens, int64_t drafts) {
  if (!lane.params_sent) {
    // The lane's prompt ends with what the choice generated before a
    // preemption; the workers must count it for penalties, and may never see
    // those positions themselves when their blocks are a prefix-cache hit.
    const size_t prompt = lane.req->p.prompt.size();
    SetLaneParams(row, lane.req->p.sampling, lane.choice,
                  absl::MakeConstSpan(lane.seq.data() + prompt,
                                      static_cast<size_t>(lane.generated_before())));
    // Positions the lane takes from cached blocks: a draft model on the
    // workers may never have seen them (LaneStep.prefix_token_ids).
    if (drafter_ != nullptr && opt_.max_drafts > 0 && lane.fed > 0 &&
        drafter_->WantsPrefixTokens(lane)) {
      row->mutable_prefix_token_ids()->Add(lane.seq.begin(), lane.seq.begin() + lane.fed);
    }
    lane.params_sent = true;
  }
  // A row that samples may ask the workers' draft model for the lane's
  // next drafts, which the lane's next row can carry once this one is back.
  if (drafter_ != nullptr && opt_.max_drafts > 0 &&
      (row->sample_last() || row->verify_offsets_size() > 0)) {
    row->set_propose_drafts(drafter_->ProposeDepth(lane, opt_.max_drafts));
  }
  PlannedRow r;
  r.lane = lane.id;
  r.start = lane.fed;
  r.tokens = tokens;
  r.drafts = drafts;
  r.temperature_omitted = lane.req->p.default_temperature;
  r.plan_row = plan_->rows_size() - 1;
  lane.fed += tokens;
  r.fed_after = lane.fed;
  lane.in_plan = true;
  ++lane.rows_in_flight;
  if (drafts > 0) {
    ++lane.verify_rows_in_flight;
    lane.flight_drafts.assign(row->token_ids().begin(), row->token_ids().end());
  } else {
    lane.flight_drafts.clear();
  }
  out_->rows.push_back(r);
}

bool Constrained(const Lane& lane) {
  return lane.req->masker != nullptr && lane.req->choices[lane.choice].grammar.has_value();
}

bool Planning::ConstrainRow(const Lane& lane, std::vector<int32_t>* drafts,
                            std::vector<std::string>* masks) const {
  const RequestState& req = *lane.req;
  const Choice& c = req.choices[lane.choice];
  const grammar::TokenMasker& masker = *req.masker;
  const auto start = std::chrono::steady_clock::now();
  // The matcher before each sampled position: drafts are cut first, by
  // the grammar alone (Allows agrees with the mask bit by bit), so the
  // masks, the costly part, can then be computed side by side.
  const bool first_at_start = req.NextTokenAtTextStart(c);
  std::vector<grammar::Matcher> before{*c.grammar};
  for (size_t k = 0; k < drafts->size(); ++k) {
    const int32_t t = (*drafts)[k];
    grammar::Matcher next = before.back();
    // Past a stop token or the grammar's end nothing is sampled; past a
    // refused token the draft cannot be accepted.
    if (req.stop_tokens->Check(t) != StopTokens::Kind::kNone ||
        !masker.Advance(&next, k == 0 && first_at_start, t) || next.Finished()) {
      break;
    }
    before.push_back(std::move(next));
  }
  masks->assign(before.size(), std::string());
  auto compute = [&](size_t k) {
    std::string mask = masker.Mask(before[k], k == 0 && first_at_start);
    mask.resize(req.mask_bytes, '\0');
    (*masks)[k] = std::move(mask);
  };
  if (opt_.mask_pool != nullptr) {
    opt_.mask_pool->ParallelFor(before.size(), compute);
  } else {
    for (size_t k = 0; k < before.size(); ++k) compute(k);
  }
  if (req.metrics) {
    req.metrics->grammar_mask_s->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  // A position where no token may come ends the row before it (drafts
  // that lead there cannot be accepted); at the first, the lane cannot go on.
  size_t keep = 0;
  while (keep < masks->size() &&
         std::any_of((*masks)[keep].begin(), (*masks)[keep].end(), [](char b) { return b != 0; })) {
    ++keep;
  }
  if (keep == 0) return false;
  masks->resize(keep);
  drafts->resize(keep - 1);
  return true;
}

// Masks of the constrained lanes' next positions, computed side by side
// into the masker's cache before the rows are planned one by one.
void Planning::PrefetchMasks(const std::function<bool(const Lane&)>& wants_row) {
  if (opt_.mask_pool == nullptr || opt_.mask_pool->threads() < 2) return;
  std::vector<const Lane*> lanes;
  for (const auto& l : s_.lanes) {
    if (Constrained(*l) && wants_row(*l)) lanes.push_back(l.get());
  }
  opt_.mask_pool->ParallelFor(lanes.size(), [&](size_t i) {
    const RequestState& req = *lanes[i]->req;
    const Choice& c = req.choices[lanes[i]->choice];
    req.masker->Mask(*c.grammar, req.NextTokenAtTextStart(c));
  });
}

void Planning::AddPrefill(Lane& lane, int64_t chunk) {
  std::vector<std::string> masks;
  const bool samples = lane.fed + chunk == lane.prompt_len;
  if (samples && Constrained(lane)) {
    std::vector<int32_t> none;
    if (!ConstrainRow(lane, &none, &masks)) {
      Drop(lane, absl::InternalError("the output grammar allows no token of the vocabulary here"));
      return;
    }
  }
  out_->prefilled_tokens += chunk;
  v1::LaneStep* row =
      AddPrefillRow(plan_, lane.id, lane.fed,
                    absl::MakeConstSpan(lane.seq.data() + lane.fed, static_cast<size_t>(chunk)),
                    samples, *kv_.BlockTable(lane.id), block_size_);
  for (std::string& m : masks) row->add_allowed_tokens(std::move(m));
  if (kv_.linear_chunk() > 0) row->set_linear_chunked_until(ChunkedUntil(lane));
  AddStateCheckpoints(lane, row);
  Account(lane, row, chunk, 0);
}

int64_t Planning::PrefillChunk(const Lane& lane, int64_t limit) const {
  const int64_t n = std::min(limit, lane.prompt_len - lane.fed);
  const int64_t chunk = kv_.linear_chunk();
  const int64_t until = ChunkedUntil(lane);
  if (chunk <= 0 || lane.fed + n >= until) return n;
  // Below the limit a row ends at a chunk's end, so every whole chunk runs
  // chunked in one row however the budget falls; a budget short of one
  // chunk still feeds one (a round at most chunk - 1 tokens over budget),
  // so the prompt moves on.
  const int64_t end = (lane.fed + n) / chunk * chunk;
  if (end > lane.fed) return end - lane.fed;
  return (lane.fed / chunk + 1) * chunk - lane.fed;
}

void Planning::AddStateCheckpoints(const Lane& lane, v1::LaneStep* row) {
  if (!kv_.checkpoints()) return;
  if (const int32_t slot = kv_.TakeResumeCheckpoint(lane.id); slot >= 0) {
    row->set_resume_checkpoint(slot);
  }
  // A row that may be void saves nothing: the block it names would keep a
  // checkpoint slot that no row wrote.
  if (row->assume_accepted()) return;
  const int64_t every = kv_.checkpoint_interval();
  // A verify row's drafts may be rejected (the workers then rewind the
  // state): only the state after its first token is sure.
  const int64_t start = row->start_position();
  const int64_t end = start + (RowDrafts(*row) > 0 ? 1 : RowTokens(*row));
  for (int64_t p = (start / every + 1) * every; p <= end; p += every) {
    absl::StatusOr<int32_t> slot = kv_.CheckpointFor(lane.id, p);
    if (!slot.ok() || *slot < 0) continue;  // every slot pinned: no checkpoint this time
    v1::StateCheckpoint* c = row->add_state_checkpoints();
    c->set_position(p);
    c->set_slot(*slot);
  }
}

void Planning::AddDecode(Lane& lane, absl::Span<const int32_t> drafts,
                         std::vector<std::string> masks) {
  v1::LaneStep* row =
      AddDecodeRow(plan_, lane.id, lane.fed, drafts, *kv_.BlockTable(lane.id), block_size_);
  // Behind a verify row in flight lane.fed assumes its drafts accepted
  // whole; the workers skip the row where they were not.
  if (lane.verify_rows_in_flight > 0) row->set_assume_accepted(true);
  for (std::string& m : masks) row->add_allowed_tokens(std::move(m));
  AddStateCheckpoints(lane, row);
  Account(lane, row, 1 + static_cast<int64_t>(drafts.size()), static_cast<int64_t>(drafts.size()));
}

void Planning::Drop(Lane& lane, absl::Status why) {
  lane.req->Fail(std::move(why));
  kv_.Release(lane.id).IgnoreError();
  AddReleaseRow(plan_, lane.id);
  lane.gone = true;
}

void Planning::Preempt(Lane& lane) {
  RL_LOG(INFO) << "worker group " << opt_.group_index << ": KV pool full, preempting lane "
               << lane.id << " (request " << lane.req->p.request_id << ", choice " << lane.choice
               << "); it restarts from its prompt and "
               << lane.req->choices[lane.choice].generated.size() << " generated tokens";
  kv_.Release(lane.id).IgnoreError();
  AddReleaseRow(plan_, lane.id);
  lane.gone = true;
  s_.waiting.push_front({lane.req, lane.choice});
  ++out_->preemptions;
}

void Planning::ReleaseDead() {
  for (LaneId id : s_.pending_release) AddReleaseRow(plan_, id);
  s_.pending_release.clear();
  // Cancelled or failed requests give their lanes and blocks back first.
  for (auto& lane : s_.lanes) {
    if (lane->gone || !lane->req->dead()) continue;
    RL_LOG(DEBUG) << "dropping lane " << lane->id << " of request " << lane->req->p.request_id;
    lane->req->Account(&GroupMetrics::requests_cancelled);
    kv_.Release(lane->id).IgnoreError();
    AddReleaseRow(plan_, lane->id);
    lane->gone = true;
  }
  s_.Compact();
  s_.waiting.erase(std::remove_if(s_.waiting.begin(), s_.waiting.end(),
                                  [](const Waiting& w) {
                                    if (!w.req->dead()) return false;
                                    w.req->Account(&GroupMetrics::requests_cancelled);
                                    return true;
                                  }),
                   s_.waiting.end());
}

bool Planning::Grow(Lane& lane, size_t index, int64_t positions) {
  while (!kv_.AppendSlots(lane.id, positions).ok()) {
    std::vector<PreemptCandidate> c(s_.lanes.size());
    for (size_t j = 0; j < s_.lanes.size(); ++j) {
      c[j] = {s_.lanes[j]->admit_seq, s_.lanes[j]->in_plan || s_.lanes[j]->gone, true};
    }
    std::optional<size_t> v = PickPreemptionVictim(c);
    if (!v || s_.live_lanes() == 1) {
      Drop(lane, absl::ResourceExhaustedError(absl::StrCat(
                     "the KV pool (", kv_.num_blocks(), " blocks of ", block_size_,
                     " tokens) cannot hold this request's ", positions, " positions")));
      return false;
    }
    Preempt(*s_.lanes[*v]);
    if (*v == index) return false;
  }
  return true;
}

void Planning::PlanDecodeRows() {
  const bool speculative = drafter_ != nullptr && opt_.max_drafts > 0;
  // Whether drafting pays depends on how many lanes decode, whether or not
  // they want a row this round (a lane waiting for its result).
  const int64_t decoding = std::count_if(s_.lanes.begin(), s_.lanes.end(), [&](const auto& l) {
    return !l->gone && !l->prefilling() && TokensLeft(*l) > 0;
  });
  // A constrained lane's mask follows from its last token, so it never
  // pipelines a row behind the one in flight. Behind a verify row in
  // flight only a lone decoding lane gets a row (pipelined verify rows):
  // with other lanes their rows keep the workers busy, and rounds without
  // its row are cheaper for them (pipelining there measured slower).
  auto wants_row = [&](const Lane& lane) {
    return !lane.gone && !lane.prefilling() && TokensLeft(lane) > 0 &&
           !(lane.live_rows_in_flight() > 0 && Constrained(lane)) &&
           !(lane.verify_rows_in_flight > 0 && decoding > 1);
  };
  PrefetchMasks(wants_row);
  const int64_t decoders =
      std::count_if(s_.lanes.begin(), s_.lanes.end(), [&](const auto& l) { return wants_row(*l); });
  int64_t decoders_left = decoders;
  if (speculative) drafter_->BeginRound(decoding);
  // Oldest lane first; a lane that cannot grow takes blocks from the
  // youngest lane not yet in the round.
  for (size_t i = 0; i < s_.lanes.size(); ++i) {
    Lane& lane = *s_.lanes[i];
    if (!wants_row(lane)) continue;
    --decoders_left;
    DraftDecision d;
    if (speculative) {
      // Drafts never take the round past its budget nor the lane past
      // max_tokens (a verify row samples up to drafts + 1 tokens).
      const int64_t room = opt_.round_token_budget - decode_tokens_ - decoders_left - 1;
      DraftContext ctx;
      ctx.max_drafts = static_cast<int>(
          std::min<int64_t>({opt_.max_drafts, TokensLeft(lane) - 1, std::max<int64_t>(room, 0)}));
      ctx.decoding_lanes = decoders;
      const int live = lane.live_rows_in_flight();
      ctx.row_in_flight = live > 0;
      // Behind two rows in flight the first one's last sample is unknown
      // too (pipeline depth above 2): no drafts to guess past it.
      if (live > 1) ctx.max_drafts = 0;
      if (live == 1) ctx.assumed = lane.flight_drafts;
      ctx.cost = &cost_;
      d = drafter_->Plan(lane, ctx);
      // A lane that drafts next follows its row in flight only once that
      // row's result is in.
      if (ctx.row_in_flight && d.wait) continue;
      if (ctx.max_drafts <= 0) d.tokens.clear();
      if (static_cast<int>(d.tokens.size()) > ctx.max_drafts) d.tokens.resize(ctx.max_drafts);
    }
    std::vector<std::string> masks;
    if (Constrained(lane)) {
      if (!ConstrainRow(lane, &d.tokens, &masks)) {
        Drop(lane,
             absl::InternalError("the output grammar allows no token of the vocabulary here"));
        continue;
      }
    }
    // Drafts are optional: when the pool is short, drop them before
    // preempting anyone for them.
    const int64_t want = lane.fed + 1 + static_cast<int64_t>(d.tokens.size());
    if (!d.tokens.empty() && !kv_.AppendSlots(lane.id, want).ok()) {
      d.tokens.clear();
      if (!masks.empty()) masks.resize(1);
    }
    if (!Grow(lane, i, lane.fed + 1 + static_cast<int64_t>(d.tokens.size()))) continue;
    AddDecode(lane, d.tokens, std::move(masks));
    out_->rows.back().decode = true;
    out_->rows.back().draft_source = d.tokens.empty() ? -1 : d.source;
    ++decode_rows_;
    decode_tokens_ += 1 + static_cast<int64_t>(d.tokens.size());
  }
  if (speculative) out_->draft = drafter_->EndRound();
}

void Planning::PlanPrefillRows() {
  double decode_attended = 0;
  for (const v1::LaneStep& row : plan_->rows()) {
    decode_attended += AttendedPairs(row.start_position(), RowTokens(row));
  }
  int64_t prefill_start = 0;
  for (const auto& lp : s_.lanes) {
    if (!lp->gone && !lp->in_plan && lp->prefilling()) {
      prefill_start = lp->fed;
      break;
    }
  }
  limit_ = PrefillTokenLimit(decode_tokens_, opt_.round_token_budget, opt_.itl_target_ms * 1000,
                             cost_, opt_.min_prefill_chunk, decode_attended, prefill_start);
  for (auto& lp : s_.lanes) {
    Lane& lane = *lp;
    if (limit_ <= 0) break;
    if (lane.gone || lane.in_plan || !lane.prefilling()) continue;
    const int64_t chunk = PrefillChunk(lane, limit_);
    AddPrefill(lane, chunk);
    limit_ -= chunk;
  }
}

void Planning::Admit() {
  // Choices whose blocks are coming back from the kvstore keep their place;
  // the ones behind them go first.
  size_t next = 0;
  while (limit_ > 0 && next < s_.waiting.size() && s_.live_lanes() < opt_.max_lanes) {
    if (s_.waiting[next].restoring) {
      ++next;
      continue;
    }
    Waiting w = s_.waiting[next];
    Choice& c = w.req->choices[w.choice];
    auto lane = std::make_unique<Lane>();
    lane->id = s_.next_lane_id++;
    lane->req = w.req;
    lane->choice = w.choice;
    lane->admit_seq = s_.next_admit_seq++;
    lane->seq = w.req->p.prompt;
    lane->seq.insert(lane->seq.end(), c.generated.begin(), c.generated.end());
    lane->prompt_len = static_cast<int64_t>(lane->seq.size());
    absl::StatusOr<int64_t> cached = kv_.Allocate(lane->id, lane->seq, lane->prompt_len,
                                                  /*reuse_partial=*/true, ChunkedUntil(*lane));
    if (!cached.ok()) {
      if (s_.live_lanes() > 0) break;  // wait for running lanes to give blocks back
      // No amount of waiting helps: the client's request is too large for
      // this deployment, which is a 400, not a 429 to retry.
      w.req->Fail(absl::InvalidArgumentError(absl::StrCat(
          "prompt: ", lane->seq.size(), " tokens need more KV blocks than the ", kv_.num_blocks(),
          " of worker group ", opt_.group_index, " (", block_size_, " tokens each)")));
      s_.waiting.erase(s_.waiting.begin() + static_cast<std::ptrdiff_t>(next));
      continue;
    }
    s_.waiting.erase(s_.waiting.begin() + static_cast<std::ptrdiff_t>(next));
    // A partial-block hit: this plan's first act is the copy its row reads.
    for (const KvBlockManager::BlockCopy& c : kv_.TakeCopies()) {
      v1::KvBlockCopy* bc = plan_->add_block_copies();
      bc->set_src_block_id(c.src);
      bc->set_dst_block_id(c.dst);
    }
    if (w.choice == 0 && w.req->cached_tokens < 0) {
      w.req->cached_tokens = *cached;
      out_->admitted_any = true;
      out_->admitted_prompt_tokens += static_cast<int64_t>(w.req->p.prompt.size());
      out_->admitted_cached_tokens += *cached;
    }
    lane->fed = *cached;
    lane->committed_blocks = *cached / block_size_;
    const int64_t chunk = PrefillChunk(*lane, limit_);
    AddPrefill(*lane, chunk);
    limit_ -= chunk;
    s_.lanes.push_back(std::move(lane));
  }
}

void Planning::Run() {
  for (auto& lane : s_.lanes) lane->in_plan = false;
  ReleaseDead();
  PlanDecodeRows();
  PlanPrefillRows();
  Admit();
  s_.Compact();
  if (plan_->rows_size() == 0) return;
  plan_->set_round_id(++s_.round_id);
}

}  // namespace

int64_t SchedState::live_lanes() const {
  return std::count_if(lanes.begin(), lanes.end(), [](const auto& l) { return !l->gone; });
}

void SchedState::Compact() {
  lanes.erase(std::remove_if(lanes.begin(), lanes.end(), [](const auto& l) { return l->gone; }),
              lanes.end());
}

Lane* SchedState::Find(LaneId id) {
  for (auto& l : lanes) {
    if (l->id == id && !l->gone) return l.get();
  }
  return nullptr;
}

void PlanRound(SchedState& state, KvBlockManager& kv, const RoundCostModel& cost,
               const PlannerOptions& options, Drafter* drafter, PlannedRound* out) {
  Planning(state, kv, cost, options, drafter, out).Run();
}

}  // namespace ringlane::router
