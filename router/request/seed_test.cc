#include "router/request/seed.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

const std::vector<int32_t> kPrompt = {1, 15043, 3186, 29991};

SeedParams GoldenParams() {
  return SeedParams{.temperature = 0.7f,
                    .top_k = 40,
                    .top_p = 0.9f,
                    .min_p = 0.05f,
                    .presence_penalty = 0.5f,
                    .frequency_penalty = -0.25f};
}

// The golden values were computed outside this code: the documented encoding
// built byte by byte with Python's struct.pack and hashed by a separate C
// program calling libxxhash's XXH3_64bits. If this fails, derived seeds changed
// for every user: restore the encoding rather than update the numbers.
TEST(DeriveSeedTest, GoldenValuesPinTheEncoding) {
  EXPECT_EQ(DeriveSeed(kPrompt, GoldenParams()), 0x7287a52776100370ull);
  EXPECT_EQ(DeriveSeed({}, SeedParams{}), 0x88a16f311e2bf326ull);
}

TEST(DeriveSeedTest, SameInputsSameSeed) {
  std::vector<int32_t> copy = kPrompt;
  EXPECT_EQ(DeriveSeed(kPrompt, GoldenParams()), DeriveSeed(copy, GoldenParams()));
}

TEST(DeriveSeedTest, EveryPromptTokenMatters) {
  const uint64_t base = DeriveSeed(kPrompt, GoldenParams());
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    std::vector<int32_t> changed = kPrompt;
    changed[i] += 1;
    EXPECT_NE(DeriveSeed(changed, GoldenParams()), base) << "token " << i;
  }
  std::vector<int32_t> longer = kPrompt;
  longer.push_back(0);
  EXPECT_NE(DeriveSeed(longer, GoldenParams()), base);
  std::vector<int32_t> shorter(kPrompt.begin(), kPrompt.end() - 1);
  EXPECT_NE(DeriveSeed(shorter, GoldenParams()), base);
  std::vector<int32_t> swapped = {kPrompt[1], kPrompt[0], kPrompt[2], kPrompt[3]};
  EXPECT_NE(DeriveSeed(swapped, GoldenParams()), base);
}

TEST(DeriveSeedTest, EveryParameterMatters) {
  const uint64_t base = DeriveSeed(kPrompt, GoldenParams());
  struct Case {
    const char* name;
    std::function<void(SeedParams&)> change;
  };
  const std::vector<Case> cases = {
      {"temperature", [](SeedParams& p) { p.temperature = 0.8f; }},
      {"top_k", [](SeedParams& p) { p.top_k = 41; }},
      {"top_p", [](SeedParams& p) { p.top_p = 0.95f; }},
      {"min_p", [](SeedParams& p) { p.min_p = 0.0f; }},
      {"presence_penalty", [](SeedParams& p) { p.presence_penalty = 0.0f; }},
      {"frequency_penalty", [](SeedParams& p) { p.frequency_penalty = 0.25f; }},
  };
  for (const Case& c : cases) {
    SeedParams p = GoldenParams();
    c.change(p);
    EXPECT_NE(DeriveSeed(kPrompt, p), base) << c.name;
  }
}

// Values that sample identically must derive the same seed, or two equal
// requests written differently would not reproduce each other.
TEST(DeriveSeedTest, EquivalentSpellingsAgree) {
  SeedParams a;
  SeedParams b;
  b.temperature = -0.0f;
  b.presence_penalty = -0.0f;
  EXPECT_EQ(DeriveSeed(kPrompt, a), DeriveSeed(kPrompt, b));
  SeedParams k0;
  SeedParams k_neg;
  k_neg.top_k = -1;
  EXPECT_EQ(DeriveSeed(kPrompt, k0), DeriveSeed(kPrompt, k_neg));
}

TEST(SeedPolicyTest, ParsesNamesAndRejectsOthers) {
  ASSERT_TRUE(ParseSeedPolicy("derived").ok());
  EXPECT_EQ(*ParseSeedPolicy("derived"), SeedPolicy::kDerived);
  EXPECT_EQ(*ParseSeedPolicy("random"), SeedPolicy::kRandom);
  for (const char* bad : {"", "Random", "fixed"}) {
    EXPECT_EQ(ParseSeedPolicy(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(SeedPolicyName(SeedPolicy::kDerived), "derived");
  EXPECT_EQ(SeedPolicyName(SeedPolicy::kRandom), "random");
}

TEST(SeedPolicyTest, ResolveSeed) {
  int random_calls = 0;
  auto random = [&random_calls]() -> uint64_t {
    ++random_calls;
    return 12345;
  };
  const uint64_t derived = DeriveSeed(kPrompt, GoldenParams());

  // An explicit seed wins under both policies, including 0.
  EXPECT_EQ(ResolveSeed(7, SeedPolicy::kDerived, kPrompt, GoldenParams(), random), 7u);
  EXPECT_EQ(ResolveSeed(0, SeedPolicy::kRandom, kPrompt, GoldenParams(), random), 0u);
  EXPECT_EQ(random_calls, 0);

  EXPECT_EQ(ResolveSeed(std::nullopt, SeedPolicy::kDerived, kPrompt, GoldenParams(), random),
            derived);
  EXPECT_EQ(random_calls, 0);
  EXPECT_EQ(ResolveSeed(std::nullopt, SeedPolicy::kRandom, kPrompt, GoldenParams(), random),
            12345u);
  EXPECT_EQ(random_calls, 1);
}

}  // namespace
}  // namespace ringlane::router
