#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/philox.h"

namespace ringlane::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams Temperature(float t, uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) m = std::max(m, x / temperature);
  std::vector<double> p;
  double z = 0;
  for (float x : logits) {
    p.push_back(std::exp(x / temperature - m));
    z += p.back();
  }
  for (double& v : p) v /= z;
  return p;
}

// Draws one token per position over `num_positions` positions and counts them.
std::map<int32_t, int> Histogram(const Sampler& sampler, const std::vector<float>& logits,
                                 int num_positions, const uint8_t* allowed = nullptr) {
  std::map<int32_t, int> counts;
  for (int pos = 0; pos < num_positions; ++pos) {
    ++counts[sampler.Sample(logits, pos, allowed).token];
  }
  return counts;
}

// Pearson chi-square of observed counts against expected probabilities.
double ChiSquare(const std::map<int32_t, int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const auto it = counts.find(static_cast<int32_t>(i));
    const double observed = it == counts.end() ? 0 : it->second;
    const double expected = probs[i] * n;
    chi2 += (observed - expected) * (observed - expected) / expected;
  }
  return chi2;
}

// Logits spread over [-4, 4), reproducible on any platform (std's
// distributions are not).
std::vector<float> PseudoRandomLogits(int vocab, uint64_t seed) {
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[i] = 8.0f * UniformFloat(seed, 0, i) - 4.0f;
  return logits;
}

// A straightforward full-sort rendering of the documented algorithm (no
// penalties), to check that the lazily sorted production path agrees with it.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& params,
                        uint32_t choice, int64_t position) {
  const std::vector<double> probs = Softmax(logits, params.temperature);
  std::vector<int32_t> order;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  });
  size_t kept = order.size();
  if (params.top_k > 0) kept = std::min(kept, static_cast<size_t>(params.top_k));
  if (params.top_p < 1.0f) {
    double mass = 0;
    for (size_t j = 0; j < kept; ++j) mass += probs[order[j]];
    double cum = 0;
    for (size_t j = 0; j < kept; ++j) {
      cum += probs[order[j]];
      if (cum >= params.top_p * mass) {
        kept = j + 1;
        break;
      }
    }
  }
  if (params.min_p > 0) {
    for (size_t j = 1; j < kept; ++j) {
      if (probs[order[j]] < params.min_p * probs[order[0]]) {
        kept = j;
        break;
      }
    }
  }
  double mass = 0;
  for (size_t j = 0; j < kept; ++j) mass += probs[order[j]];
  const double target = UniformFloat(params.seed, choice, position) * mass;
  double cum = 0;
  for (size_t j = 0; j < kept; ++j) {
    cum += probs[order[j]];
    if (target < cum) return order[j];
  }
  return order[kept - 1];
}

TEST(SamplerTest, GreedyTakesArgmax) {
  const Sampler sampler(SamplingParams{}, 0);
  EXPECT_EQ(sampler.Sample({0.1f, -2.0f, 3.5f, 1.0f}, 0).token, 2);
}

TEST(SamplerTest, GreedyTieGoesToLowestId) {
  const Sampler sampler(SamplingParams{}, 0);
  EXPECT_EQ(sampler.Sample({1.0f, 3.0f, 2.0f, 3.0f, 3.0f}, 7).token, 1);
  EXPECT_EQ(sampler.Sample({5.0f, 5.0f}, 7).token, 0);
}

TEST(SamplerTest, GreedyIgnoresSeedChoiceAndPosition) {
  const std::vector<float> logits = PseudoRandomLogits(1000, 5);
  const int32_t expected =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (uint32_t choice = 0; choice < 3; ++choice) {
    SamplingParams params;
    params.seed = 100 + choice;
    const Sampler sampler(params, choice);
    for (int pos = 0; pos < 20; ++pos) EXPECT_EQ(sampler.Sample(logits, pos).token, expected);
  }
}

TEST(SamplerTest, TemperatureSamplingIsDeterministic) {
  const std::vector<float> logits = PseudoRandomLogits(500, 6);
  const Sampler a(Temperature(1.0f, 99), 0);
  const Sampler b(Temperature(1.0f, 99), 0);
  std::vector<int32_t> first;
  for (int pos = 0; pos < 300; ++pos) {
    first.push_back(a.Sample(logits, pos).token);
    EXPECT_EQ(first.back(), b.Sample(logits, pos).token) << "position " << pos;
  }
  // A position's draw does not depend on which positions were sampled before it.
  for (int pos = 299; pos >= 0; pos -= 7) EXPECT_EQ(a.Sample(logits, pos).token, first[pos]);
}

