#include "worker/philox.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

using Words = std::array<uint32_t, 4>;

// Random123 tests/kat_vectors, the three "philox4x32 10" lines: CTR, KEY, expected output.
TEST(Philox4x32Test, KnownAnswerAllZero) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox4x32Test, KnownAnswerAllOnes) {
  EXPECT_EQ(
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox4x32Test, KnownAnswerPiDigits) {
  EXPECT_EQ(
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox4x32Test, IsConstexpr) {
  static_assert(Philox4x32({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
}

TEST(UniformFloatTest, UsesTopBitsOfFirstWord) {
  // Seed 0, choice 0, position 0 is the all-zero known-answer input.
  EXPECT_EQ(UniformFloat(0, 0, 0), static_cast<float>(0x6627e8d5u >> 8) / 16777216.0f);
}

TEST(UniformFloatTest, CounterAndKeyLayout) {
  // Key is the seed low half first; counter is {pos low, pos high, choice, 0}.
  const uint64_t seed = (uint64_t{0x299f31d0u} << 32) | 0xa4093822u;
  const int64_t position = static_cast<int64_t>((uint64_t{0x85a308d3u} << 32) | 0x243f6a88u);
  const uint32_t choice = 0x13198a2eu;
  const Words out = Philox4x32({0x243f6a88u, 0x85a308d3u, choice, 0u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(UniformFloat(seed, choice, position), static_cast<float>(out[0] >> 8) / 16777216.0f);
}

TEST(UniformFloatTest, RangeAndMean) {
  double sum = 0;
  float lo = 1, hi = 0;
  constexpr int kDraws = 200000;
  // A histogram over 16 buckets catches gross non-uniformity that a mean would miss.
  std::array<int, 16> buckets{};
  for (int i = 0; i < kDraws; ++i) {
    const float u = UniformFloat(42, 3, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
    ++buckets[static_cast<int>(u * 16)];
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  EXPECT_LT(lo, 0.001f);
  EXPECT_GT(hi, 0.999f);
  double chi2 = 0;
  const double expected = kDraws / 16.0;
  for (int b : buckets) chi2 += (b - expected) * (b - expected) / expected;
  // 15 degrees of freedom; 37.7 is the 0.001 upper tail.
  EXPECT_LT(chi2, 37.7);
}

TEST(UniformFloatTest, EveryInputChangesTheDraw) {
  // Each neighbour differs in exactly one input, including the high halves of
  // the seed and the position, so a dropped or aliased counter word shows up.
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x123456789abcdefULL}}) {
    for (uint32_t choice : {0u, 1u, 7u}) {
      for (int64_t pos : {int64_t{0}, int64_t{5}, int64_t{4096}, int64_t{1} << 33}) {
        const float u = UniformFloat(seed, choice, pos);
        EXPECT_NE(u, UniformFloat(seed + 1, choice, pos));
        EXPECT_NE(u, UniformFloat(seed ^ (uint64_t{1} << 40), choice, pos));
        EXPECT_NE(u, UniformFloat(seed, choice + 1, pos));
        EXPECT_NE(u, UniformFloat(seed, choice, pos + 1));
        EXPECT_NE(u, UniformFloat(seed, choice, pos + (int64_t{1} << 32)));
        EXPECT_EQ(u, UniformFloat(seed, choice, pos));
      }
    }
  }
}

TEST(UniformFloatTest, ChoicesGiveDifferentStreams) {
  // Two choices of one request must not replay each other's stream, shifted or not.
  std::set<float> a, b;
  for (int64_t pos = 0; pos < 1000; ++pos) {
    a.insert(UniformFloat(9, 0, pos));
    b.insert(UniformFloat(9, 1, pos));
  }
  int shared = 0;
  for (float u : a) shared += b.count(u);
  // 1000 x 1000 draws over 2^24 values collide about 0.06 times by chance.
  EXPECT_LE(shared, 3);
}

}  // namespace
}  // namespace ringlane::worker
