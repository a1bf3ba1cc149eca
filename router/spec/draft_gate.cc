#include "router/spec/draft_gate.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/log.h"

namespace ringlane::router {

namespace {

// Decay per sample: the plain rate is the hardware's and changes slowly;
// the drafting rate follows acceptance, which follows the text.
constexpr double kPlainDecay = 0.97;
constexpr double kDraftingDecay = 0.9;
constexpr double kExpectedDecay = 0.9;
// Wanted drafts promising this much more than when the gate closed
// re-open it at once.
constexpr double kReopenGain = 1.5;

}  // namespace

DraftGate::DraftGate(DraftGateOptions options) : o_(options) {
  o_.window = std::max(1, o_.window);
  o_.drafting_window = std::max(1, o_.drafting_window);
  o_.settle = std::max(0, o_.settle);
  o_.hold_factor = std::max(1.0, o_.hold_factor);
  o_.max_hold_factor = std::max(o_.hold_factor, o_.max_hold_factor);
  o_.min_hold = std::max(1, o_.min_hold);
  o_.margin = std::clamp(o_.margin, 0.0, 0.9);
}

int DraftGate::Bucket(int64_t lanes) {
  int b = 0;
  for (int64_t top = 1; top < lanes && b < kBuckets - 1; top *= 2) ++b;
  return b;
}

int DraftGate::Tag(int64_t lanes, Regime regime, bool wanted) const {
  const int b = Bucket(lanes);
  return ((b * 2 + (buckets_[b].open ? 1 : 0)) * 2 + (wanted ? 1 : 0)) * 4 +
         static_cast<int>(regime);
}

double DraftGate::TokensPerSecond(int64_t lanes, Regime regime) const {
  const BucketState& b = buckets_[Bucket(lanes)];
  return 1e6 * (regime == Regime::kDrafting ? b.drafting.Rate() : b.plain.Rate());
}

void DraftGate::Switch(BucketState& b, bool open) {
  // Rare (a hold of at least `hold` rounds between closings): worth a line.
  const int index = static_cast<int>(&b - buckets_.data());
  const int64_t low = index == 0 ? 1 : (int64_t{1} << (index - 1)) + 1;
  const int64_t high = int64_t{1} << index;
  const std::string lanes = index + 1 == kBuckets ? absl::StrCat(low, " or more")
                            : low == high         ? absl::StrCat(low)
                                                  : absl::StrCat(low, "-", high);
  RL_LOG(INFO) << "speculation at " << lanes << " decoding lanes: drafting "
               << (open ? "on" : "off") << " (drafting rounds " << 1e6 * b.drafting.Rate()
               << " tok/s, plain " << 1e6 * b.plain.Rate() << " tok/s"
               << (b.learning_plain ? "; measuring plain decode" : "") << ")";
  b.open = open;
  b.settle = o_.settle;
  b.rounds = 0;
  b.rounds_us = 0;
  if (open) {
    b.drafting = {};  // measured afresh: acceptance may have changed
  } else {
    b.expected_at_close = b.expected;
  }
}

void DraftGate::NoteWanted(int64_t lanes, double expected_tokens) {
  BucketState& b = buckets_[Bucket(lanes)];
  b.expected = b.expected == 0
                   ? expected_tokens
                   : kExpectedDecay * b.expected + (1 - kExpectedDecay) * expected_tokens;
  if (!b.open && !b.learning_plain && b.expected > kReopenGain * b.expected_at_close) {
    b.rechecking = false;
    Switch(b, true);
  }
}

void DraftGate::Decide(BucketState& b) {
  const double window_us = b.rounds_us;
  b.rounds = 0;
  b.rounds_us = 0;
  const bool loses = b.drafting.Rate() < (1 - o_.margin) * b.plain.Rate();
  if (!loses) {
    b.rechecking = false;
    return;
  }
  b.hold_factor = b.rechecking && b.hold_factor > 0
                      ? std::min(2 * b.hold_factor, o_.max_hold_factor)
                      : o_.hold_factor;
  b.hold_us = b.hold_factor * window_us;
  b.rechecking = false;
  Switch(b, false);
}

void DraftGate::Observe(int tag, int64_t tokens, double period_us) {
  if (tag < 0 || tag >= kBuckets * 16 || period_us <= 0 || tokens < 0) return;
  const auto regime = static_cast<Regime>(tag % 4);
  const bool wanted = (tag / 4) % 2 == 1;
  BucketState& b = buckets_[tag / 16];
  // Planned before the bucket switched modes.
  if (TagOpen(tag) != b.open || regime == Regime::kNeither) return;
  if (b.settle > 0) {
    --b.settle;
    return;
  }
  if (regime == Regime::kPlain) {
    b.plain.Add(kPlainDecay, static_cast<double>(tokens), period_us);
    ++b.plain_rounds;
    if (b.open) return;
    if (b.learning_plain) {
      if (b.plain_rounds < o_.window) return;
      b.learning_plain = false;
      Switch(b, true);
      return;
    }
    if (!wanted) return;
    ++b.rounds;
    b.rounds_us += period_us;
    if (b.rounds >= o_.min_hold && b.rounds_us >= b.hold_us) {
      b.rechecking = true;
      Switch(b, true);
    }
    return;
  }
  if (!b.open) return;  // drafting rounds are planned only while open
  b.drafting.Add(kDraftingDecay, static_cast<double>(tokens), period_us);
  b.rounds_us += period_us;
  if (++b.rounds >= o_.drafting_window) Decide(b);
}

}  // namespace ringlane::router
