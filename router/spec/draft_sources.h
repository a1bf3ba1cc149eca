// Where drafts come from: the sources the Speculator (speculator.h) asks for
// a lane's next tokens. Each keeps what it needs per lane, built lazily from
// the lane's sequence (prompt and output) as it grows, and dropped by
// Forget. None of them affects what is generated: a wrong draft only costs
// a verify position.
//
// - ngram ("prompt lookup"): the continuation of the most recent earlier
//   occurrence of the sequence's last n tokens (n from ngram_max down to
//   ngram_min); strong where output copies input (rewriting, code edits).
// - suffix (suffix decoding): a per-request suffix trie over the lane's
//   last `suffix_window` tokens and the model's global one over recent
//   outputs (SuffixCache), proposing the most frequent continuation of the
//   longest matching suffix, as deep as the match is long (times
//   suffix_depth_factor): agent loops repeat themselves across turns.
// - random: uniform tokens of the vocabulary, nearly always wrong; the
//   stand-in for a bad draft model that shows adaptive depth backing off.
// - model: the proposals of the workers' draft model (the worker's
//   --draft_model), delivered with a round's result (OnProposed) and good
//   for the lane's next row only if they follow exactly its sequence.
#ifndef RINGLANE_ROUTER_SPEC_DRAFT_SOURCES_H_
#define RINGLANE_ROUTER_SPEC_DRAFT_SOURCES_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "router/spec/suffix_trie.h"

namespace ringlane::router {

struct DraftSourceOptions {
  int ngram_min = 2;
  int ngram_max = 4;
  // Suffix tries: depth (pattern + continuation), longest pattern matched,
  // the per-request window, and drafts per matched token.
  int suffix_depth = 24;
  int suffix_max_pattern = 12;
  int suffix_window = 2048;
  double suffix_depth_factor = 2.0;
  // A continuation stops at a token seen less than this fraction of the
  // times its context was.
  double suffix_min_fraction = 0.1;
  // Tokens of recent outputs the global suffix cache keeps.
  int64_t suffix_cache_tokens = 65536;
  int32_t vocab_size = 0;
  uint64_t random_seed = 0x5eed;
};

// What one source proposes for one lane.
struct Proposal {
  std::vector<int32_t> tokens;
  // Context tokens the proposal matched (0 for sources that do not match).
  int match_length = 0;
  // The source will have drafts only once the lane's row in flight has
  // returned (the workers' draft model): `tokens` holds placeholders, as
  // many as it expects to propose, for deciding whether to wait for them.
  bool pending = false;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual const char* name() const = 0;
  // Up to `max_drafts` tokens to follow `seq` (the lane's prompt and output
  // so far) and then `tail`: tokens assumed to follow seq (the drafts of a
  // row in flight), matched against but never kept in the source's
  // per-lane state, since they may be rejected. `lane` keys that state.
  virtual Proposal ProposeAfter(uint64_t lane, absl::Span<const int32_t> seq,
                                absl::Span<const int32_t> tail, int max_drafts) = 0;
  Proposal Propose(uint64_t lane, absl::Span<const int32_t> seq, int max_drafts) {
    return ProposeAfter(lane, seq, {}, max_drafts);
  }
  virtual void Forget(uint64_t lane) {}
  // Sources the workers draft for: how many tokens to ask the workers to
  // propose after a row of `lane` (0: this source asks for none).
  virtual bool worker_proposed() const { return false; }
  // The workers proposed `tokens` to follow the first `seq_len` tokens of
  // the lane's sequence.
  virtual void OnProposed(uint64_t lane, int64_t seq_len, absl::Span<const int32_t> tokens) {}
  // A lane finished: `seq` is its prompt and output, of which the first
  // `prompt_len` tokens are the prompt.
  virtual void Finished(absl::Span<const int32_t> seq, int64_t prompt_len) {}
  // Lanes it keeps state for (tests).
  virtual size_t lanes() const { return 0; }
};

// The global suffix trie of one model's recent outputs, shared by every
// group's Speculator. Thread-safe.
class SuffixCache {
 public:
  SuffixCache(int depth, int64_t max_tokens) : trie_(depth), max_tokens_(max_tokens) {}
  // Indexes one finished output (with the end of its prompt before it, so
  // a resend matches from its first generated token); the oldest outputs go
  // once more than max_tokens are kept.
  void Add(std::vector<int32_t> tokens);
  // The global proposal for `context`; see SuffixTrie.
  Proposal Propose(absl::Span<const int32_t> context, int max_pattern, double depth_factor,
                   double min_fraction, int max_drafts) const;
  int64_t tokens() const;

 private:
  mutable absl::Mutex mu_;
  SuffixTrie trie_ ABSL_GUARDED_BY(mu_);
  std::deque<std::vector<int32_t>> kept_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  const int64_t max_tokens_;
};

// `name` is ngram, suffix, random or model; null for another name. `cache` is used
// by suffix only.
std::unique_ptr<DraftSource> MakeDraftSource(const std::string& name,
                                             const DraftSourceOptions& options,
                                             std::shared_ptr<SuffixCache> cache);

// The names MakeDraftSource knows, for flag help and messages.
const std::vector<std::string>& DraftSourceNames();

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SPEC_DRAFT_SOURCES_H_
