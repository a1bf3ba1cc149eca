// Host-side token sampling for one lane: penalties, greedy or temperature
// sampling with top-k / top-p / min-p, and OpenAI-style logprobs.
//
// A draw is a pure function of (parameters, generated-token counts, logits,
// seed, choice index, position): the uniform number comes from Philox keyed by
// (seed, choice index, absolute position) (DESIGN.md, "Determinism with a
// knob"), every sort uses a total order, and every float sum runs in a fixed
// order. That is what lets speculative decoding verify a draft token by
// re-sampling the same position, and lets a resend with the same seed
// reproduce its output.
#ifndef RINGLANE_WORKER_SAMPLER_H_
#define RINGLANE_WORKER_SAMPLER_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ringlane::worker {

// Per-request sampling knobs, with OpenAI's meanings.
struct SamplingParams {
  float temperature = 0;  // 0 = greedy
  int top_k = 0;          // 0 or <0 = off
  float top_p = 1.0f;     // 1 = off
  float min_p = 0.0f;     // 0 = off
  // OpenAI semantics, counted over generated tokens only (not the prompt):
  // logit -= presence_penalty * (count > 0) + frequency_penalty * count.
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;
  // -1: no logprobs; 0: the chosen token's logprob only; n: plus the n most
  // likely tokens as alternatives.
  int top_logprobs = -1;
  // OpenAI logit_bias: (token, bias) sorted by token, each token once; added
  // to the penalized logit. Tokens outside the vocabulary are ignored.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Largest |logit_bias| value (OpenAI's range).
inline constexpr float kMaxAbsLogitBias = 100;

// Largest top_logprobs a request may ask for (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;
// presence_penalty and frequency_penalty must lie in [-kMaxAbsPenalty,
// kMaxAbsPenalty] (OpenAI's range).
inline constexpr float kMaxAbsPenalty = 2;

// OK, or InvalidArgument naming the first bad field: temperature must be finite
// and >= 0, top_p in (0, 1], min_p in [0, 1], both penalties in
// [-kMaxAbsPenalty, kMaxAbsPenalty], top_logprobs in [-1, kMaxTopLogprobs],
// logit_bias values finite and within kMaxAbsLogitBias with tokens strictly
// increasing. top_k takes any value.
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampleResult {
  int32_t token;
  // Log-softmax of the penalized logits at `token`, before temperature and
  // filters (what OpenAI reports). 0 when params.top_logprobs < 0, because
  // computing it costs a pass of exp() over the vocabulary.
  float logprob;
  // The params.top_logprobs most likely tokens by logprob, highest first, ties
  // broken by lower token id. Empty when top_logprobs <= 0.
  std::vector<TokenLogprob> top;
};

// Per-lane sampler state: parameters, seed, choice index and counts of
// generated tokens for penalties. One per (request, choice); owned by the
// worker's step thread with the rest of the lane's state. Not thread-safe:
// Observe() must not run concurrently with anything else, while const calls
// may run concurrently with each other.
//
// Sample() expects parameters that passed ValidateSamplingParams(); it stays
// deterministic on others but does not promise a meaningful result (a
// non-finite or non-positive temperature samples greedily).
class Sampler {
 public:
  // `earlier_output`: tokens the choice generated before this sampler existed
  // (a preempted choice re-admitted as a new lane, whose prompt ends with
  // them), counted as if this sampler had observed them in order, so that
  // penalties continue where the earlier lane left them.
  Sampler(const SamplingParams& params, uint32_t choice_index,
          absl::Span<const int32_t> earlier_output = {});

  // Counts a generated token for presence/frequency penalties. Tokens outside
  // the vocabulary passed to Sample() are counted but never penalized.
  void Observe(int32_t token);

  // Samples the token at absolute position `position` (the position the new
  // token will occupy) from logits over the vocabulary.
  //
  // Greedy (temperature 0) takes the argmax, ties to the lowest id. Otherwise
  // the candidates are the tokens ordered by (probability desc, id asc) under
  // softmax(penalized / temperature); top-k keeps the first k, top-p the
  // shortest prefix whose probability, renormalized over the top-k survivors
  // (as Hugging Face and vLLM do), reaches top_p, min-p drops tokens below
  // min_p times the largest probability, and tokens of probability 0 are never
  // candidates. One uniform draw then picks by inverse CDF over the kept
  // prefix.
  //
  // Non-finite logits: NaN counts as -inf, +inf as the largest float; if no
  // logit is above -inf, every token is equally likely. `logits` must be
  // non-empty; an empty span yields token -1.
  //
  // `allowed` (grammar-constrained decoding), when not null, is a bitmask of
  // ceil(logits.size() / 8) bytes, bit t (LSB first) set when token t may be
  // drawn: the others get logit -inf after penalties and logit_bias, so
  // every rule above (and the logprobs) applies to the constrained
  // distribution; alternatives of logprob -inf are left out of `top`. If no
  // allowed token's logit is above -inf, the allowed tokens are equally
  // likely. The caller guarantees at least one bit is set.
  SampleResult Sample(absl::Span<const float> logits, int64_t position,
                      const uint8_t* allowed = nullptr) const;

  const SamplingParams& params() const { return params_; }
  uint32_t choice_index() const { return choice_index_; }

 private:
  // Copies `logits`, applies the penalties, logit_bias, the non-finite rules
  // above and the mask.
  std::vector<float> PenalizedLogits(absl::Span<const float> logits, const uint8_t* allowed) const;
  // Temperature sampling over penalized logits; returns the chosen token id.
  int32_t SampleWithTemperature(const std::vector<float>& penalized, int64_t position) const;

  const SamplingParams params_;
  const uint32_t choice_index_;
  // Generated token id -> times generated. Ordered so that applying penalties
  // visits tokens in one fixed order.
  std::map<int32_t, int32_t> counts_;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SAMPLER_H_