TEST(SamplerTest, ChoicesAndSeedsGiveDifferentStreams) {
  const std::vector<float> logits = PseudoRandomLogits(500, 6);
  const Sampler base(Temperature(1.0f, 99), 0);
  const Sampler other_choice(Temperature(1.0f, 99), 1);
  const Sampler other_seed(Temperature(1.0f, 100), 0);
  int same_choice = 0, same_seed = 0;
  constexpr int kPositions = 300;
  for (int pos = 0; pos < kPositions; ++pos) {
    const int32_t t = base.Sample(logits, pos).token;
    same_choice += t == other_choice.Sample(logits, pos).token;
    same_seed += t == other_seed.Sample(logits, pos).token;
  }
  // Over a flat-ish 500-token distribution chance agreement is about 1%.
  EXPECT_LT(same_choice, kPositions / 10);
  EXPECT_LT(same_seed, kPositions / 10);
}

TEST(SamplerTest, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.2f, 1.5f};
  constexpr float kTemperature = 0.8f;
  constexpr int kPositions = 20000;
  const Sampler sampler(Temperature(kTemperature), 3);
  const auto counts = Histogram(sampler, logits, kPositions);
  // 7 degrees of freedom; 24.32 is the 0.001 upper tail. The draws are
  // deterministic, so this either always passes or always fails.
  EXPECT_LT(ChiSquare(counts, Softmax(logits, kTemperature), kPositions), 24.32);
}

TEST(SamplerTest, FrequenciesOfHotAndColdTemperatures) {
  // Temperature must actually divide the logits: the same draws at T=2 follow
  // softmax(x/2), which a sampler ignoring T would miss by a wide margin.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  constexpr int kPositions = 20000;
  for (float t : {0.5f, 2.0f}) {
    const auto counts = Histogram(Sampler(Temperature(t), 0), logits, kPositions);
    EXPECT_LT(ChiSquare(counts, Softmax(logits, t), kPositions), 16.27) << "temperature " << t;
  }
}

TEST(SamplerTest, TopKFrequenciesAreRenormalized) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.2f, 1.5f};
  SamplingParams params = Temperature(1.0f);
  params.top_k = 3;
  constexpr int kPositions = 20000;
  const auto counts = Histogram(Sampler(params, 0), logits, kPositions);
  // Top 3 by probability: tokens 4, 7, 0; nothing else may appear.
  const std::vector<double> probs = Softmax(logits, 1.0);
  const double mass = probs[4] + probs[7] + probs[0];
  std::map<int32_t, int> remapped;
  for (const auto& [token, n] : counts) {
    ASSERT_TRUE(token == 4 || token == 7 || token == 0) << "token " << token;
    remapped[token == 4 ? 0 : token == 7 ? 1 : 2] = n;
  }
  // 2 degrees of freedom; 13.82 is the 0.001 upper tail.
  EXPECT_LT(ChiSquare(remapped, {probs[4] / mass, probs[7] / mass, probs[0] / mass}, kPositions),
            13.82);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  const std::vector<float> logits = PseudoRandomLogits(2000, 8);
  const Sampler greedy(SamplingParams{}, 0);
  const int32_t expected = greedy.Sample(logits, 0).token;
  for (float t : {0.3f, 1.0f, 5.0f}) {
    SamplingParams params = Temperature(t);
    params.top_k = 1;
    const Sampler sampler(params, 2);
    for (int pos = 0; pos < 200; ++pos) EXPECT_EQ(sampler.Sample(logits, pos).token, expected);
  }
}

TEST(SamplerTest, TinyTopPEqualsGreedy) {
  const std::vector<float> logits = PseudoRandomLogits(2000, 9);
  const int32_t expected = Sampler(SamplingParams{}, 0).Sample(logits, 0).token;
  SamplingParams params = Temperature(1.5f);
  params.top_p = 1e-6f;
  const Sampler sampler(params, 0);
  for (int pos = 0; pos < 200; ++pos) EXPECT_EQ(sampler.Sample(logits, pos).token, expected);
}

