// A draft model on rank 0: a smaller model with the target's vocabulary
// whose greedy continuation of a lane the router verifies in a later row
// (speculative decoding). Drafts are only ever verified, so nothing here can
// change a sampled token or logprob; a draft that cannot be made is simply
// not proposed.
//
// The draft model keeps its own KV pool, indexed by the target's block ids:
// the rows of a lane are fed to the draft model too (their accepted
// tokens), so the draft's cache of block b holds the same positions and
// tokens as the target's, and a prefix the router reuses from its cache, or
// copies part of, is as valid for the draft as for the target. Feeding is
// lazy: a lane's kept tokens wait (up to kMaxLagTokens) until a row of it
// asks for a proposal, and are fed then, ahead of the row's own, in the
// same pass. So while the router asks for no proposals (drafting does not
// pay at that load, router/spec/draft_gate.h) the draft model costs nothing,
// and a lane that finishes without asking again is never fed at all;
// measured on the synthetic 1.1B model with a 2-layer self-drafter at five
// streams, feeding every row took ~10% of the worker's time. Positions a
// proposal runs ahead into, past the row's own blocks, live in scratch
// blocks after the target's range, reused every round: the next row feeds
// those positions again with the tokens actually kept.
//
// A prefix the draft model never saw: blocks restored from the kvstore or
// imported from another rank, and positions of a lane that never asked for
// a proposal (so was never fed) before its blocks were reused or copied.
// The runner keeps, per target block, how many leading positions of its
// draft entries match the target's, and a lane's first row brings the
// tokens of the positions before it (LaneStep.prefix_token_ids): the stale
// ones are kept and fed ahead of the lane's own tokens when it is next fed,
// so its proposals read what a draft model that had seen the whole prompt
// would. Stale entries only ever cost acceptance, never correctness.
//
// An MTP drafter (DeepSeek-V3 / GLM-5's MTP layer, ModelConfig::mtp_drafter)
// reads the target's hidden states too: its entry for position j is made
// from the target's final-normed hidden state at j and the token at j + 1,
// so the position a row ends on waits for the lane's next row when the row
// did not sample (a prefill chunk), and a proposal's later steps read the
// MTP layer's own output as their hidden state (as vLLM and SGLang run it).
//
// Owned by the step loop of rank 0 and used on its thread only.
#ifndef RINGLANE_WORKER_SERVER_DRAFT_RUNNER_H_
#define RINGLANE_WORKER_SERVER_DRAFT_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache.h"
#include "worker/round.h"

namespace ringlane::worker {

// Most tokens one proposal holds (WorkerInfo.max_proposed_drafts).
inline constexpr int kMaxProposedDrafts = 16;
// Lanes that can propose in one round; beyond them a round's other lanes
// get no proposal (their rows are still fed).
inline constexpr int kMaxProposingLanes = 64;

class DraftRunner {
 public:
  // `draft` is an unsharded backend of the draft model; its pool is
  // allocated here for `target_pool`'s block ids plus scratch blocks.
  // InvalidArgument when the draft's vocabulary differs from `target_vocab`
  // or its context is shorter than `target_context`; the pool's errors.
  static absl::StatusOr<std::unique_ptr<DraftRunner>> Create(std::unique_ptr<Backend> draft,
                                                             const KvPoolSpec& target_pool,
                                                             int target_vocab,
                                                             int64_t target_context);

  // What the draft model does with one sequence of the target's round.
  struct Feed {
    uint64_t lane = 0;
    // Tokens of the sequence to feed (its accepted prefix: rejected drafts
    // are left out).
    int keep = 0;
    // The row sampled `next` after its kept tokens (the lane's last sample).
    bool has_next = false;
    int32_t next = 0;
    // Greedy tokens to propose after `next`; 0 for none.
    int propose = 0;
    // A lane's first row: the tokens of the positions before it
    // (LaneStep.prefix_token_ids), for those the draft pool lacks.
    absl::Span<const int32_t> prefix;
  };

  // Whether Run needs the target's hidden states (RoundInput::want_hidden).
  bool wants_hidden() const { return mtp_; }

  // Feeds `round`'s block copies and sequences (one Feed per sequence) and
  // returns each sequence's proposal (empty where none was asked, or where
  // the draft model could not run: the reason is logged). `target` is the
  // target's output for the round (its hidden states, for an MTP drafter).
  std::vector<std::vector<int32_t>> Run(const RoundInput& round, absl::Span<const Feed> feeds,
                                        const RoundOutput& target);

  // The lane is gone: drop what is kept for it.
  void Forget(uint64_t lane) {
    pending_.erase(lane);
    lag_.erase(lane);
    DropPrefix(lane);
  }
  // The target's block was written from outside a round (restored from the
  // kvstore or imported from another rank): its draft entries are stale.
  void Invalidate(int32_t block) {
    if (block >= 0 && block < target_blocks_) valid_[static_cast<size_t>(block)] = 0;
  }
  // Leading positions of the target's block whose draft entries hold what
  // the target's block holds (tests).
  int valid_positions(int32_t block) const {
    return block >= 0 && block < target_blocks_ ? valid_[static_cast<size_t>(block)] : 0;
  }
  // Prefix tokens kept for lanes until they are fed (tests).
  int64_t prefix_tokens() const { return prefix_total_; }
  // Tokens of `lane` kept but not yet fed to the draft model.
  int64_t lag_tokens(uint64_t lane) const {
    auto it = lag_.find(lane);
    return it == lag_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size());
  }

