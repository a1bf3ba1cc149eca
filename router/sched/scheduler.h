// The pure decisions of the round scheduler, apart from threads and RPCs so
// that tests can drive them: how long a round will take, how many prompt
// tokens a round may prefill, and which lane to preempt.
#ifndef RINGLANE_ROUTER_SCHED_SCHEDULER_H_
#define RINGLANE_ROUTER_SCHED_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace ringlane::router {

// Predicts one group's round time from what the round feeds:
//   round_us ~= fixed_us + per_token_us * tokens + per_attended_us * attended
// where `attended` counts (token, earlier position) pairs of attention: a row
// of n tokens starting at position p attends n * (p + (n + 1) / 2). A forward
// pass reads every weight once whatever the batch (the fixed part: weights,
// collectives, RPC), pays per fed token for the matmul rows, and per attended
// pair for attention, which grows with the context: a 500-token chunk at
// position 2500 costs far more than at position 0. Without the context term
// the model underestimated late chunks of a long prompt (measured: decoding
// lanes' worst gap 103 ms against a 50 ms target, tools/router_bench.sh).
//
// The fit is weighted least squares over every observed round, older rounds
// weighted down by `decay` per round, so the model tracks load changes
// (other tenants on the cores) within a few dozen rounds. While the rounds
// seen cannot separate the two slopes (all decode rows, say), or separating
// them gives a negative one, the context term is dropped (tokens only).
//
// Small rounds are also kept per size (SmallRoundUs): on a CPU worker a
// matmul is memory-bound for a few rows and compute-bound after, so the cost
// of n rows is not linear where speculative decoding chooses its depth
// (measured on the 1.1B FP8 model, 2 cores: 5 rows cost 1.7x one row and 9
// rows 4.2x, where the fit, led by prefill chunks, says 1.2x and 1.5x).
// Not thread-safe; owned by a group's scheduler thread.
class RoundCostModel {
 public:
  // Round sizes kept apart, and the observations a size needs to count.
  static constexpr int64_t kTableTokens = 64;
  static constexpr int kTableMinSamples = 2;

  explicit RoundCostModel(double decay = 0.97) : decay_(decay) {}

  // `worker_us`: the workers' own part of round_us (their compute and
  // collectives), which the per-size table follows; < 0: all of round_us.
  void Observe(int64_t tokens, double round_us, double attended = 0, double worker_us = -1);

  // Rounds observed so far.
  int64_t samples() const { return samples_; }
  // Whether the fit has seen enough rounds of different sizes to predict.
  bool ready() const;
  double fixed_us() const { return Fit().fixed; }
  // 0 when the rounds seen do not show time growing with tokens.
  double per_token_us() const { return Fit().per_token; }
  double per_attended_us() const { return Fit().per_attended; }
  double PredictUs(int64_t tokens, double attended = 0) const {
    const Coefficients c = Fit();
    return c.fixed + c.per_token * static_cast<double>(tokens) + c.per_attended * attended;
  }
  // The time of a round of `tokens` tokens: a one-token round's time plus
  // what the workers spend on the tokens beyond it, both as measured per size
  // (decayed means of the recent rounds of exactly that many tokens); a size
  // not measured continues the slope below the nearest measured size under
  // it, capped by the chord to the next measured size above (optimistic, so
  // that the speculator tries it and it gets measured), and past the last
  // measured size the cheaper of that slope and the fit's; the fit's
  // prediction where no size was seen. The workers' part, not the round's, measures the extra
  // tokens: a round that waits for its result (a verify row) and one pipelined behind another
  // differ in latency, not in work, and the speculator weighs the latency apart
  // (Speculator::LatencyRatio).
  double SmallRoundUs(int64_t tokens) const;

 private:
  struct Coefficients {
    double fixed = 0, per_token = 0, per_attended = 0;
  };
  Coefficients Fit() const;

  double decay_;
  int64_t samples_ = 0;
  // Decayed sums of weights, x1 (tokens), x2 (attended), y (round time) and
  // their products.
  double w_ = 0, s1_ = 0, s2_ = 0, sy_ = 0, s11_ = 0, s12_ = 0, s22_ = 0, s1y_ = 0, s2y_ = 0;
  // The workers' time of a round of `tokens` tokens from the per-size table
  // (see SmallRoundUs).
  double WorkerUs(int64_t tokens) const;
  // Per round size up to kTableTokens: the decayed mean worker time and how
  // many rounds of that size were seen; and the decayed mean round time of
  // one-token rounds, the base SmallRoundUs adds to.
  std::array<double, kTableTokens + 1> size_worker_mean_{};
  double one_token_mean_ = 0;
  std::array<int64_t, kTableTokens + 1> size_count_{};
};