TEST(SamplerTest, TopPKeepsShortestPrefixReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  const struct {
    float top_p;
    std::vector<int32_t> allowed;
  } cases[] = {
      {0.4f, {1}},
      {0.75f, {1, 3}},
      {0.9f, {0, 1, 3}},
      {0.99f, {0, 1, 2, 3}},
  };
  for (const auto& c : cases) {
    SamplingParams params = Temperature(1.0f);
    params.top_p = c.top_p;
    const auto counts = Histogram(Sampler(params, 0), logits, 4000);
    std::vector<int32_t> seen;
    for (const auto& [token, n] : counts) seen.push_back(token);
    EXPECT_EQ(seen, c.allowed) << "top_p " << c.top_p;
  }
}

TEST(SamplerTest, TopPAppliesAfterTopK) {
  // Probabilities 0.4, 0.3, 0.2, 0.1. Top-k 2 renormalizes to 4/7, 3/7; top_p
  // 0.5 of that keeps one token, while 0.5 of the full distribution would keep two.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  SamplingParams params = Temperature(1.0f);
  params.top_k = 2;
  params.top_p = 0.5f;
  const auto counts = Histogram(Sampler(params, 0), logits, 2000);
  EXPECT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts.begin()->first, 0);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  // Probabilities 0.4, 0.3, 0.19, 0.11: min_p 0.5 keeps p >= 0.2.
  const std::vector<float> logits = {std::log(0.19f), std::log(0.4f), std::log(0.11f),
                                     std::log(0.3f)};
  SamplingParams params = Temperature(1.0f);
  params.min_p = 0.5f;
  const auto counts = Histogram(Sampler(params, 0), logits, 4000);
  std::vector<int32_t> seen;
  for (const auto& [token, n] : counts) seen.push_back(token);
  EXPECT_THAT(seen, ElementsAre(1, 3));
  // Renormalized: 0.4 / 0.7 of the draws go to token 1.
  EXPECT_NEAR(counts.at(1) / 4000.0, 0.4 / 0.7, 0.03);

  params.min_p = 0.25f;  // keeps p >= 0.1: everything
  EXPECT_EQ(Histogram(Sampler(params, 0), logits, 4000).size(), 4u);
}

TEST(SamplerTest, MatchesFullSortReferenceOnLargeVocab) {
  // Flat logits over a 32k vocabulary make the top-p and inverse-CDF walks
  // long, which exercises the lazy sort's growth and its full-sort fallback.
  const std::vector<float> logits = PseudoRandomLogits(32000, 10);
  const struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  } cases[] = {
      {1.0f, 0, 1.0f, 0.0f},    {0.7f, 50, 1.0f, 0.0f},  {1.0f, 0, 0.9f, 0.0f},
      {1.0f, 0, 0.2f, 0.0f},    {0.5f, 0, 1.0f, 0.05f},  {1.0f, 40, 0.95f, 0.02f},
      {2.0f, 5000, 0.5f, 0.0f}, {0.05f, 0, 0.99f, 0.0f},
  };
  for (const auto& c : cases) {
    SamplingParams params = Temperature(c.temperature, 31337);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const Sampler sampler(params, 4);
    for (int pos = 0; pos < 25; ++pos) {
      ASSERT_EQ(sampler.Sample(logits, pos).token, ReferenceSample(logits, params, 4, pos))
          << "T=" << c.temperature << " top_k=" << c.top_k << " top_p=" << c.top_p
          << " min_p=" << c.min_p << " pos=" << pos;
    }
  }
}

TEST(SamplerTest, PresencePenaltyChangesArgmax) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  SamplingParams params;
  params.presence_penalty = 0.5f;
  Sampler sampler(params, 0);
  EXPECT_EQ(sampler.Sample(logits, 0).token, 0);
  sampler.Observe(0);
  EXPECT_EQ(sampler.Sample(logits, 1).token, 1);
  // Presence counts once however often the token was generated.
  sampler.Observe(1);
  sampler.Observe(1);
  EXPECT_EQ(sampler.Sample(logits, 2).token, 0);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithCount) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  SamplingParams params;
  params.frequency_penalty = 0.04f;
  Sampler sampler(params, 0);
  sampler.Observe(0);
  sampler.Observe(0);
  EXPECT_EQ(sampler.Sample(logits, 0).token, 0);  // 2.0 - 0.08 > 1.9
  sampler.Observe(0);
  EXPECT_EQ(sampler.Sample(logits, 0).token, 1);  // 2.0 - 0.12 < 1.9
}

