#include "worker/server/draft_runner.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/log.h"

namespace ringlane::worker {

absl::StatusOr<std::unique_ptr<DraftRunner>> DraftRunner::Create(std::unique_ptr<Backend> draft,
                                                                 const KvPoolSpec& target_pool,
                                                                 int target_vocab,
                                                                 int64_t target_context) {
  const ModelConfig& c = draft->config();
  if (c.vocab != target_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("the draft model's vocabulary has ", c.vocab,
                                                   " tokens, the target's ", target_vocab));
  }
  if (c.max_position > 0 && c.max_position < target_context) {
    return absl::InvalidArgumentError(absl::StrCat("the draft model's context (", c.max_position,
                                                   ") is shorter than the target's (",
                                                   target_context, ")"));
  }
  if (target_pool.num_blocks <= 0 || target_pool.block_size <= 0) {
    return absl::InvalidArgumentError("the target's KV pool has no blocks");
  }
  // A proposal writes at most kMaxProposedDrafts positions past the row's
  // blocks, which may start anywhere in a block.
  const int per_lane =
      (kMaxProposedDrafts + target_pool.block_size - 1) / target_pool.block_size + 1;
  const int scratch = kMaxProposingLanes * per_lane;
  KvPoolSpec pool = target_pool;
  pool.num_blocks = target_pool.num_blocks + scratch;
  if (absl::Status st = draft->AllocateKvPool(pool); !st.ok()) return st;
  return std::unique_ptr<DraftRunner>(
      new DraftRunner(std::move(draft), target_pool.num_blocks, scratch));
}

DraftRunner::DraftRunner(std::unique_ptr<Backend> draft, int target_blocks, int scratch_blocks)
    : draft_(std::move(draft)),
      target_blocks_(target_blocks),
      scratch_blocks_(scratch_blocks),
      mtp_(draft_->config().mtp_drafter),
      valid_(static_cast<size_t>(target_blocks), 0) {}

template <class F>
void DraftRunner::ForEachTargetBlock(const SeqStep& s, int64_t end, F&& f) const {
  const int64_t bs = draft_->kv_pool().block_size;
  for (int64_t p = s.start_position; p < end; p = (p / bs + 1) * bs) {
    const int64_t bi = p / bs;
    if (bi >= static_cast<int64_t>(s.block_ids.size())) break;
    const int32_t b = s.block_ids[static_cast<size_t>(bi)];
    if (b < 0 || b >= target_blocks_) continue;  // scratch
    f(b, static_cast<int32_t>(p % bs), static_cast<int32_t>(std::min(end - bi * bs, bs)));
  }
}

void DraftRunner::TargetWrote(const RoundInput& round) {
  const auto in_pool = [&](int32_t b) { return b >= 0 && b < target_blocks_; };
  for (const BlockCopy& c : round.block_copies) {
    if (in_pool(c.src) && in_pool(c.dst)) valid_[c.dst] = valid_[c.src];
  }
  for (const SeqStep& s : round.seqs) {
    ForEachTargetBlock(
        s, s.start_position + static_cast<int64_t>(s.tokens.size()),
        [&](int32_t b, int32_t lo, int32_t) { valid_[b] = std::min(valid_[b], lo); });
  }
}

void DraftRunner::DraftFed(const SeqStep& t, int64_t fed) {
  ForEachTargetBlock(t, t.start_position + fed, [&](int32_t b, int32_t lo, int32_t hi) {
    // Entries after a stale one do not make the block's prefix whole.
    if (lo <= valid_[b]) valid_[b] = std::max(valid_[b], hi);
  });
}

int64_t DraftRunner::FirstStale(absl::Span<const int32_t> blocks, int64_t end) const {
  const int64_t bs = draft_->kv_pool().block_size;
  for (size_t bi = 0; static_cast<int64_t>(bi) * bs < end; ++bi) {
    const int64_t first = static_cast<int64_t>(bi) * bs;
    if (bi >= blocks.size() || blocks[bi] < 0 || blocks[bi] >= target_blocks_) return first;
    if (valid_[blocks[bi]] < std::min(bs, end - first)) return first + valid_[blocks[bi]];
  }
  return end;
}

