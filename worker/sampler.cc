#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "worker/philox.h"

namespace ringlane::worker {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Token ids in (probability desc, id asc) order, sorted only as far as a
// caller reads. Under realistic distributions the top-p / min-p / inverse-CDF
// walks stop after a handful of tokens, so sorting a 150k vocabulary in full
// would be wasted work. Because the order is total (ids are unique and no
// probability is NaN), the sorted prefix is the same whichever way it was
// reached, which keeps the draw deterministic.
class LazySortedTokens {
 public:
  // Keeps only tokens with probability > 0: they can never be drawn, and
  // dropping them keeps a masked (-inf) token out of the "last kept" fallback.
  explicit LazySortedTokens(const std::vector<double>& probs) {
    candidates_.reserve(probs.size());
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] > 0) candidates_.push_back({probs[i], static_cast<int32_t>(i)});
    }
  }

  size_t size() const { return candidates_.size(); }

  // The j-th token of the sorted order and its probability; j < size().
  int32_t TokenAt(size_t j) { return At(j).token; }
  double ProbAt(size_t j) { return At(j).prob; }

  // Sum of the first n probabilities in sorted order.
  double PrefixSum(size_t n) {
    double sum = 0;
    for (size_t j = 0; j < n; ++j) sum += ProbAt(j);
    return sum;
  }

 private:
  // Probability stored beside the id so that comparisons during selection
  // read contiguous memory instead of gathering from a vocabulary-sized array.
  struct Candidate {
    double prob;
    int32_t token;
  };

  static bool Before(const Candidate& a, const Candidate& b) {
    if (a.prob != b.prob) return a.prob > b.prob;
    return a.token < b.token;
  }

  const Candidate& At(size_t j) {
    if (j >= sorted_) SortThrough(j + 1);
    return candidates_[j];
  }

  // Extends the sorted prefix to at least n entries. Growth is geometric so a
  // long walk costs a few linear-time selections rather than one per token,
  // and switches to a plain sort once the prefix would cover much of the rest.
  void SortThrough(size_t n) {
    const size_t target = std::max({n, 8 * sorted_, size_t{64}});
    const auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    if (target * 4 >= candidates_.size()) {
      std::sort(first, candidates_.end(), Before);
      sorted_ = candidates_.size();
      return;
    }
    // Everything before sorted_ already precedes everything after it, so only
    // the remainder needs selecting.
    const auto mid = candidates_.begin() + static_cast<std::ptrdiff_t>(target);
    std::nth_element(first, mid, candidates_.end(), Before);
    std::sort(first, mid, Before);
    sorted_ = target;
  }

  std::vector<Candidate> candidates_;
  size_t sorted_ = 0;  // candidates_[0, sorted_) holds the final sorted prefix.
};

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  // Written as negated range checks so that NaN fails every one of them.
  if (!(std::isfinite(params.temperature) && params.temperature >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be finite and >= 0, got %g", params.temperature));
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p must be in (0, 1], got %g", params.top_p));
  }
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("min_p must be in [0, 1], got %g", params.min_p));
  }
  if (!(params.presence_penalty >= -kMaxAbsPenalty && params.presence_penalty <= kMaxAbsPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("presence_penalty must be in [-%g, %g], got %g", kMaxAbsPenalty,
                        kMaxAbsPenalty, params.presence_penalty));
  }
  if (!(params.frequency_penalty >= -kMaxAbsPenalty &&
        params.frequency_penalty <= kMaxAbsPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("frequency_penalty must be in [-%g, %g], got %g", kMaxAbsPenalty,
                        kMaxAbsPenalty, params.frequency_penalty));
  }
  for (size_t i = 0; i < params.logit_bias.size(); ++i) {
    const auto& [token, bias] = params.logit_bias[i];
    if (!(bias >= -kMaxAbsLogitBias && bias <= kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit_bias for token %d must be in [-%g, %g], got %g", token,
                          kMaxAbsLogitBias, kMaxAbsLogitBias, bias));
    }
    if (token < 0 || (i > 0 && token <= params.logit_bias[i - 1].first)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit_bias tokens must be non-negative and increasing, got %d", token));
    }
  }
  if (params.top_logprobs < -1 || params.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs must be in [0, %d] (or -1 for none), got %d", kMaxTopLogprobs,
                        params.top_logprobs));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, uint32_t choice_index,
                 absl::Span<const int32_t> earlier_output)
    : params_(params), choice_index_(choice_index) {
  for (int32_t token : earlier_output) Observe(token);
}

void Sampler::Observe(int32_t token) { ++counts_[token]; }

std::vector<float> Sampler::PenalizedLogits(absl::Span<const float> logits,
                                            const uint8_t* allowed) const {
  std::vector<float> out(logits.begin(), logits.end());
  const int64_t vocab = static_cast<int64_t>(out.size());
  if (params_.presence_penalty != 0 || params_.frequency_penalty != 0) {
    for (const auto& [token, count] : counts_) {
      if (token < 0 || token >= vocab) continue;
      out[token] -= params_.presence_penalty * (count > 0 ? 1.0f : 0.0f) +
                    params_.frequency_penalty * static_cast<float>(count);
    }
  }
  for (const auto& [token, bias] : params_.logit_bias) {
    if (token < vocab) out[token] += bias;
  }
  const auto is_allowed = [allowed](size_t i) {
    return allowed == nullptr || ((allowed[i >> 3] >> (i & 7)) & 1) != 0;
  };
  // NaN would break the total orders below and poison the softmax sums.
  float max_logit = kNegInf;
  for (size_t i = 0; i < out.size(); ++i) {
    float& x = out[i];
    if (!is_allowed(i)) {
      x = kNegInf;
      continue;
    }
    if (std::isnan(x)) {
      x = kNegInf;
    } else if (x == std::numeric_limits<float>::infinity()) {
      x = std::numeric_limits<float>::max();
    }
    max_logit = std::max(max_logit, x);
  }
  // Everything masked: max-subtraction would give NaN; call the allowed
  // tokens equally likely instead.
  if (max_logit == kNegInf) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = is_allowed(i) ? 0.0f : kNegInf;
  }
  return out;
}

