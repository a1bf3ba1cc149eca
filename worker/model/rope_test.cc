#include "worker/model/rope.h"

#include <cmath>
#include <numbers>

#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

ModelConfig Llama3() {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position = 8192;
  return c;
}

TEST(Rope, UnscaledMatchesThetaPowers) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000.0f;
  std::vector<float> f = RopeInverseFrequencies(c);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[1], 0.1f);  // 10000^(-2/8)
  EXPECT_FLOAT_EQ(f[2], 0.01f);
  EXPECT_FLOAT_EQ(f[3], 0.001f);
}

TEST(Rope, LinearScalingDividesEveryFrequency) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4.0f;
  std::vector<float> f = RopeInverseFrequencies(c);
  EXPECT_FLOAT_EQ(f[0], 0.25f);
  EXPECT_FLOAT_EQ(f[2], 0.0025f);
}

// Hugging Face's llama3 rule: wavelengths under 8192/4 keep their frequency,
// over 8192/1 are divided by 8, and those between are blended.
TEST(Rope, Llama3KeepsHighDividesLowBlendsMiddle) {
  ModelConfig plain = Llama3();
  plain.rope_scaling.type = "";
  const std::vector<float> base = RopeInverseFrequencies(plain);
  const std::vector<float> f = RopeInverseFrequencies(Llama3());
  ASSERT_EQ(f.size(), 64u);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / base[i];
    if (wavelen < 2048.0f) {
      EXPECT_EQ(f[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0f) {
      EXPECT_FLOAT_EQ(f[i], base[i] / 8.0f) << i;
      ++divided;
    } else {
      EXPECT_LT(f[i], base[i]) << i;
      EXPECT_GT(f[i], base[i] / 8.0f) << i;
      const float smooth = (8192.0f / wavelen - 1.0f) / 3.0f;
      EXPECT_NEAR(f[i], (1 - smooth) * base[i] / 8 + smooth * base[i], 1e-6f * base[i]) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

}  // namespace
}  // namespace ringlane::worker