TEST(SamplerTest, NegativePenaltyFavoursRepeats) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  SamplingParams params;
  params.presence_penalty = -1.0f;
  params.frequency_penalty = -0.5f;
  Sampler sampler(params, 0);
  sampler.Observe(2);
  sampler.Observe(2);
  EXPECT_EQ(sampler.Sample(logits, 0).token, 0);  // 0 + 1 + 1 = 2.0 ties token 0: lower id wins
  sampler.Observe(2);
  EXPECT_EQ(sampler.Sample(logits, 0).token, 2);  // 0 + 1 + 1.5 = 2.5
}

TEST(SamplerTest, PenaltiesIgnoreTokensOutsideVocabulary) {
  SamplingParams params;
  params.presence_penalty = 2.0f;
  Sampler sampler(params, 0);
  sampler.Observe(-1);
  sampler.Observe(3);
  EXPECT_EQ(sampler.Sample({1.0f, 0.0f, 0.5f}, 0).token, 0);
}

// A preempted choice continues in a new sampler built from what it generated:
// every later draw and logprob must equal the sampler that observed those
// tokens one by one, and differ from one that starts at zero counts.
TEST(SamplerTest, RestoredEarlierOutputContinuesThePenalties) {
  const int kVocab = 64;
  SamplingParams params = Temperature(0.9f, 77);
  params.top_k = 20;
  params.top_p = 0.9f;
  params.min_p = 0.01f;
  params.presence_penalty = 0.7f;
  params.frequency_penalty = 1.3f;
  params.top_logprobs = 5;
  Sampler solo(params, 2);
  std::vector<int32_t> generated;
  const int64_t kPrompt = 9;
  for (int64_t pos = kPrompt; pos < kPrompt + 40; ++pos) {
    const SampleResult r = solo.Sample(PseudoRandomLogits(kVocab, static_cast<uint64_t>(pos)), pos);
    solo.Observe(r.token);
    generated.push_back(r.token);
  }
  Sampler restored(params, 2, generated);
  Sampler fresh(params, 2);
  bool fresh_differs = false;
  for (int64_t pos = kPrompt + 40; pos < kPrompt + 80; ++pos) {
    const std::vector<float> logits = PseudoRandomLogits(kVocab, static_cast<uint64_t>(pos));
    const SampleResult want = solo.Sample(logits, pos);
    const SampleResult got = restored.Sample(logits, pos);
    const SampleResult zero = fresh.Sample(logits, pos);
    ASSERT_EQ(got.token, want.token) << pos;
    ASSERT_EQ(got.logprob, want.logprob) << pos;
    ASSERT_EQ(got.top.size(), want.top.size());
    for (size_t j = 0; j < want.top.size(); ++j) {
      ASSERT_EQ(got.top[j].token, want.top[j].token) << pos;
      ASSERT_EQ(got.top[j].logprob, want.top[j].logprob) << pos;
    }
    fresh_differs |= zero.token != want.token || zero.logprob != want.logprob;
    solo.Observe(want.token);
    restored.Observe(got.token);
    fresh.Observe(zero.token);
  }
  EXPECT_TRUE(fresh_differs) << "the penalties never mattered; the test proves nothing";
}

TEST(SamplerTest, PenaltiesApplyToLogprobs) {
  SamplingParams params;
  params.presence_penalty = 1.0f;
  params.top_logprobs = 0;
  Sampler sampler(params, 0);
  sampler.Observe(0);
  // Penalized logits {0, 0}: both tokens at log(1/2).
  const SampleResult r = sampler.Sample({1.0f, 0.0f}, 0);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, std::log(0.5), 1e-6);
}

