#include "tools/bench/prompts.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::bench {
namespace {

// Common words of simple English stories: short, and single tokens in most
// tokenizers, including the bundled model's 512-entry one.
constexpr const char* kWords[] = {
    "the",   "a",     "and",    "was",  "he",    "she",  "it",   "to",     "of",     "in",
    "big",   "dog",   "cat",    "day",  "sun",   "tree", "ball", "girl",   "boy",    "mom",
    "happy", "red",   "run",    "play", "park",  "toy",  "bird", "fish",   "home",   "went",
    "saw",   "had",   "said",   "they", "with",  "on",   "her",  "his",    "is",     "very",
    "good",  "fun",   "see",    "like", "time",  "one",  "not",  "little", "friend", "look",
    "made",  "could", "wanted", "were", "there", "then", "so",   "up",     "at",     "for"};

// Tokens per repetition of `word` in a text of repeated words: 1 for the
// words we keep.
absl::StatusOr<int64_t> RepeatCost(const std::string& word, const CountTokensFn& count) {
  std::string eight = word;
  for (int i = 1; i < 8; ++i) eight += " " + word;
  absl::StatusOr<int64_t> a = count(eight);
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> b = count(eight + " " + eight);
  if (!b.ok()) return b.status();
  const int64_t diff = *b - *a;
  return diff % 8 == 0 ? diff / 8 : -1;
}

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double UnitFromBits(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

PromptBuilder::PromptBuilder() : words_(std::begin(kWords), std::end(kWords)) {}

absl::Status PromptBuilder::Calibrate(const CountTokensFn& count) {
  std::vector<std::string> kept;
  for (const std::string& w : words_) {
    absl::StatusOr<int64_t> cost = RepeatCost(w, count);
    if (!cost.ok()) return cost.status();
    if (*cost == 1) kept.push_back(w);
  }
  // Fewer than a handful would make prompts repetitive enough to trip loop
  // detectors; keep them all then and let Make's counting do the work.
  if (kept.size() >= 8) words_ = std::move(kept);
  const std::string probe = Words(64, 0);
  absl::StatusOr<int64_t> c = count(probe);
  if (!c.ok()) return c.status();
  overhead_ = std::max<int64_t>(0, *c - 64);
  calibrated_ = true;
  return absl::OkStatus();
}

std::string PromptBuilder::Words(int n, uint64_t salt) const {
  std::string out;
  uint64_t state = Mix64(salt);
  for (int i = 0; i < n; ++i) {
    state = Mix64(state);
    if (i > 0) out += ' ';
    out += words_[state % words_.size()];
  }
  return out;
}

absl::StatusOr<Prompt> PromptBuilder::Make(int tokens, uint64_t salt,
                                           const CountTokensFn* count) const {
  Prompt best;
  if (count == nullptr || !calibrated_) {
    best.text = Words(tokens, salt);
    best.tokens = tokens;
    return best;
  }
  // Words are mostly one token each, so this converges in one or two counts;
  // a word that merges with its neighbour costs another round.
  int n = std::max<int>(1, tokens - static_cast<int>(overhead_));
  bool have_best = false;
  for (int attempt = 0; attempt < 6; ++attempt) {
    std::string text = Words(n, salt);
    absl::StatusOr<int64_t> c = (*count)(text);
    if (!c.ok()) return c.status();
    const bool fits = *c <= tokens;
    if (fits && (!have_best || *c > best.tokens)) {
      best = {std::move(text), *c, true};
      have_best = true;
    }
    if (*c == tokens) break;
    const int next = std::max(1, n + static_cast<int>(tokens - *c));
    if (next == n) break;
    n = next;
  }
  if (!have_best) {
    best.text = Words(1, salt);
    absl::StatusOr<int64_t> c = (*count)(best.text);
    if (!c.ok()) return c.status();
    best.tokens = *c;
    best.exact = true;
  }
  return best;
}

}  // namespace ringlane::bench
