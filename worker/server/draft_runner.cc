#include "worker/server/draft_runner.h"

#include <algorithm>
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
    : draft_(std::move(draft)), target_blocks_(target_blocks), scratch_blocks_(scratch_blocks) {}

void DraftRunner::LogFailure(const absl::Status& st) {
  // Once, then every 1000th: a draft model that cannot run must not flood
  // the log at the round rate.
  if (failures_++ % 1000 == 0) {
    RL_LOG(WARNING) << "draft model: no proposals this round (" << failures_
                    << " such rounds so far): " << st.message();
  }
}

absl::Status DraftRunner::StepArgmax(const RoundInput& in, std::vector<int32_t>* argmax) {
  absl::StatusOr<RoundOutput> out = draft_->Step(in);
  ++passes_;
  if (!out.ok()) return out.status();
  argmax->assign(in.seqs.size(), -1);
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    if (in.seqs[i].logit_offsets.empty()) continue;
    // The last asked position's logits; lowest id on ties.
    const float* row = out->logits[i].data() + (in.seqs[i].logit_offsets.size() - 1) * out->vocab;
    (*argmax)[i] = static_cast<int32_t>(std::max_element(row, row + out->vocab) - row);
  }
  return absl::OkStatus();
}

std::vector<std::vector<int32_t>> DraftRunner::Run(const RoundInput& round,
                                                   absl::Span<const Feed> feeds) {
  std::vector<std::vector<int32_t>> proposals(round.seqs.size());
  const int bs = draft_->kv_pool().block_size;
  const int64_t context = draft_->config().max_position;
  struct Proposing {
    size_t seq;        // in `round`
    size_t draft_seq;  // in the first draft round
    int64_t next_pos;  // where the next fed token goes
    int left;          // tokens still to propose
    std::vector<int32_t> blocks;
  };
  std::vector<Proposing> proposing;
  RoundInput first;
  first.block_copies = round.block_copies;
  int scratch_next = target_blocks_;
  for (size_t i = 0; i < round.seqs.size() && i < feeds.size(); ++i) {
    const SeqStep& s = round.seqs[i];
    const Feed& f = feeds[i];
    SeqStep t;
    t.start_position = s.start_position;
    const size_t keep = std::min<size_t>(std::max(f.keep, 0), s.tokens.size());
    t.tokens.assign(s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(keep));
    t.block_ids = s.block_ids;
    int propose = std::min(f.propose, kMaxProposedDrafts);
    const int64_t next_pos = s.start_position + static_cast<int64_t>(keep);
    if (propose > 0 && context > 0) {
      propose = static_cast<int>(std::min<int64_t>(propose, context - next_pos));
    }
    if (propose > 0) {
      // Blocks for every position the proposal writes: next_pos ..
      // next_pos + propose - 1.
      const size_t need = static_cast<size_t>((next_pos + propose - 1) / bs + 1);
      const int extra = need > t.block_ids.size() ? static_cast<int>(need - t.block_ids.size()) : 0;
      if (scratch_next + extra <= target_blocks_ + scratch_blocks_) {
        for (int e = 0; e < extra; ++e) t.block_ids.push_back(scratch_next++);
        t.tokens.push_back(f.next);
        t.logit_offsets.push_back(static_cast<int32_t>(t.tokens.size() - 1));
        proposing.push_back(Proposing{.seq = i,
                                      .draft_seq = first.seqs.size(),
                                      .next_pos = next_pos + 1,
                                      .left = propose,
                                      .blocks = t.block_ids});
      }
    }
    if (t.tokens.empty()) continue;
    first.seqs.push_back(std::move(t));
  }
  if (first.seqs.empty() && first.block_copies.empty()) return proposals;

  std::vector<int32_t> argmax;
  if (absl::Status st = StepArgmax(first, &argmax); !st.ok()) {
    LogFailure(st);
    return proposals;
  }
  for (Proposing& p : proposing) {
    proposals[p.seq].push_back(argmax[p.draft_seq]);
    --p.left;
  }
  // The rest one position a pass, every proposing lane together.
  for (;;) {
    RoundInput step;
    std::vector<Proposing*> in_step;
    for (Proposing& p : proposing) {
      if (p.left <= 0) continue;
      SeqStep t;
      t.start_position = p.next_pos;
      t.tokens.push_back(proposals[p.seq].back());
      t.block_ids = p.blocks;
      t.logit_offsets.push_back(0);
      step.seqs.push_back(std::move(t));
      in_step.push_back(&p);
    }
    if (step.seqs.empty()) break;
    if (absl::Status st = StepArgmax(step, &argmax); !st.ok()) {
      LogFailure(st);
      break;  // keep what was proposed so far
    }
    for (size_t k = 0; k < in_step.size(); ++k) {
      proposals[in_step[k]->seq].push_back(argmax[k]);
      --in_step[k]->left;
      ++in_step[k]->next_pos;
    }
  }
  for (const auto& p : proposals) proposed_ += static_cast<int64_t>(p.size());
  return proposals;
}

}  // namespace ringlane::worker