void DraftRunner::KeepPrefix(uint64_t lane, const SeqStep& s, absl::Span<const int32_t> prefix) {
  DropPrefix(lane);
  if (static_cast<int64_t>(prefix.size()) != s.start_position) return;
  const int64_t from = FirstStale(s.block_ids, s.start_position);
  const int64_t n = s.start_position - from;
  if (n <= 0 || prefix_total_ + n > kMaxPrefixTokens) return;
  if (prefix_.size() > kMaxPending) {
    prefix_.clear();
    prefix_total_ = 0;
  }
  prefix_[lane] = Prefix{.from = from, .tokens = {prefix.begin() + from, prefix.end()}};
  prefix_total_ += n;
}

void DraftRunner::DropPrefix(uint64_t lane) {
  auto it = prefix_.find(lane);
  if (it == prefix_.end()) return;
  prefix_total_ -= static_cast<int64_t>(it->second.tokens.size());
  prefix_.erase(it);
}

void DraftRunner::PrependPrefix(uint64_t lane, SeqStep* t) {
  auto it = prefix_.find(lane);
  if (it == prefix_.end()) return;
  const Prefix& kept = it->second;
  const int64_t kept_end = kept.from + static_cast<int64_t>(kept.tokens.size());
  // Entries another lane fed since the first row need not be fed again.
  const int64_t from = std::max(kept.from, FirstStale(t->block_ids, t->start_position));
  if (kept_end == t->start_position && from < kept_end) {
    t->tokens.insert(t->tokens.begin(), kept.tokens.begin() + (from - kept.from),
                     kept.tokens.end());
    t->start_position = from;
    last_prefix_fed_ += kept_end - from;
  }
  DropPrefix(lane);
}

bool DraftRunner::CoverWithScratch(int64_t last, std::vector<int32_t>* blocks,
                                   int* scratch_next) const {
  const int bs = draft_->kv_pool().block_size;
  const size_t need = static_cast<size_t>(last / bs + 1);
  const int extra = need > blocks->size() ? static_cast<int>(need - blocks->size()) : 0;
  if (*scratch_next + extra > target_blocks_ + scratch_blocks_) return false;
  for (int e = 0; e < extra; ++e) blocks->push_back((*scratch_next)++);
  return true;
}

void DraftRunner::LogFailure(const absl::Status& st) {
  // Once, then every 1000th: a draft model that cannot run must not flood
  // the log at the round rate.
  if (failures_++ % 1000 == 0) {
    RL_LOG(WARNING) << "draft model: no proposals this round (" << failures_
                    << " such rounds so far): " << st.message();
  }
}

