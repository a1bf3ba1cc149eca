#include "router/request/loop_watchdog.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::router {

absl::StatusOr<LoopDetector> LoopDetector::Create(const LoopWatchdogOptions& options) {
  if (options.max_period < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("loop watchdog: max_period must be >= 1, got ", options.max_period));
  }
  if (options.max_period > kMaxLoopPeriod) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loop watchdog: max_period must be <= ", kMaxLoopPeriod, ", got ", options.max_period));
  }
  if (options.flag_repeats < 2) {
    // One occurrence is any text at all; flagging needs an actual repeat.
    return absl::InvalidArgumentError(
        absl::StrCat("loop watchdog: flag_repeats must be >= 2, got ", options.flag_repeats));
  }
  if (options.stop_after_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loop watchdog: stop_after_tokens must be >= 0, got ", options.stop_after_tokens));
  }
  return LoopDetector(options);
}

LoopDetector::LoopDetector(const LoopWatchdogOptions& options)
    : options_(options), ring_(options.max_period), run_(options.max_period + 1, 0) {}

LoopDetector::Verdict LoopDetector::Feed(int32_t token) {
  Verdict v;
  if (!options_.enabled) {
    ++num_tokens_;
    return v;
  }
  const int max_p = options_.max_period;
  const int64_t i = num_tokens_;
  // Periods longer than the text so far have no earlier token to compare;
  // their run stays 0.
  const int64_t limit = i < max_p ? i : max_p;
  for (int p = 1; p <= limit; ++p) {
    // ring_ still holds t[i-p] here: slot i % max_p is overwritten below, and
    // for p == max_p that slot is exactly t[i-max_p].
    run_[p] = ring_[(i - p) % max_p] == token ? run_[p] + 1 : 0;
  }
  ring_[i % max_p] = token;
  num_tokens_ = i + 1;

  const int64_t need = options_.flag_repeats - 1;
  const int64_t stop_after = options_.stop_after_tokens;
  for (int p = 1; p <= limit; ++p) {
    if (run_[p] < need * p) continue;
    if (!v.looping) {
      v.looping = true;
      v.period = p;
      v.repeated_tokens = run_[p];
    }
    // A longer cycle can have run far longer than the smallest one that
    // also fits the tail (a long cycle ending in "a a a a"), so any looping
    // period may trigger the stop.
    if (stop_after > 0 && run_[p] >= stop_after) v.should_stop = true;
  }
  if (v.looping && !flagged_) {
    flagged_ = true;
    v.flagged_now = true;
  }
  return v;
}

}  // namespace ringlane::router
