#ifndef RINGLANE_ROUTER_REQUEST_LOOP_WATCHDOG_H_
#define RINGLANE_ROUTER_REQUEST_LOOP_WATCHDOG_H_

// The loop watchdog: spots a lane whose generation has fallen into repeating
// a cycle of tokens, so the router can flag it (metric, log line) and, if the
// loop keeps going, stop it with its own finish reason.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::router {

// Largest max_period accepted: each lane holds O(max_period) state and pays
// O(max_period) per token.
inline constexpr int kMaxLoopPeriod = 4096;

struct LoopWatchdogOptions {
  // Off: Feed never reports a loop (a request's opt-out).
  bool enabled = true;
  // Longest cycle looked for, in tokens. Each token costs O(max_period).
  int max_period = 64;
  // Occurrences of a cycle in a row, counting the first, that flag the lane.
  // Small models legitimately say a phrase two or three times, so the
  // default leaves that alone; the bundled model's golden outputs peak at
  // 2.2 occurrences (period 14).
  int flag_repeats = 4;
  // Repeated tokens (see LoopDetector) after which the lane should stop;
  // 0: never stop, only flag.
  int stop_after_tokens = 256;
};

// Detects a periodic tail in one lane's generated tokens.
//
// Definitions, with t[0..n) the tokens fed so far. For a period p, the repeat
// run r(p) is the number of most recent positions i (i >= p) with
// t[i] == t[i-p], i.e. the tail of length r(p) + p has period p: one first
// occurrence of the cycle followed by r(p) repeated tokens. The tail contains
// the cycle k times in a row (counting the first) exactly when
// r(p) >= (k-1)*p.
// - Looping: some p in [1, max_period] has r(p) >= (flag_repeats-1)*p; the
//   reported period is the smallest such p (a cycle of 3 also repeats with
//   period 6, 9, ...).
// - Flagged: looping at any token so far (sticky; flagged_now marks the
//   first time, for the metric and the log line).
// - Should stop: looping with some period p (not necessarily the smallest)
//   and r(p) >= stop_after_tokens, i.e.
//   stop_after_tokens tokens of pure repetition since the first occurrence of
//   the cycle ended (a cycle repeated only in part counts token by token).
//
// Per token it keeps r(p) for every p, updated in O(max_period) from a ring
// of the last max_period tokens, so memory and time do not grow with context
// length. One per lane, fed by the thread that applies that lane's tokens;
// not thread-safe.
class LoopDetector {
 public:
  struct Verdict {
    bool looping = false;         // the tail repeats a cycle flag_repeats times now
    bool flagged_now = false;     // this token made the lane flagged for the first time
    bool should_stop = false;     // the loop has run stop_after_tokens repeated tokens
    int period = 0;               // smallest looping period, 0 when not looping
    int64_t repeated_tokens = 0;  // r(period), 0 when not looping
  };

  // InvalidArgument when max_period is outside [1, kMaxLoopPeriod], flag_repeats < 2 or
  // stop_after_tokens < 0 (checked even when disabled, so a bad flag fails
  // at startup rather than when a request opts in).
  static absl::StatusOr<LoopDetector> Create(const LoopWatchdogOptions& options);

  // Consumes the next generated token and judges the tail ending with it.
  Verdict Feed(int32_t token);

  bool flagged() const { return flagged_; }
  // Tokens fed so far.
  int64_t num_tokens() const { return num_tokens_; }

 private:
  explicit LoopDetector(const LoopWatchdogOptions& options);

  LoopWatchdogOptions options_;
  // The last max_period tokens; token i sits at ring_[i % max_period].
  std::vector<int32_t> ring_;
  // run_[p] = r(p) for p in [1, max_period]; run_[0] unused.
  std::vector<int64_t> run_;
  int64_t num_tokens_ = 0;
  bool flagged_ = false;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_LOOP_WATCHDOG_H_