// Attention pairs of a row of `tokens` tokens starting at `start`.
inline double AttendedPairs(int64_t start, int64_t tokens) {
  return static_cast<double>(tokens) * (static_cast<double>(start) + (tokens + 1) / 2.0);
}

// How many prompt tokens one round may feed besides its decode rows.
//
// Without decoding lanes, nobody waits on the round: the whole token budget
// (less the decode rows) goes to prefill. With decoding lanes, every round is
// one inter-token gap for each of them, so the round is sized so that the
// model's predicted time (decode rows attending `decode_attended` pairs, the
// chunk starting at position `prefill_start`) stays under `itl_target_us`.
// Until the model can predict, decoders get `min_chunk`-sized rounds, which
// also give the fit the varied sizes it needs. The result is never below
// `min_chunk` (a long prompt must progress even when the target cannot be
// met, e.g. because decode rows alone exceed it), nor above the budget left
// after the decode rows; 0 only when decode rows use the whole budget.
int64_t PrefillTokenLimit(int64_t num_decode_rows, int64_t round_token_budget, double itl_target_us,
                          const RoundCostModel& model, int64_t min_chunk,
                          double decode_attended = 0, int64_t prefill_start = 0);

// A lane as the preemption choice sees it.
struct PreemptCandidate {
  // Admission order: larger is younger.
  uint64_t admit_seq = 0;
  // Already has a row in the round being planned: its KV must stay.
  bool in_plan = false;
  // Holds any blocks at all (a lane with none frees nothing).
  bool holds_blocks = true;
};

// The index of the lane to preempt when the pool runs out: the youngest one
// not already in the plan. The youngest has had the least work invested in
// it and the least time waited, so recomputing it costs the least and the
// oldest requests keep making progress (no livelock between two long lanes).
// nullopt when no lane qualifies.
std::optional<size_t> PickPreemptionVictim(absl::Span<const PreemptCandidate> lanes);

// Whether a request of `num_lanes` choices may join a waiting queue that
// holds `waiting` choices, with at most `max_waiting` waiting. A request
// larger than the whole limit is accepted when the queue is empty, so that
// max_waiting smaller than the largest allowed n cannot reject every such
// request.
bool AdmitToQueue(int64_t waiting, int64_t num_lanes, int64_t max_waiting);

// Tokens a choice will have generated once every round planned so far has
// returned. `generated_before` is what the choice had when its lane started
// (after a preemption, part of the lane's prompt of `prompt_len` tokens);
// `fed` is the lane's planned positions. The prompt's last chunk samples one
// token and each position past the prompt (a decode row) one more.
//
// With rounds pipelined the router plans a lane's next decode row before
// the previous token arrived; this count lets it stop at max_tokens instead
// of computing a token it would discard.
int64_t TokensAfterPlannedRounds(int64_t generated_before, int64_t prompt_len, int64_t fed);

// How long the workers spent on one round, in microseconds, from when it was
// sent (`sent_us`), when the round before it returned (`previous_done_us`,
// any earlier value when there was none) and when it returned (`done_us`),
// all on one clock. A round sent ahead waits behind the previous one; that
// wait is not its cost, so the cost model would otherwise learn round times
// twice too long and shrink prefill chunks for nothing.
double RoundBusyUs(double sent_us, double previous_done_us, double done_us);

// One line of the round log (--round_log): what a round fed, for tests and
// for reading a trace after the fact.
struct RoundLogRow {
  enum class Kind { kPrefill, kDecode, kRelease };
  uint64_t lane_id = 0;
  Kind kind = Kind::kDecode;
  int64_t start_position = 0;
  int64_t tokens = 0;  // positions fed (0 for a release-only row)
  bool sample = false;
  std::string request_id;  // empty when the lane is already gone
};
struct RoundLogEntry {
  uint64_t round_id = 0;
  size_t group = 0;
  int64_t token_budget = 0;
  // Rounds of the group already sent and not yet returned when this one was
  // sent: 0 without pipelining.
  int64_t in_flight = 0;
  std::vector<RoundLogRow> rows;
};
// One JSON object on one line, no newline:
//   {"round":7,"group":0,"budget":64,"in_flight":1,"tokens":19,"rows":[
//     {"lane":3,"kind":"decode","start":40,"tokens":1,"sample":true,"request":"r1"},...]}
// "tokens" at the top is the sum over rows: the round's fed tokens.
std::string FormatRoundLog(const RoundLogEntry& entry);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_SCHEDULER_H_