int32_t Sampler::SampleWithTemperature(const std::vector<float>& penalized,
                                       int64_t position) const {
  // Double precision keeps x / temperature finite for tiny temperatures and
  // keeps the sums' rounding far below the 2^-24 resolution of the draw.
  const double temperature = params_.temperature;
  std::vector<double> probs(penalized.size());
  double max_scaled = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < penalized.size(); ++i) {
    probs[i] = static_cast<double>(penalized[i]) / temperature;
    max_scaled = std::max(max_scaled, probs[i]);
  }
  double z = 0;
  for (double& p : probs) {
    p = std::exp(p - max_scaled);
    z += p;
  }
  // ~1. Summed in index order, so a sorted walk over every candidate can end a
  // rounding error short of it; the fallback after the final walk covers that.
  double total = 0;
  for (double& p : probs) {
    p /= z;
    total += p;
  }

  LazySortedTokens sorted(probs);
  // The max-probability token has weight exp(0) = 1, so there is always one candidate.
  const size_t num_positive = sorted.size();
  size_t kept = num_positive;
  if (params_.top_k > 0) kept = std::min(kept, static_cast<size_t>(params_.top_k));

  // Written so that NaN (rejected by validation) means "off".
  if (params_.top_p < 1.0f) {
    const double top_k_mass = kept == num_positive ? total : sorted.PrefixSum(kept);
    const double target = static_cast<double>(params_.top_p) * top_k_mass;
    double cumulative = 0;
    for (size_t j = 0; j < kept; ++j) {
      cumulative += sorted.ProbAt(j);
      if (cumulative >= target) {
        kept = j + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    const double threshold = static_cast<double>(params_.min_p) * sorted.ProbAt(0);
    for (size_t j = 1; j < kept; ++j) {
      if (sorted.ProbAt(j) < threshold) {
        kept = j;
        break;
      }
    }
  }

  const double kept_mass = kept == num_positive ? total : sorted.PrefixSum(kept);
  const double target =
      static_cast<double>(UniformFloat(params_.seed, choice_index_, position)) * kept_mass;
  double cumulative = 0;
  for (size_t j = 0; j < kept; ++j) {
    cumulative += sorted.ProbAt(j);
    if (target < cumulative) return sorted.TokenAt(j);
  }
  // Only reachable when the walk's sum rounds below kept_mass.
  return sorted.TokenAt(kept - 1);
}

SampleResult Sampler::Sample(absl::Span<const float> logits, int64_t position,
                             const uint8_t* allowed) const {
  SampleResult result{-1, kNegInf, {}};
  if (logits.empty()) return result;
  const std::vector<float> penalized = PenalizedLogits(logits, allowed);

  if (params_.temperature > 0 && std::isfinite(params_.temperature)) {
    result.token = SampleWithTemperature(penalized, position);
  } else {
    // Strict > keeps the lowest id among equal maxima, as llama2.c does.
    // The best value stays in a register: re-reading penalized[best] puts a
    // load on the loop-carried path and made this loop several times slower.
    int32_t best = 0;
    float best_value = penalized[0];
    for (size_t i = 1; i < penalized.size(); ++i) {
      if (penalized[i] > best_value) {
        best_value = penalized[i];
        best = static_cast<int32_t>(i);
      }
    }
    result.token = best;
  }

  if (params_.top_logprobs < 0) {
    result.logprob = 0;
    return result;
  }
  // Log-softmax before temperature and filters, as OpenAI reports it.
  const double max_logit = *std::max_element(penalized.begin(), penalized.end());
  double sum = 0;
  for (float x : penalized) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_sum = std::log(sum);
  const auto logprob_of = [&](size_t i) {
    return static_cast<float>((static_cast<double>(penalized[i]) - max_logit) - log_sum);
  };
  result.logprob = logprob_of(static_cast<size_t>(result.token));

  const size_t num_top = std::min(static_cast<size_t>(params_.top_logprobs), penalized.size());
  if (num_top == 0) return result;
  std::vector<float> logprobs(penalized.size());
  for (size_t i = 0; i < penalized.size(); ++i) logprobs[i] = logprob_of(i);
  std::vector<int32_t> ids(penalized.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(num_top), ids.end(),
                    [&](int32_t a, int32_t b) {
                      if (logprobs[a] != logprobs[b]) return logprobs[a] > logprobs[b];
                      return a < b;
                    });
  result.top.reserve(num_top);
  for (size_t j = 0; j < num_top; ++j) {
    // A masked token has no probability to report.
    if (allowed != nullptr && logprobs[ids[j]] == kNegInf) break;
    result.top.push_back({ids[j], logprobs[ids[j]]});
  }
  return result;
}

}  // namespace ringlane::worker
