// Prompts of a given length in tokens, built from words. Every prompt is a
// word sequence drawn from a seeded generator (`salt`), so two prompts with
// different salts share no cached prefix, and the same salt gives the same
// text (a resend).
//
// With a server tokenizer (ringlane's /tokenize) the builder first keeps the
// words that cost exactly one token each, then sizes each prompt by counting
// it, so lengths are exact. Without one it assumes one token per word and
// marks the length approximate; the server's usage.prompt_tokens is then the
// only truth, and the report uses it.
//
// Calibrate() runs once before the threads start; afterwards the builder is
// only read and may be shared. Make() calls the count function it is given,
// so each thread passes its own client's.
#ifndef RINGLANE_TOOLS_BENCH_PROMPTS_H_
#define RINGLANE_TOOLS_BENCH_PROMPTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::bench {

// The token count of a text by the server's tokenizer.
using CountTokensFn = std::function<absl::StatusOr<int64_t>(const std::string&)>;

struct Prompt {
  std::string text;
  int64_t tokens = 0;  // as counted (exact) or assumed (one per word)
  bool exact = false;
};

class PromptBuilder {
 public:
  PromptBuilder();

  // Keeps the words that add one token each, and measures the tokens the
  // tokenizer adds to any text (a BOS). Errors from `count` are returned.
  absl::Status Calibrate(const CountTokensFn& count);
  bool calibrated() const { return calibrated_; }

  // `n` words from the generator seeded with `salt`, space-separated.
  std::string Words(int n, uint64_t salt) const;

  // A prompt of `tokens` tokens. With `count` (after Calibrate) it is
  // resized until the count matches, or the closest length not above it;
  // without, `tokens` words. Errors from `count` are returned.
  absl::StatusOr<Prompt> Make(int tokens, uint64_t salt, const CountTokensFn* count) const;

  const std::vector<std::string>& words() const { return words_; }

 private:
  std::vector<std::string> words_;
  int64_t overhead_ = 0;  // tokens added to any text (BOS), from Calibrate
  bool calibrated_ = false;
};

// A 64-bit mix (splitmix64's finalizer): salts and draws for the runner.
uint64_t Mix64(uint64_t x);
// A uniform double in [0, 1) from `x`.
double UnitFromBits(uint64_t x);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_PROMPTS_H_