TEST(SamplerTest, LogprobsSumToOneAndAreSorted) {
  const std::vector<float> logits = {0.3f, -1.2f, 2.5f, 0.0f, 1.1f, -3.0f, 0.7f, 2.4f, -0.1f, 1.0f};
  SamplingParams params = Temperature(0.7f);
  params.top_logprobs = 10;
  const Sampler sampler(params, 0);
  for (int pos = 0; pos < 20; ++pos) {
    const SampleResult r = sampler.Sample(logits, pos);
    ASSERT_EQ(r.top.size(), logits.size());
    double sum = 0;
    for (const TokenLogprob& t : r.top) sum += std::exp(static_cast<double>(t.logprob));
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (size_t j = 1; j < r.top.size(); ++j) EXPECT_GE(r.top[j - 1].logprob, r.top[j].logprob);
    EXPECT_EQ(r.top[0].token, 2);
    EXPECT_EQ(r.top[1].token, 7);
    const auto chosen = std::find_if(r.top.begin(), r.top.end(),
                                     [&](const TokenLogprob& t) { return t.token == r.token; });
    ASSERT_NE(chosen, r.top.end());
    EXPECT_EQ(chosen->logprob, r.logprob);
  }
}

TEST(SamplerTest, LogprobsIgnoreTemperature) {
  const std::vector<float> logits = {0.3f, -1.2f, 2.5f, 0.0f};
  const std::vector<double> expected = Softmax(logits, 1.0);
  for (float t : {0.0f, 0.25f, 3.0f}) {
    SamplingParams params = Temperature(t);
    params.top_logprobs = 4;
    const SampleResult r = Sampler(params, 0).Sample(logits, 0);
    for (const TokenLogprob& tl : r.top) {
      EXPECT_NEAR(tl.logprob, std::log(expected[tl.token]), 1e-6) << "T=" << t;
    }
    EXPECT_NEAR(r.logprob, std::log(expected[r.token]), 1e-6);
  }
}

TEST(SamplerTest, TopLogprobsTiesGoToLowestId) {
  SamplingParams params;
  params.top_logprobs = 4;
  const SampleResult r = Sampler(params, 0).Sample({1.0f, 2.0f, 2.0f, 0.0f, 2.0f, 1.0f}, 0);
  std::vector<int32_t> ids;
  for (const TokenLogprob& t : r.top) ids.push_back(t.token);
  EXPECT_THAT(ids, ElementsAre(1, 2, 4, 0));
  EXPECT_EQ(r.top[0].logprob, r.top[2].logprob);
}

TEST(SamplerTest, TopLogprobsCountAndOff) {
  const std::vector<float> logits = PseudoRandomLogits(1000, 11);
  SamplingParams params;
  params.top_logprobs = -1;
  EXPECT_TRUE(Sampler(params, 0).Sample(logits, 0).top.empty());
  params.top_logprobs = 0;
  const SampleResult only_chosen = Sampler(params, 0).Sample(logits, 0);
  EXPECT_TRUE(only_chosen.top.empty());
  EXPECT_LT(only_chosen.logprob, 0.0f);
  params.top_logprobs = 20;
  const SampleResult r = Sampler(params, 0).Sample(logits, 0);
  ASSERT_EQ(r.top.size(), 20u);
  EXPECT_EQ(r.top[0].token, r.token);  // greedy picks the most likely
  EXPECT_EQ(r.top[0].logprob, only_chosen.logprob);
  // More alternatives than tokens: all of them.
  EXPECT_EQ(Sampler(params, 0).Sample({0.0f, 1.0f}, 0).top.size(), 2u);
}

TEST(SamplerTest, NonFiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Sampler(SamplingParams{}, 0).Sample({nan, 1.0f, kInf, -kInf}, 0).token, 2);
  // NaN and -inf tokens are never drawn.
  const auto counts = Histogram(Sampler(Temperature(1.0f), 0), {nan, 0.0f, -kInf, 0.5f}, 2000);
  for (const auto& [token, n] : counts) EXPECT_TRUE(token == 1 || token == 3) << token;
  // Everything masked: uniform rather than NaN.
  SamplingParams params = Temperature(1.0f);
  params.top_logprobs = 1;
  const SampleResult r = Sampler(params, 0).Sample({-kInf, -kInf, -kInf, -kInf}, 3);
  EXPECT_GE(r.token, 0);
  EXPECT_LT(r.token, 4);
  EXPECT_NEAR(r.logprob, std::log(0.25), 1e-6);
}

