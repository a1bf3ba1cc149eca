// One round: the unit of work the scheduler hands a worker group. Several
// sequences (lanes), each with a span of new tokens at consecutive positions —
// a prefill chunk of any length, one decode token, or tokens to verify — and
// the physical KV blocks that hold its context. The engine never allocates
// blocks; the caller (the router's block manager, or a test's allocator) names
// them.
#ifndef RINGLANE_WORKER_ROUND_H_
#define RINGLANE_WORKER_ROUND_H_

#include <cstdint>
#include <vector>

namespace ringlane::worker {

struct SeqStep {
  // Absolute position of tokens[0]; positions [0, start_position) are already
  // in the KV blocks.
  int64_t start_position = 0;
  std::vector<int32_t> tokens;
  // block_ids[i] holds positions [i * block_size, (i + 1) * block_size); must
  // cover every position up to start_position + tokens.size().
  std::vector<int32_t> block_ids;
  // Indices into `tokens` whose next-token logits are wanted, e.g. the last
  // token of a finished prefill, or every verified draft position.
  std::vector<int32_t> logit_offsets;
  // MTP drafters only (ModelConfig::mtp_drafter): per token, the hidden state
  // it is drafted from ([tokens.size()][hidden]).
  std::vector<float> hidden_in;
  // Models with recurrent layers (LayerCacheSpec kRecurrentState): the state
  // slot that holds this sequence's state after position start_position - 1
  // (reset when start_position is 0), and holds it after the last token once
  // the round has run. No two sequences of a round share a slot. -1: none.
  int32_t state_slot = -1;
  // With state_slot: copy this checkpoint (which must hold the state after
  // position start_position - 1) into the slot before the round runs; -1:
  // none. And save the state after tokens[offset] into checkpoint `slot`.
  int32_t restore_checkpoint = -1;
  struct StateSave {
    int32_t offset = 0;
    int32_t slot = 0;
  };
  std::vector<StateSave> state_saves;
  // Models with recurrent layers and a KDA chunk (LinearAttentionConfig::
  // chunk): rows of whole chunks at absolute multiples of the chunk that end
  // at or before this position run in the chunked form, every other row
  // through the recurrence. The two forms agree only to rounding, so the
  // bits of a sequence's state depend on this limit and on where its rounds
  // cut it inside the limit: the router gives every row of a lane the same
  // limit (the whole chunks of its request's prompt) and cuts prefill only
  // at chunk ends below it. 0: all rows recurrent.
  int64_t linear_chunked_until = 0;
};

// Copy KV block `src` onto `dst` (every layer, every slot) before the
// round's sequences run.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

struct RoundInput {
  std::vector<SeqStep> seqs;
  // Done in order, after validation and before the forward pass, so a
  // sequence may read positions a copy brought into its blocks.
  std::vector<BlockCopy> block_copies;
  // Return each sequence's hidden states (RoundOutput::hidden): what an MTP
  // drafter drafts from. Graphs without one return none.
  bool want_hidden = false;
};

struct RoundOutput {
  // Per sequence: logit_offsets.size() rows of `vocab` floats, in order.
  std::vector<std::vector<float>> logits;
  int vocab = 0;
  // With RoundInput::want_hidden, per sequence: [tokens.size()][hidden] of
  // every new token: after the final norm for a model, the MTP layer's
  // output (before its head's norm) for an MTP drafter. Empty otherwise.
  std::vector<std::vector<float>> hidden;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_ROUND_H_