  int scratch_blocks() const { return scratch_blocks_; }
  // Tokens proposed and draft forward passes run, since creation.
  int64_t proposed_tokens() const { return proposed_; }
  int64_t passes() const { return passes_; }
  // Microseconds the last Run spent in its passes after the first: the cost
  // of proposing, beyond feeding the round.
  int64_t last_propose_us() const { return last_propose_us_; }
  // Prefix tokens the last Run fed because the draft's entries of them were
  // stale (LaneStep.prefix_token_ids).
  int64_t last_prefix_fed() const { return last_prefix_fed_; }

 private:
  DraftRunner(std::unique_ptr<Backend> draft, int target_blocks, int scratch_blocks);
  // Runs one draft round and takes each asking sequence's argmax; with
  // `last_hidden`, each sequence's last hidden state too (MTP).
  absl::Status StepArgmax(const RoundInput& in, std::vector<int32_t>* argmax,
                          std::vector<std::vector<float>>* last_hidden = nullptr);
  // A lane's proposal in the making.
  struct Proposing {
    size_t seq;        // in the target's round
    size_t draft_seq;  // in the first draft round
    int64_t next_pos;  // where the next step's row goes
    int left;          // tokens still to propose
    std::vector<int32_t> blocks;
    std::vector<float> own;  // MTP: its last output, the next step's hidden state
  };
  // The first draft round (the target's rows as the draft model takes them)
  // and the lanes that propose, of a draft model and of an MTP drafter.
  void FeedModel(const RoundInput& round, absl::Span<const Feed> feeds, RoundInput* first,
                 std::vector<Proposing>* proposing);
  void FeedMtp(const RoundInput& round, absl::Span<const Feed> feeds, const RoundOutput& target,
               RoundInput* first, std::vector<Proposing>* proposing);
  // `t`'s last token (at `position`) asks for the first of up to `propose`
  // drafts: its logits, scratch blocks for the later ones, and the lane in
  // `proposing`. False, `t` unchanged, when none fit (context, scratch).
  bool StartProposal(size_t seq, int64_t position, int propose, size_t draft_seq, SeqStep* t,
                     int* scratch_next, std::vector<Proposing>* proposing);
  // Runs the first round, then one position a pass for the proposing lanes;
  // false when the first round failed.
  bool Propose(const RoundInput& first, std::vector<Proposing>* proposing,
               std::vector<std::vector<int32_t>>* proposals);
  // Scratch blocks after `blocks` so that they cover position `last`; false
  // when this round's scratch is used up.
  bool CoverWithScratch(int64_t last, std::vector<int32_t>* blocks, int* scratch_next) const;
  void LogFailure(const absl::Status& st);

  // An MTP drafter's entry waiting for its next token.
  struct Pending {
    int64_t position = 0;
    std::vector<float> hidden;
  };
  // More lanes than this waiting means lanes were never released (a stream
  // that vanished): start over rather than grow.
  static constexpr size_t kMaxPending = 4096;
  // A lane's kept tokens not yet fed, from position `from` on. Past
  // kMaxLagTokens they are fed as a chunk (memory stays bounded).
  struct Lag {
    int64_t from = 0;
    std::vector<int32_t> tokens;
  };
  static constexpr size_t kMaxLagTokens = 8192;

  // A lane's prefix tokens the draft pool lacked at its first row,
  // positions [from, from + tokens.size()), kept until the lane is fed.
  struct Prefix {
    int64_t from = 0;
    std::vector<int32_t> tokens;
  };
  // At most this many prefix tokens are kept over all lanes; a prefix past
  // it is not kept, and that lane's drafts read stale entries (acceptance
  // only).
  static constexpr int64_t kMaxPrefixTokens = int64_t{1} << 20;
  void KeepPrefix(uint64_t lane, const SeqStep& s, absl::Span<const int32_t> prefix);
  void DropPrefix(uint64_t lane);
  // The first position before `end` whose draft entry in `blocks` is stale
  // (`end` when none is).
  int64_t FirstStale(absl::Span<const int32_t> blocks, int64_t end) const;
  // A draft pass will feed `t`: its tokens start with the lane's kept
  // prefix where the draft pool lacks positions before t->start_position.
  void PrependPrefix(uint64_t lane, SeqStep* t);
  // Validity bookkeeping: the target wrote `s`'s positions (its block
  // copies first); the draft model wrote `fed` positions of `t` from its
  // start.
  void TargetWrote(const RoundInput& round);
  // Calls f(block, lo, hi) for each target block (not scratch) of `s`'s
  // table holding positions [s.start_position, end): they are its
  // positions [lo, hi).
  template <class F>
  void ForEachTargetBlock(const SeqStep& s, int64_t end, F&& f) const;
  void DraftFed(const SeqStep& t, int64_t fed);

  std::unique_ptr<Backend> draft_;
  const int target_blocks_;
  const int scratch_blocks_;
  const bool mtp_;
  absl::flat_hash_map<uint64_t, Pending> pending_;
  absl::flat_hash_map<uint64_t, Lag> lag_;
  absl::flat_hash_map<uint64_t, Prefix> prefix_;
  int64_t prefix_total_ = 0;
  // Per target block: how many leading positions of the draft pool's block
  // hold the draft model's entries of the tokens the target's block holds.
  // Cut back where the target writes (a block reused for other tokens) or a
  // block is restored or imported; extended where the draft model is fed.
  std::vector<int32_t> valid_;
  int64_t proposed_ = 0;
  int64_t passes_ = 0;
  int64_t last_propose_us_ = 0;
  int64_t last_prefix_fed_ = 0;
  int64_t failures_ = 0;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_DRAFT_RUNNER_H_
