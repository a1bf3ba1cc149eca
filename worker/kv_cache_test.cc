#include "worker/kv_cache.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

std::vector<float> Random(int n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

class KvCacheTest : public ::testing::TestWithParam<DType> {};

TEST_P(KvCacheTest, StoreThenGatherWithinDtypePrecision) {
  const int layers = 2, heads = 3, hd = 20;
  auto kv = KvCache::Create(layers, heads, hd, {8, 4, GetParam()});
  ASSERT_TRUE(kv.ok()) << kv.status();
  std::vector<int32_t> blocks = {5, 2, 7};  // 12 slots, non-contiguous
  std::vector<std::vector<float>> tokens;
  for (int p = 0; p < 10; ++p) {
    tokens.push_back(Random(heads * hd, p, 3.0f));
    (*kv)->Store(blocks[p / 4], p % 4, 1, 1, tokens.back().data());
  }
  const float tol =
      GetParam() == DType::kF32 ? 0.0f : (GetParam() == DType::kBF16 ? 1.0f / 128 : 1.0f / 8);
  for (int h = 0; h < heads; ++h) {
    std::vector<float> out(10 * hd);
    (*kv)->Gather(blocks, 10, 1, 1, h, out.data(), hd);
    float amax = 0;
    for (int p = 0; p < 10; ++p)
      for (int d = 0; d < hd; ++d) amax = std::fmax(amax, std::fabs(tokens[p][h * hd + d]));
    for (int p = 0; p < 10; ++p) {
      for (int d = 0; d < hd; ++d) {
        float want = tokens[p][h * hd + d];
        EXPECT_NEAR(
            out[p * hd + d], want,
            tol * std::fmax(std::fabs(want), GetParam() == DType::kFP8E4M3 ? amax / 16 : 0.0f) +
                1e-6f);
      }
    }
  }
}

// A token's stored bytes depend on that token only (per-token scales), so a
// prompt chunked any way leaves the same block contents.
TEST_P(KvCacheTest, StoredBytesIndependentOfNeighbours) {
  auto a = KvCache::Create(1, 2, 16, {2, 4, GetParam()});
  auto b = KvCache::Create(1, 2, 16, {2, 4, GetParam()});
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> t0 = Random(32, 1, 100.0f), t1 = Random(32, 2, 0.01f);
  (*a)->Store(0, 0, 0, 0, t0.data());
  (*a)->Store(0, 1, 0, 0, t1.data());
  (*b)->Store(0, 1, 0, 0, t1.data());
  (*b)->Store(0, 0, 0, 0, t0.data());
  EXPECT_EQ(std::memcmp((*a)->BlockData(0), (*b)->BlockData(0), (*a)->block_bytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvCacheTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kFP8E4M3),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(KvCache, RejectsBadSpecs) {
  EXPECT_EQ(KvCache::Create(1, 1, 8, {0, 16, DType::kF32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(1, 1, 8, {4, 0, DType::kF32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(1, 1, 8, {4, 16, DType::kF16}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringlane::worker