TEST(SamplerTest, LogitBiasShiftsLogitsAndLogprobs) {
  SamplingParams params;
  params.top_logprobs = 2;
  params.logit_bias = {{0, -100.0f}, {2, 1.5f}, {9, 100.0f}};  // 9 is outside the vocabulary
  const SampleResult r = Sampler(params, 0).Sample({3.0f, 1.0f, 0.0f}, 0);
  // Biased logits {-97, 1, 1.5}.
  EXPECT_EQ(r.token, 2);
  const std::vector<double> expected = Softmax({-97.0f, 1.0f, 1.5f}, 1.0);
  EXPECT_NEAR(r.logprob, std::log(expected[2]), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[1].token, 1);
  // +100 all but forces a token at any temperature.
  params = Temperature(1.5f);
  params.logit_bias = {{1, 100.0f}};
  const auto counts = Histogram(Sampler(params, 0), {2.0f, 0.0f, 1.0f}, 500);
  EXPECT_EQ(counts.at(1), 500);
}

// Bit t of the mask allows token t.
std::string Mask(size_t vocab, std::initializer_list<int> allowed) {
  std::string m((vocab + 7) / 8, '\0');
  for (int t : allowed) m[t / 8] = static_cast<char>(m[t / 8] | (1 << (t % 8)));
  return m;
}

TEST(SamplerTest, MaskConstrainsGreedySamplingAndLogprobs) {
  const std::vector<float> logits = PseudoRandomLogits(300, 5);
  const std::string mask = Mask(logits.size(), {7, 130, 299});
  const auto* bits = reinterpret_cast<const uint8_t*>(mask.data());
  SamplingParams params;
  params.top_logprobs = 20;
  const SampleResult g = Sampler(params, 0).Sample(logits, 0, bits);
  int32_t best = 7;
  for (int t : {130, 299}) {
    if (logits[t] > logits[best]) best = t;
  }
  EXPECT_EQ(g.token, best);
  // Only the allowed tokens have a probability, renormalized among them.
  ASSERT_EQ(g.top.size(), 3u);
  double sum = 0;
  for (const TokenLogprob& t : g.top) {
    EXPECT_TRUE(t.token == 7 || t.token == 130 || t.token == 299) << t.token;
    sum += std::exp(static_cast<double>(t.logprob));
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  params = Temperature(2.0f);
  const auto counts = Histogram(Sampler(params, 0), logits, 1000, bits);
  for (const auto& [token, n] : counts) EXPECT_TRUE(token == 7 || token == 130 || token == 299);
  EXPECT_EQ(counts.size(), 3u);
}

TEST(SamplerTest, MaskOverMinusInfinityIsUniformOverAllowed) {
  const std::string mask = Mask(5, {1, 3});
  const auto* bits = reinterpret_cast<const uint8_t*>(mask.data());
  const auto counts =
      Histogram(Sampler(Temperature(1.0f), 0), {5.0f, -kInf, 2.0f, -kInf, 1.0f}, 1000, bits);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts.at(1), 400);
  EXPECT_GT(counts.at(3), 400);
  EXPECT_EQ(Sampler(SamplingParams{}, 0).Sample({5.0f, -kInf, 2.0f, -kInf, 1.0f}, 0, bits).token,
            1);
}

TEST(SamplerTest, FullMaskChangesNothing) {
  const std::vector<float> logits = PseudoRandomLogits(100, 9);
  const std::string all(13, '\xff');
  SamplingParams params = Temperature(0.9f);
  params.top_logprobs = 5;
  const Sampler s(params, 3);
  for (int pos = 0; pos < 50; ++pos) {
    const SampleResult a = s.Sample(logits, pos);
    const SampleResult b = s.Sample(logits, pos, reinterpret_cast<const uint8_t*>(all.data()));
    EXPECT_EQ(a.token, b.token);
    EXPECT_EQ(a.logprob, b.logprob);
    ASSERT_EQ(a.top.size(), b.top.size());
  }
}

TEST(SamplerTest, EmptyLogits) { EXPECT_EQ(Sampler(Temperature(1.0f), 0).Sample({}, 0).token, -1); }

TEST(ValidateSamplingParamsTest, AcceptsDefaultsAndLimits) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = -5;
  p.top_p = 1e-9f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.top_logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(ValidateSamplingParamsTest, RejectsBadValuesNamingTheField) {
  const struct {
    const char* field;
    void (*mutate)(SamplingParams&);
  } cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::nanf(""); }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = std::nanf(""); }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -2.01f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -3.0f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = std::nanf(""); }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = 21; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = -2; }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 100.5f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, std::nanf("")}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       }},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const absl::Status status = ValidateSamplingParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace ringlane::worker
