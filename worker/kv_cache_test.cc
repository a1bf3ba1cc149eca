#include "worker/kv_cache.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/dtype.h"

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

// Attention reads K transposed (a row per dimension) and V by rows, block by
// block; both must hold exactly what the one-position reader gives (the
// latent caches' GatherColumns: plane 0 of a one-head pool), across block
// edges and for a context that ends inside a block. Plane 1 is checked
// through the same values stored in plane 0 of another layer (a token's
// stored bytes depend on its values only).
TEST_P(KvCacheTest, RowAndTransposedGatherEqualThePositionReader) {
  const int hd = 12, bs = 4, n = 10;
  const int64_t ldt = n + 3;  // the transposed rows' stride, wider than n
  auto one = KvCache::Create(2, 1, hd, {6, bs, GetParam()});
  auto multi = KvCache::Create(2, 3, hd, {6, bs, GetParam()});
  ASSERT_TRUE(one.ok() && multi.ok());
  const std::vector<int32_t> blocks = {4, 0, 5};
  for (int p = 0; p < n; ++p) {
    const std::vector<float> t = Random(3 * hd, 50 + p, p == 3 ? 400.0f : 2.0f);
    for (int kv = 0; kv < 2; ++kv) (*multi)->Store(blocks[p / bs], p % bs, 1, kv, t.data());
    (*one)->Store(blocks[p / bs], p % bs, 1, 0, t.data());       // K of layer 1
    (*one)->Store(blocks[p / bs], p % bs, 1, 1, t.data() + hd);  // V of layer 1
    (*one)->Store(blocks[p / bs], p % bs, 0, 0, t.data() + hd);  // the same V as K of layer 0
  }
  for (int kv = 0; kv < 2; ++kv) {
    std::vector<float> want(n * hd), rows(n * hd), cols(hd * ldt, -1.0f);
    (*one)->GatherColumns(blocks, 0, n, kv == 0 ? 1 : 0, 0, hd, want.data(), hd);
    (*one)->Gather(blocks, n, 1, kv, 0, rows.data(), hd);
    (*one)->GatherTransposed(blocks, n, 1, kv, 0, cols.data(), ldt);
    for (int p = 0; p < n; ++p) {
      for (int d = 0; d < hd; ++d) {
        EXPECT_EQ(std::memcmp(&rows[p * hd + d], &want[p * hd + d], 4), 0) << kv << p << d;
        EXPECT_EQ(std::memcmp(&cols[d * ldt + p], &want[p * hd + d], 4), 0) << kv << p << d;
      }
    }
    for (int d = 0; d < hd; ++d)
      for (int64_t p = n; p < ldt; ++p) EXPECT_EQ(cols[d * ldt + p], -1.0f) << "written past n";
  }
  // Several heads: the transposed form is the row form, head by head.
  for (int kv = 0; kv < 2; ++kv) {
    for (int h = 0; h < 3; ++h) {
      std::vector<float> rows(n * hd), cols(hd * ldt);
      (*multi)->Gather(blocks, n, 1, kv, h, rows.data(), hd);
      (*multi)->GatherTransposed(blocks, n, 1, kv, h, cols.data(), ldt);
      for (int p = 0; p < n; ++p)
        for (int d = 0; d < hd; ++d)
          EXPECT_EQ(std::memcmp(&cols[d * ldt + p], &rows[p * hd + d], 4), 0) << kv << h << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvCacheTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kFP8E4M3),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// The packed FP8 latent row: per-128 scales for the latent, BF16 RoPE key,
// E4M3 index key with its own scale; each part within its format's
// precision of its own group's magnitude, whatever the other parts hold.
TEST(KvCache, PackedFp8LatentRoundTrips) {
  const LatentSplit split{160, 8, 16};  // a partial second latent group
  const int width = 160 + 8 + 16;
  auto kv = KvCache::Create(2, 1, width, {4, 4, DType::kFP8E4M3}, 1, split);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ((*kv)->block_bytes(), 2 * 4 * (160 + 2 * 4 + 8 * 2 + 16 + 4));
  std::vector<float> row = Random(width, 7, 2.0f);
  for (int i = 128; i < 160; ++i) row[i] *= 1000.0f;  // the second group alone is large
  (*kv)->Store(3, 2, 1, 0, row.data());
  std::vector<float> out(4 * width);
  (*kv)->Gather({3}, 3, 1, 0, 0, out.data(), width);
  const float* got = out.data() + 2 * width;
  auto group_max = [&](int a, int b) {
    float m = 0;
    for (int i = a; i < b; ++i) m = std::fmax(m, std::fabs(row[i]));
    return m;
  };
  for (auto [a, b] : {std::pair{0, 128}, std::pair{128, 160}, std::pair{168, 184}}) {
    const float m = group_max(a, b);
    for (int i = a; i < b; ++i) EXPECT_NEAR(got[i], row[i], m / 8) << i;
  }
  for (int i = 160; i < 168; ++i) EXPECT_EQ(got[i], Bf16ToFloat(FloatToBf16(row[i]))) << i;
  // The first group kept its own scale: its error is small against its own
  // values, not against the large group's.
  EXPECT_NEAR(got[5], row[5], group_max(0, 128) / 8);
  // Reading a part, or listed positions, gives exactly those columns of
  // the whole row, packed or not.
  for (DType dtype : {DType::kFP8E4M3, DType::kBF16}) {
    auto pool = KvCache::Create(2, 1, width, {4, 4, dtype}, 1, split);
    ASSERT_TRUE(pool.ok()) << pool.status();
    for (int p = 0; p < 8; ++p) {
      std::vector<float> r = Random(width, 100 + p);
      (*pool)->Store(p < 4 ? 1 : 3, p % 4, 0, 0, r.data());
    }
    const std::vector<int32_t> blocks = {1, 3};
    std::vector<float> whole(8 * width), index(8 * 16), picked(2 * 168);
    (*pool)->Gather(blocks, 8, 0, 0, 0, whole.data(), width);
    (*pool)->GatherColumns(blocks, 0, 8, 0, 168, 16, index.data(), 16);
    std::vector<float> tail(3 * 16);  // positions 5, 6, 7 alone
    (*pool)->GatherColumns(blocks, 5, 3, 0, 168, 16, tail.data(), 16);
    for (int i = 0; i < 3 * 16; ++i) EXPECT_EQ(tail[i], index[5 * 16 + i]);
    (*pool)->GatherPositions(blocks, std::vector<int32_t>{6, 2}, 0, 0, 168, picked.data(), 168);
    for (int p = 0; p < 8; ++p)
      for (int i = 0; i < 16; ++i) EXPECT_EQ(index[p * 16 + i], whole[p * width + 168 + i]);
    for (int i = 0; i < 168; ++i) {
      EXPECT_EQ(picked[i], whole[6 * width + i]);
      EXPECT_EQ(picked[168 + i], whole[2 * width + i]);
    }
  }
  // A split must match the row and belong to a one-plane, one-head pool.
  EXPECT_FALSE(KvCache::Create(2, 1, width + 1, {4, 4, DType::kFP8E4M3}, 1, split).ok());
  EXPECT_FALSE(KvCache::Create(2, 1, width, {4, 4, DType::kFP8E4M3}, 2, split).ok());
}

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
