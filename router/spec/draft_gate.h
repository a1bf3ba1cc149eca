// Whether drafting pays at all, measured rather than predicted: for each
// number of decoding lanes, the group's throughput (tokens the rounds gave
// lanes per microsecond of result-to-result time) in rounds where lanes
// draft against rounds where none does, and drafting stopped where it
// loses.
//
// Why a measurement. The speculator's depth rule prices a draft position
// by the linear round-cost model, which holds where decode is memory-bound
// (a GPU; the weights read once whatever the rows). On a compute-bound
// worker a round costs about max(weight reads, rows x compute), and a
// draft model's passes and a drafting lane's lost pipelining come on top:
// measured on the synthetic 1.1B FP8 model at 2 threads with a 2-layer
// self-drafter that is always right, five lanes drafting 7 tokens each ran
// at 0.80x of plain decode (tools/spec_bench.sh), where the linear fit
// predicted a gain. What the rounds give is what decides.
//
// Rounds are classed when planned: "drafting" while a lane drafts (or
// waits to) at the depth the speculator chose, "plain" while none does,
// and neither while only probes are out (a probe's round says nothing of
// drafting at depth). A bucket starts closed until it has seen `window`
// plain rounds (cheap: plain rounds are the short ones), then opens; every
// `drafting_window` drafting rounds it compares their rate with the plain
// rate and closes when drafting is more than `margin` slower. Closed, it
// re-opens once the rounds where a lane wanted to draft have taken
// `hold_factor` times as long as the drafting rounds that closed it (and
// at least `min_hold` of them), so re-checking costs a few percent of the
// time however long a drafting round is (at five lanes a verify round took
// 4x as long as a plain one); a re-check that closes again doubles the
// factor, up to `max_hold_factor`. It re-opens at once when the wanted
// drafts promise half again as many tokens per step as when it closed (the
// workload changed: an agent repeating an earlier answer). Rounds that
// prefilled and rounds after idle are not measured, nor the first `settle`
// rounds after a switch (their period straddles the two modes).
//
// Not thread-safe: the group's thread only.
#ifndef RINGLANE_ROUTER_SPEC_DRAFT_GATE_H_
#define RINGLANE_ROUTER_SPEC_DRAFT_GATE_H_

#include <array>
#include <cstdint>

namespace ringlane::router {

struct DraftGateOptions {
  int window = 8;
  int drafting_window = 4;
  int settle = 1;
  double hold_factor = 16;
  double max_hold_factor = 256;
  int min_hold = 16;
  double margin = 0.05;
};

class DraftGate {
 public:
  // Lane counts share a bucket by powers of two (1, 2, 3-4, 5-8, ...; 65
  // and more the last): neighbours mostly agree, and a bucket fills fast.
  static constexpr int kBuckets = 8;
  enum class Regime { kPlain = 0, kDrafting = 1, kNeither = 2 };

  explicit DraftGate(DraftGateOptions options = {});

  // Whether rounds with `lanes` decoding lanes may draft.
  bool IsOpen(int64_t lanes) const { return buckets_[Bucket(lanes)].open; }
  // A lane of a round with `lanes` decoding lanes wanted drafts promising
  // `expected_tokens` per step (1 + the expected accepted drafts), whether
  // or not the gate let it draft.
  void NoteWanted(int64_t lanes, double expected_tokens);
  // The tag of a round planned with `lanes` decoding lanes under the
  // gate's present mode, for Observe with its result; `wanted`: some lane
  // wanted to draft.
  int Tag(int64_t lanes, Regime regime, bool wanted) const;
  static bool TagOpen(int tag) { return (tag >> 3) % 2 == 1; }
  // The round tagged `tag` gave lanes `tokens` tokens in `period_us` since
  // the previous round's result.
  void Observe(int tag, int64_t tokens, double period_us);

  // Measured tokens per second of a bucket's plain and drafting rounds (0
  // until measured).
  double TokensPerSecond(int64_t lanes, Regime regime) const;

 private:
  struct Yield {
    double tokens = 0;
    double us = 0;
    double Rate() const { return us > 0 ? tokens / us : 0; }
    void Add(double decay, double t, double u) {
      tokens = decay * tokens + t;
      us = decay * us + u;
    }
  };
  struct BucketState {
    bool open = false;
    // Closed only to learn the plain rate.
    bool learning_plain = true;
    // Opened again after a closure: closing at the next decision doubles
    // the hold.
    bool rechecking = false;
    int settle = 0;
    // Open: drafting rounds since the last decision, and their time.
    // Closed: rounds where drafting was wanted since closing, and theirs.
    int rounds = 0;
    double rounds_us = 0;
    // Closed: how long the wanted rounds must take before a re-check.
    double hold_factor = 0;
    double hold_us = 0;
    int64_t plain_rounds = 0;
    Yield plain, drafting;
    double expected = 0;
    double expected_at_close = 0;
  };
  static int Bucket(int64_t lanes);
  void Switch(BucketState& b, bool open);
  void Decide(BucketState& b);

  DraftGateOptions o_;
  std::array<BucketState, kBuckets> buckets_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SPEC_DRAFT_GATE_H_