absl::Status DraftRunner::StepArgmax(const RoundInput& in, std::vector<int32_t>* argmax,
                                     std::vector<std::vector<float>>* last_hidden) {
  absl::StatusOr<RoundOutput> out = draft_->Step(in);
  ++passes_;
  if (!out.ok()) return out.status();
  argmax->assign(in.seqs.size(), -1);
  if (last_hidden != nullptr) last_hidden->assign(in.seqs.size(), {});
  const int64_t D = draft_->config().hidden;
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    if (in.seqs[i].logit_offsets.empty()) continue;
    // The last asked position's logits; lowest id on ties.
    const float* row = out->logits[i].data() + (in.seqs[i].logit_offsets.size() - 1) * out->vocab;
    (*argmax)[i] = static_cast<int32_t>(std::max_element(row, row + out->vocab) - row);
    if (last_hidden != nullptr && i < out->hidden.size() &&
        static_cast<int64_t>(out->hidden[i].size()) >= D) {
      (*last_hidden)[i].assign(out->hidden[i].end() - D, out->hidden[i].end());
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<int32_t>> DraftRunner::Run(const RoundInput& round,
                                                   absl::Span<const Feed> feeds,
                                                   const RoundOutput& target) {
  std::vector<std::vector<int32_t>> proposals(round.seqs.size());
  last_propose_us_ = 0;
  last_prefix_fed_ = 0;
  RoundInput first;
  first.block_copies = round.block_copies;
  first.want_hidden = mtp_;
  std::vector<Proposing> proposing;
  TargetWrote(round);
  if (mtp_) {
    FeedMtp(round, feeds, target, &first, &proposing);
  } else {
    FeedModel(round, feeds, &first, &proposing);
  }
  if (first.seqs.empty() && first.block_copies.empty()) return proposals;
  if (Propose(first, &proposing, &proposals)) {
    for (const SeqStep& t : first.seqs) DraftFed(t, static_cast<int64_t>(t.tokens.size()));
  } else {
    // What the failed pass wrote, and whether it copied, is unknown.
    std::fill(valid_.begin(), valid_.end(), 0);
  }
  for (const auto& p : proposals) proposed_ += static_cast<int64_t>(p.size());
  return proposals;
}

bool DraftRunner::StartProposal(size_t seq, int64_t position, int propose, size_t draft_seq,
                                SeqStep* t, int* scratch_next, std::vector<Proposing>* proposing) {
  // Each draft after the first writes one more position: up to position +
  // propose - 1, within the context.
  const int64_t context = draft_->config().max_position;
  propose = std::min(propose, kMaxProposedDrafts);
  if (context > 0) propose = static_cast<int>(std::min<int64_t>(propose, context - position));
  if (propose <= 0 || !CoverWithScratch(position + propose - 1, &t->block_ids, scratch_next)) {
    return false;
  }
  t->logit_offsets.push_back(static_cast<int32_t>(t->tokens.size() - 1));
  proposing->push_back(Proposing{.seq = seq,
                                 .draft_seq = draft_seq,
                                 .next_pos = position + 1,
                                 .left = propose,
                                 .blocks = t->block_ids});
  return true;
}

void DraftRunner::FeedModel(const RoundInput& round, absl::Span<const Feed> feeds,
                            RoundInput* first, std::vector<Proposing>* proposing) {
  if (lag_.size() > kMaxPending) lag_.clear();
  int scratch_next = target_blocks_;
  for (size_t i = 0; i < round.seqs.size() && i < feeds.size(); ++i) {
    const SeqStep& s = round.seqs[i];
    const Feed& f = feeds[i];
    const size_t keep = std::min<size_t>(std::max(f.keep, 0), s.tokens.size());
    const auto kept_end = s.tokens.begin() + static_cast<std::ptrdiff_t>(keep);
    auto lag = lag_.find(f.lane);
    // A row that does not continue the waiting tokens (the lane was
    // preempted and starts over): they will never be fed.
    if (lag != lag_.end() &&
        lag->second.from + static_cast<int64_t>(lag->second.tokens.size()) != s.start_position) {
      lag_.erase(lag);
      lag = lag_.end();
    }
    if (!f.prefix.empty()) KeepPrefix(f.lane, s, f.prefix);
    SeqStep t;
    t.block_ids = s.block_ids;
    if (!(f.has_next && f.propose > 0)) {
      if (keep == 0) continue;
      if (lag == lag_.end()) lag = lag_.emplace(f.lane, Lag{.from = s.start_position}).first;
      lag->second.tokens.insert(lag->second.tokens.end(), s.tokens.begin(), kept_end);
      if (lag->second.tokens.size() < kMaxLagTokens) continue;
      t.start_position = lag->second.from;
      t.tokens = std::move(lag->second.tokens);
      lag_.erase(lag);
      PrependPrefix(f.lane, &t);
      first->seqs.push_back(std::move(t));
      continue;
    }
    if (lag != lag_.end()) {
      t.start_position = lag->second.from;
      t.tokens = std::move(lag->second.tokens);
      lag_.erase(lag);
    } else {
      t.start_position = s.start_position;
    }
    PrependPrefix(f.lane, &t);
    t.tokens.insert(t.tokens.end(), s.tokens.begin(), kept_end);
    // The sample goes at next_pos and gives the first draft.
    t.tokens.push_back(f.next);
    const int64_t next_pos = s.start_position + static_cast<int64_t>(keep);
    if (!StartProposal(i, next_pos, f.propose, first->seqs.size(), &t, &scratch_next, proposing)) {
      t.tokens.pop_back();
    }
    if (!t.tokens.empty()) first->seqs.push_back(std::move(t));
  }
}

void DraftRunner::FeedMtp(const RoundInput& round, absl::Span<const Feed> feeds,
                          const RoundOutput& target, RoundInput* first,
                          std::vector<Proposing>* proposing) {
  const int64_t D = draft_->config().hidden;
  if (pending_.size() > kMaxPending) pending_.clear();
  int scratch_next = target_blocks_;
  for (size_t i = 0; i < round.seqs.size() && i < feeds.size(); ++i) {
    const SeqStep& s = round.seqs[i];
    const Feed& f = feeds[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t keep = std::clamp<int64_t>(f.keep, 0, n);
    auto waiting = pending_.find(f.lane);
    if (i >= target.hidden.size() || static_cast<int64_t>(target.hidden[i].size()) != n * D ||
        keep == 0) {
      if (waiting != pending_.end()) pending_.erase(waiting);
      continue;
    }
    const float* h = target.hidden[i].data();
    SeqStep t;
    t.block_ids = s.block_ids;
    t.start_position = s.start_position;
    // The entry of the position before this row, whose next token is this
    // row's first.
    if (waiting != pending_.end()) {
      if (waiting->second.position == s.start_position - 1) {
        t.start_position = waiting->second.position;
        t.tokens.push_back(s.tokens[0]);
        t.hidden_in = std::move(waiting->second.hidden);
      }
      pending_.erase(waiting);
    }
    for (int64_t k = 0; k + 1 < keep; ++k) {
      t.tokens.push_back(s.tokens[k + 1]);
      t.hidden_in.insert(t.hidden_in.end(), h + k * D, h + (k + 1) * D);
    }
    const float* last_h = h + (keep - 1) * D;
    if (!f.has_next) {
      pending_[f.lane] = Pending{.position = s.start_position + keep - 1,
                                 .hidden = std::vector<float>(last_h, last_h + D)};
    } else {
      t.tokens.push_back(f.next);
      t.hidden_in.insert(t.hidden_in.end(), last_h, last_h + D);
      // Its logits give the first draft.
      StartProposal(i, s.start_position + keep - 1, f.propose, first->seqs.size(), &t,
                    &scratch_next, proposing);
    }
    if (!t.tokens.empty()) first->seqs.push_back(std::move(t));
  }
}

bool DraftRunner::Propose(const RoundInput& first, std::vector<Proposing>* proposing,
                          std::vector<std::vector<int32_t>>* proposals) {
  std::vector<int32_t> argmax;
  std::vector<std::vector<float>> hidden;
  if (absl::Status st = StepArgmax(first, &argmax, mtp_ ? &hidden : nullptr); !st.ok()) {
    LogFailure(st);
    return false;
  }
  for (Proposing& p : *proposing) {
    (*proposals)[p.seq].push_back(argmax[p.draft_seq]);
    if (mtp_) p.own = std::move(hidden[p.draft_seq]);
    --p.left;
  }
  // The rest one position a pass, every proposing lane together; an MTP
  // drafter drafts from its own last output.
  const size_t D = static_cast<size_t>(draft_->config().hidden);
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    RoundInput step;
    step.want_hidden = mtp_;
    std::vector<Proposing*> in_step;
    for (Proposing& p : *proposing) {
      if (p.left <= 0 || (mtp_ && p.own.size() != D)) continue;
      SeqStep t;
      t.start_position = p.next_pos;
      t.tokens.push_back((*proposals)[p.seq].back());
      t.block_ids = p.blocks;
      t.logit_offsets.push_back(0);
      if (mtp_) t.hidden_in = p.own;
      step.seqs.push_back(std::move(t));
      in_step.push_back(&p);
    }
    if (step.seqs.empty()) break;
    if (absl::Status st = StepArgmax(step, &argmax, mtp_ ? &hidden : nullptr); !st.ok()) {
      LogFailure(st);
      break;  // keep what was proposed so far
    }
    for (size_t k = 0; k < in_step.size(); ++k) {
      Proposing& p = *in_step[k];
      (*proposals)[p.seq].push_back(argmax[k]);
      if (mtp_) p.own = std::move(hidden[k]);
      --p.left;
      ++p.next_pos;
    }
  }
  last_propose_us_ =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  return true;
}

}  // namespace ringlane::worker
