#include "worker/backend/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/attention_impl.h"
#include "worker/model/resident.h"

namespace ringlane::worker::cpu {
namespace {

// A weight matrix of the given dtype built from random floats, with FP8 block
// scales where needed, plus its exact float expansion for a reference sum.
struct TestMatrix {
  Matrix m;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> expanded;  // w'[r][c]
};

TestMatrix MakeMatrix(DType dt, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  TestMatrix t;
  t.m.dtype = dt;
  t.m.rows = rows;
  t.m.cols = cols;
  t.m.row_stride_bytes = cols * static_cast<int64_t>(DTypeSize(dt));
  t.bytes.resize(rows * t.m.row_stride_bytes);
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  if (dt == DType::kFP8E4M3) {
    t.scales.resize(sr * sc);
    for (auto& s : t.scales) s = std::ldexp(1.0f + 0.37f * (&s - t.scales.data()), -7);
    t.m.scale = t.scales.data();
    t.m.scale_cols = sc;
  }
  t.expanded.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = dist(rng);
      uint8_t* p = t.bytes.data() + r * t.m.row_stride_bytes;
      switch (dt) {
        case DType::kF32:
          std::memcpy(p + 4 * c, &v, 4);
          break;
        case DType::kBF16: {
          uint16_t h = FloatToBf16(v);
          std::memcpy(p + 2 * c, &h, 2);
          break;
        }
        case DType::kF16: {
          uint16_t h = FloatToF16(v);
          std::memcpy(p + 2 * c, &h, 2);
          break;
        }
        case DType::kFP8E4M3:
          p[c] = FloatToFp8E4M3(v * 100.0f);
          break;
      }
    }
  }
  t.m.data = t.bytes.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t.expanded[r * cols + c] =
          LoadAsFloat(dt, t.m.Row(r), c) * (dt == DType::kFP8E4M3 ? t.m.ScaleAt(r, c) : 1.0f);
  return t;
}

// FP8 bytes of random codes but the two NaNs (which quantizers never write),
// the first 256 bytes every such code in order, subnormals and both zeros
// included.
void FillEveryCode(TestMatrix* t, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < t->bytes.size(); ++i) {
    uint8_t code = static_cast<uint8_t>(rng());
    if ((code & 0x7f) == 0x7f) code = static_cast<uint8_t>(i % 127);
    t->bytes[i] = code;
  }
  for (int a = 0; a < 256; ++a) {
    if ((a & 0x7f) != 0x7f) t->bytes[a] = static_cast<uint8_t>(a);
  }
}

std::vector<float> RandomX(int M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(M * K);
  for (auto& v : x) v = dist(rng);
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class MatMulTest : public ::testing::TestWithParam<DType> {};

// Every path (scalar, in-register, panel) and every row count gives the same
// bits for a row as that row alone: the kernel-level form of batch invariance.
TEST_P(MatMulTest, AllPathsAndRowCountsAgreeBitForBit) {
  const DType dt = GetParam();
  // Odd rows; K = 300 crosses two 128-blocks and has a 12-column tail, K = 256
  // has none.
  for (const int64_t K : {int64_t{300}, int64_t{256}}) {
    const int64_t N = 37;
    TestMatrix w = MakeMatrix(dt, N, K, 7);
    const int kMaxM = 13;
    std::vector<float> x = RandomX(kMaxM, K, 11);

    std::vector<float> solo(kMaxM * N);
    for (int m = 0; m < kMaxM; ++m) {
      internal::MatMulRangeScalar(w.m, x.data() + m * K, K, 1, solo.data() + m * N, N, 0, N);
    }
    // Reference check in double: the kernel computes the right thing.
    for (int m = 0; m < kMaxM; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(w.expanded[n * K + k]) * x[m * K + k];
        ASSERT_NEAR(solo[m * N + n], ref, 1e-4 * (std::fabs(ref) + 10.0)) << m << "," << n;
      }
    }
    for (Isa isa : SupportedIsas()) {
      for (int M = 1; M <= kMaxM; ++M) {
        for (int path = 0; path <= 2; ++path) {
          std::vector<float> y(M * N, -1.0f);
          MatMulRange(w.m, x.data(), K, M, y.data(), N, 0, N, isa, path);
          std::vector<float> want(solo.begin(), solo.begin() + M * N);
          ASSERT_TRUE(SameBits(y, want))
              << "K=" << K << " M=" << M << " path=" << path << " isa=" << IsaName(isa);
        }
      }
    }
  }
}

// The panel path converts a task's weight blocks once and meets them with
// 64-row tiles of x: rows past one tile, ranges over several 128-row blocks
// (one starting mid-block, one ending on a partial 16-row panel), and a
// threaded prefill whose tasks hold several tiles all give each row's solo
// bits.
TEST_P(MatMulTest, PanelPathOverTilesAndBlocksAgreesWithSoloRows) {
  const DType dt = GetParam();
  const int64_t N = 300, K = 300;
  const int M = 150;
  TestMatrix w = MakeMatrix(dt, N, K, 17);
  std::vector<float> x = RandomX(M, K, 19);
  std::vector<float> solo(M * N);
  for (int m = 0; m < M; ++m) {
    internal::MatMulRangeScalar(w.m, x.data() + m * K, K, 1, solo.data() + m * N, N, 0, N);
  }
  for (Isa isa : SupportedIsas()) {
    for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {100, 290}, {128, 256}}) {
      std::vector<float> y(M * N, -1.0f);
      MatMulRange(w.m, x.data(), K, M, y.data(), N, n0, n1, isa, 2);
      for (int m = 0; m < M; ++m) {
        for (int64_t n = n0; n < n1; ++n) {
          ASSERT_EQ(std::memcmp(&y[m * N + n], &solo[m * N + n], 4), 0)
              << IsaName(isa) << " rows [" << n0 << ", " << n1 << ") m=" << m << " n=" << n;
        }
      }
    }
    ThreadPool pool(2);
    std::vector<float> y(M * N);
    MatMul(w.m, x.data(), K, M, y.data(), N, &pool, isa);
    EXPECT_TRUE(SameBits(y, solo)) << IsaName(isa);
  }
}

TEST_P(MatMulTest, ThreadedMatMulEqualsSerial) {
  const DType dt = GetParam();
  TestMatrix w = MakeMatrix(dt, 300, 136, 3);
  std::vector<float> x = RandomX(20, 136, 5);
  ThreadPool pool(3);
  for (Isa isa : SupportedIsas()) {
    for (int M : {1, 5, 20}) {
      std::vector<float> a(M * 300), b(M * 300);
      MatMul(w.m, x.data(), 136, M, a.data(), 300, &pool, isa);
      MatMul(w.m, x.data(), 136, M, b.data(), 300, nullptr, Isa::kScalar);
      EXPECT_TRUE(SameBits(a, b)) << M << " " << IsaName(isa);
    }
  }
}

TEST_P(MatMulTest, DequantRowMatchesScalar) {
  TestMatrix w = MakeMatrix(GetParam(), 5, 261, 9);
  for (Isa isa : SupportedIsas()) {
    for (int64_t r = 0; r < 5; ++r) {
      std::vector<float> a(261), b(261);
      DequantRow(w.m, r, a.data(), isa);
      DequantRow(w.m, r, b.data(), Isa::kScalar);
      EXPECT_TRUE(SameBits(a, b)) << IsaName(isa);
      EXPECT_TRUE(std::memcmp(a.data(), w.expanded.data() + r * 261, 261 * 4) == 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatMulTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kFP8E4M3),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// A TP shard's rows may sit inside one 128-row scale block and its columns
// start past a block edge: the view must pick the scales of its global place.
TEST(MatMulFp8, ShardViewUsesGlobalScaleBlocks) {
  const int64_t N = 256, K = 384;
  TestMatrix full = MakeMatrix(DType::kFP8E4M3, N, K, 21);
  std::vector<float> x = RandomX(3, K, 4);
  std::vector<float> y_full(3 * N);
  MatMulRange(full.m, x.data(), K, 3, y_full.data(), N, 0, N, DetectIsa());

  // Rows [96, 160) straddle the 128-row edge; all columns.
  Matrix rows = full.m;
  rows.data = full.m.Row(96);
  rows.rows = 64;
  rows.row_offset = 96;
  for (Isa isa : SupportedIsas()) {
    std::vector<float> y_rows(3 * 64);
    MatMulRange(rows, x.data(), K, 3, y_rows.data(), 64, 0, 64, isa);
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < 64; ++n) ASSERT_EQ(y_rows[m * 64 + n], y_full[m * N + 96 + n]);
  }

  // Columns [128, 384) of every row: the partial sums differ from the full
  // ones, so compare with the expanded weights directly.
  Matrix cols = full.m;
  cols.data = static_cast<const uint8_t*>(full.m.data) + 128;
  cols.cols = 256;
  cols.col_offset = 128;
  std::vector<float> deq(256);
  for (Isa isa : SupportedIsas()) {
    for (int64_t r : {0, 130, 255}) {
      DequantRow(cols, r, deq.data(), isa);
      for (int c = 0; c < 256; ++c) ASSERT_EQ(deq[c], full.expanded[r * K + 128 + c]);
    }
  }
}

// Every E4M3 code but the two NaNs (which quantizers never write), subnormals
// and both zeros included, converts to the same float on every path; and a
// view starting 48 columns past a scale edge (a first scale run of 80
// columns) sums as the scalar path does, for every tile height, over more
// columns than one panel pass takes (kPanelCols, 1024).
TEST(MatMulFp8, EveryCodeOnEveryPath) {
  const int64_t N = 20, K = 48 + 1024 + 128 + 9;
  TestMatrix full = MakeMatrix(DType::kFP8E4M3, N, K, 31);
  FillEveryCode(&full, 5);
  Matrix view = full.m;
  view.data = full.bytes.data() + 48;
  view.cols = K - 48;
  view.col_offset = 48;
  std::vector<float> x = RandomX(6, view.cols, 8);
  for (Isa isa : SupportedIsas()) {
    for (int64_t r = 0; r < N; ++r) {
      std::vector<float> a(K), b(K);
      DequantRow(full.m, r, a.data(), isa);
      DequantRow(full.m, r, b.data(), Isa::kScalar);
      ASSERT_TRUE(SameBits(a, b)) << IsaName(isa) << " row " << r;
    }
    for (int M = 1; M <= 6; ++M) {
      for (int path = 1; path <= 2; ++path) {
        std::vector<float> y(M * N), want(M * N);
        MatMulRange(view, x.data(), view.cols, M, y.data(), N, 0, N, isa, path);
        internal::MatMulRangeScalar(view, x.data(), view.cols, M, want.data(), N, 0, N);
        ASSERT_TRUE(SameBits(y, want)) << IsaName(isa) << " M=" << M << " path=" << path;
      }
    }
  }
}

// `stored` (the N x K FP8 rows of `plain` in another layout) against
// `plain` on every path: MatMulRange for every instruction set, 1..13 rows
// of x and each path, and DequantRow of every row; equal bits throughout.
// MatMulRange on `stored` for the first 1..max_m rows of x, on every
// instruction set and path, gives the scalar path's bits on `plain`.
void ExpectEveryPathAsScalar(const Matrix& stored, const Matrix& plain, const std::vector<float>& x,
                             int max_m, const std::string& what) {
  const int64_t N = plain.rows, K = plain.cols;
  std::vector<float> want(max_m * N);
  internal::MatMulRangeScalar(plain, x.data(), K, max_m, want.data(), N, 0, N);
  for (Isa isa : SupportedIsas()) {
    for (int M = 1; M <= max_m; ++M) {
      for (int path = 0; path <= 2; ++path) {
        std::vector<float> y(M * N, -1.0f);
        MatMulRange(stored, x.data(), K, M, y.data(), N, 0, N, isa, path);
        ASSERT_TRUE(SameBits(y, std::vector<float>(want.begin(), want.begin() + M * N)))
            << IsaName(isa) << what << " M=" << M << " path=" << path;
      }
    }
  }
}

void ExpectSumsAsRowsInOrder(const Matrix& stored, const Matrix& plain, uint32_t seed) {
  const int64_t N = plain.rows, K = plain.cols;
  const int kMaxM = 13;
  ExpectEveryPathAsScalar(stored, plain, RandomX(kMaxM, K, seed), kMaxM, "");
  for (Isa isa : SupportedIsas()) {
    for (int64_t r = 0; r < N; ++r) {
      std::vector<float> a(K), b(K);
      DequantRow(stored, r, a.data(), isa);
      DequantRow(plain, r, b.data(), Isa::kScalar);
      ASSERT_TRUE(SameBits(a, b)) << IsaName(isa) << " row " << r;
    }
  }
}

// Rows stored in interleaved groups (Matrix::interleaved, MakeResident's
// layout) sum to the same bits as the rows in order on every path, for every
// tile height, whole groups followed by a 16-column step and a tail; so do
// DequantRow and a column view that starts on a later group.
TEST(MatMulFp8, InterleavedGroupsSumAsRowsInOrder) {
  const int64_t N = 37, K = 7 * 64 + 16 + 9;
  TestMatrix plain = MakeMatrix(DType::kFP8E4M3, N, K, 41);
  FillEveryCode(&plain, 6);
  std::vector<uint8_t> grouped(plain.bytes.size());
  for (int64_t r = 0; r < N; ++r) InterleaveFp8Row(plain.m.Row(r), K, grouped.data() + r * K);
  ASSERT_NE(grouped, plain.bytes);
  Matrix il = plain.m;
  il.data = grouped.data();
  il.interleaved = true;
  for (int64_t c = 0; c < K; ++c) {
    ASSERT_EQ(il.Row(3)[il.StoredColumn(c)], plain.m.Row(3)[c]) << c;
  }

  ExpectSumsAsRowsInOrder(il, plain.m, 12);

  // Columns [128, K): groups 2..6 of the rows, then the step and the tail.
  Matrix plain_view = plain.m.Cols(128, K - 128), il_view = il.Cols(128, K - 128);
  std::vector<float> xv = RandomX(5, K - 128, 13), wv(5 * N);
  internal::MatMulRangeScalar(plain_view, xv.data(), K - 128, 5, wv.data(), N, 0, N);
  for (Isa isa : SupportedIsas()) {
    for (int path = 1; path <= 2; ++path) {
      std::vector<float> y(5 * N);
      MatMulRange(il_view, xv.data(), K - 128, 5, y.data(), N, 0, N, isa, path);
      ASSERT_TRUE(SameBits(y, wv)) << IsaName(isa) << " path=" << path;
    }
  }
}

// Rows in tiles (Matrix::row_tile, MakeResident's layout): 37 rows, so the
// last tile is padded, and 6 groups across three scale blocks. Every element
// is where StoredColumn says, a tile's rows take turns group by group, and
// every path, tile height and DequantRow gives the bits of the rows in order;
// so do views starting at each row phase and on a later group.
TEST(MatMulFp8, RowTilesSumAsRowsInOrder) {
  const int64_t N = 37, K = 6 * 64, T = kResidentRowTile;
  TestMatrix plain = MakeMatrix(DType::kFP8E4M3, N, K, 43);
  FillEveryCode(&plain, 7);
  std::vector<uint8_t> tiled((N + T - 1) / T * T * K, 0);
  WriteFp8Tiles(plain.m, T, tiled.data());
  Matrix tm = plain.m;
  tm.data = tiled.data();
  tm.interleaved = true;
  tm.row_tile = T;
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t c = 0; c < K; ++c) {
      ASSERT_EQ(tm.Row(r)[tm.StoredColumn(c)], plain.m.Row(r)[c]) << r << "," << c;
    }
  }
  EXPECT_EQ(tm.Row(1), tm.Row(0) + 64);
  EXPECT_EQ(tm.Row(0) + tm.StoredColumn(64), tm.Row(0) + 64 * T);
  EXPECT_EQ(tm.Row(4), tm.Row(0) + T * K);

  ExpectSumsAsRowsInOrder(tm, plain.m, 14);
  // A range starting mid-tile, as a task split may.
  std::vector<float> x = RandomX(13, K, 16);
  for (Isa isa : SupportedIsas()) {
    for (int M = 1; M <= 13; ++M) {
      std::vector<float> y(M * N, -1.0f), part(M * N, -1.0f);
      MatMulRange(tm, x.data(), K, M, y.data(), N, 0, N, isa, 1);
      MatMulRange(tm, x.data(), K, M, part.data(), N, 0, 6, isa, 1);
      MatMulRange(tm, x.data(), K, M, part.data(), N, 6, N, isa, 1);
      ASSERT_TRUE(SameBits(y, part)) << IsaName(isa) << " M=" << M;
    }
  }

  // Views at every row phase, one of them also starting on group 2.
  struct View {
    int64_t r0, rows, c0;
  };
  for (const View& v :
       {View{1, 30, 0}, View{2, 35, 0}, View{3, 20, 0}, View{5, 9, 128}, View{4, 33, 0}}) {
    const Matrix pv = plain.m.Rows(v.r0, v.rows).Cols(v.c0, K - v.c0);
    const Matrix tv = tm.Rows(v.r0, v.rows).Cols(v.c0, K - v.c0);
    for (int64_t r = 0; r < v.rows; ++r) {
      for (int64_t c = 0; c < K - v.c0; ++c) {
        ASSERT_EQ(tv.Row(r)[tv.StoredColumn(c)], pv.Row(r)[c]) << v.r0 << ": " << r << "," << c;
      }
    }
    std::vector<float> xv = RandomX(5, K - v.c0, 15), wv(5 * v.rows);
    internal::MatMulRangeScalar(pv, xv.data(), K - v.c0, 5, wv.data(), v.rows, 0, v.rows);
    for (Isa isa : SupportedIsas()) {
      for (int M : {1, 5}) {
        for (int path = 1; path <= 2; ++path) {
          std::vector<float> y(M * v.rows);
          MatMulRange(tv, xv.data(), K - v.c0, M, y.data(), v.rows, 0, v.rows, isa, path);
          ASSERT_TRUE(SameBits(y, std::vector<float>(wv.begin(), wv.begin() + M * v.rows)))
              << IsaName(isa) << " r0=" << v.r0 << " M=" << M << " path=" << path;
        }
      }
    }
  }
}

// The decode kernel reads tiled rows as value * 2^-120 against x' * 2^112
// (kFp8RawShift), which needs x' * 2^112 to stay finite: activations of every
// size, x' subnormal, near the edge, past it in one value of a block, and
// past it everywhere, give the bits of the rows in order on every path.
TEST(MatMulFp8, RowTilesSumAsRowsInOrderForActivationsOfEverySize) {
  const int64_t N = 140, K = 4 * 64, T = kResidentRowTile;
  TestMatrix plain = MakeMatrix(DType::kFP8E4M3, N, K, 47);
  FillEveryCode(&plain, 9);
  std::vector<uint8_t> tiled(N * K, 0);
  WriteFp8Tiles(plain.m, T, tiled.data());
  Matrix tm = plain.m;
  tm.data = tiled.data();
  tm.interleaved = true;
  tm.row_tile = T;
  // x' is 2x to 8.4x here (block scales 2^-7 to 2.1 * 2^-7, times 256), so
  // 65536 is crossed between x = 8e3 and 3.3e4.
  for (const float size : {1e-41f, 1e-30f, 1.0f, 2e4f, 3.2e4f, 1e6f, 1e30f}) {
    for (const bool one_outlier : {false, true}) {
      const int M = 5;
      std::vector<float> x = RandomX(M, K, 17);
      if (one_outlier) {
        x[3 * K + 200] *= size;
      } else {
        for (float& v : x) v *= size;
      }
      ExpectEveryPathAsScalar(
          tm, plain.m, x, M,
          " size=" + std::to_string(size) + " outlier=" + std::to_string(one_outlier));
    }
  }
}

// The FP8 sum of kernels.h written out: x' = x * (block scale * 256) rounded
// once, w' = value / 256, fused multiply-adds into lane k % 16 in increasing
// k, the tail into lane k - K16, then the fixed tree. Rows 120..135 cross a
// 128-row scale edge, so two x' are in play.
TEST(MatMulFp8, ScaleGoesOnActivationsPerRowBlock) {
  const int64_t N = 256, K = 300, K16 = 288;
  TestMatrix full = MakeMatrix(DType::kFP8E4M3, N, K, 41);
  Matrix view = full.m;
  view.data = full.m.Row(120);
  view.rows = 16;
  view.row_offset = 120;
  const int M = 3;
  std::vector<float> x = RandomX(M, K, 12);
  std::vector<float> want(M * 16);
  for (int m = 0; m < M; ++m) {
    for (int64_t n = 0; n < 16; ++n) {
      float a[16] = {};
      for (int64_t k = 0; k < K; ++k) {
        const float xs = x[m * K + k] * (view.ScaleAt(n, k) * 256.0f);
        const float ws = LoadAsFloat(DType::kFP8E4M3, view.Row(n), k) / 256.0f;
        float& lane = a[k < K16 ? k % 16 : k - K16];
        lane = std::fma(ws, xs, lane);
      }
      float h[8];
      for (int l = 0; l < 8; ++l) h[l] = a[l] + a[l + 8];
      want[m * 16 + n] = ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));
    }
  }
  for (Isa isa : SupportedIsas()) {
    for (int path = 1; path <= 2; ++path) {
      std::vector<float> y(M * 16);
      MatMulRange(view, x.data(), K, M, y.data(), 16, 0, 16, isa, path);
      ASSERT_TRUE(SameBits(y, want)) << IsaName(isa) << " path=" << path;
    }
  }
}

TEST(Attention, RowsTogetherEqualRowsAloneAndScalar) {
  const int hd = 36, n_ctx = 41;
  std::vector<float> q = RandomX(n_ctx, hd, 1), k = RandomX(n_ctx, hd, 2),
                     v = RandomX(n_ctx, hd, 3);
  std::vector<float> kt(hd * n_ctx);
  for (int j = 0; j < n_ctx; ++j)
    for (int d = 0; d < hd; ++d) kt[d * n_ctx + j] = k[j * hd + d];
  std::vector<int64_t> pos(n_ctx);
  for (int i = 0; i < n_ctx; ++i) pos[i] = i;
  std::vector<float> scores(n_ctx);
  auto run = [&](int first, int rows, Isa isa, float* out) {
    AttendArgs a{
        q.data() + first * hd, hd,  rows, pos.data() + first, kt.data(), n_ctx, v.data(), hd, hd,
        scores.data(),         out, hd};
    AttendHead(a, isa);
  };
  std::vector<float> all(n_ctx * hd), one(n_ctx * hd), scalar(n_ctx * hd);
  run(0, n_ctx, DetectIsa(), all.data());
  for (int r = 0; r < n_ctx; ++r) run(r, 1, DetectIsa(), one.data() + r * hd);
  run(0, n_ctx, Isa::kScalar, scalar.data());
  EXPECT_TRUE(SameBits(all, one));
  EXPECT_TRUE(SameBits(all, scalar));
  // Row 0 sees only itself: its output is its own V.
  for (int d = 0; d < hd; ++d) EXPECT_FLOAT_EQ(all[d], v[d]);
  // Against a double-precision softmax(q k / sqrt(d)) v.
  for (int r = 0; r < n_ctx; r += 7) {
    std::vector<double> w(r + 1);
    double mx = -1e300, sum = 0;
    for (int j = 0; j <= r; ++j) {
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += double(q[r * hd + d]) * k[j * hd + d];
      w[j] = dot / std::sqrt(double(hd));
      mx = std::max(mx, w[j]);
    }
    for (int j = 0; j <= r; ++j) sum += (w[j] = std::exp(w[j] - mx));
    for (int d = 0; d < hd; ++d) {
      double o = 0;
      for (int j = 0; j <= r; ++j) o += w[j] / sum * v[j * hd + d];
      EXPECT_NEAR(all[r * hd + d], o, 1e-4) << r << "," << d;
    }
  }
}

// The softmax's exponential is the kernels' own: within 1 ulp of exp over
// the whole range a softmax gives it (x <= 0), 1 at 0, 0 where the true
// value is below the smallest normal float, NaN for NaN.
TEST(Attention, SoftmaxExpIsWithinOneUlp) {
  using internal::SoftmaxExp;
  EXPECT_EQ(SoftmaxExp(0.0f), 1.0f);
  EXPECT_EQ(SoftmaxExp(-0.0f), 1.0f);
  EXPECT_EQ(SoftmaxExp(-INFINITY), 0.0f);
  EXPECT_EQ(SoftmaxExp(-88.0f), 0.0f);
  EXPECT_TRUE(std::isnan(SoftmaxExp(NAN)));
  float worst = 0;
  for (float x = 0.0f; x > -87.3f; x = std::nextafter(x, -100.0f) - 1.3e-4f * -x - 1e-7f) {
    const double want = std::exp(double{x});
    const float got = SoftmaxExp(x);
    const double ulp =
        std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
    worst = std::max(worst, static_cast<float>(std::abs(got - want) / ulp));
  }
  EXPECT_LE(worst, 1.0f);
}

// Every instruction set's attention gives the reference's bits for the
// shapes the models have: the bundled model's 8-dim heads over contexts
// that end at every lane, a 64-dim head, and an MLA-like latent head (wider
// keys than values, values past one pass of registers, an explicit scale and
// the log-sum-exp), with K's rows at the worker's padded stride.
TEST(Attention, EveryIsaGivesTheReferenceBitsForEveryShape) {
  struct Shape {
    int hd, vd, n_ctx;
    float scale;
  };
  int underflows = 0;
  for (const Shape& sh : {Shape{8, 0, 77, 0.0f}, Shape{64, 0, 300, 0.0f}, Shape{80, 72, 45, 0.0f},
                          Shape{144, 136, 40, 0.11f}}) {
    const int vd = sh.vd > 0 ? sh.vd : sh.hd;
    const int64_t ldkt = SpreadStride(sh.n_ctx);
    std::vector<float> q = RandomX(sh.n_ctx, sh.hd, 7), k = RandomX(sh.n_ctx, sh.hd, 8),
                       v = RandomX(sh.n_ctx, sh.hd, 9);
    // Scores spread wide enough that some exponentials underflow to 0.
    for (float& x : q) x *= 20.0f;
    std::vector<float> kt(sh.hd * ldkt);
    for (int j = 0; j < sh.n_ctx; ++j)
      for (int d = 0; d < sh.hd; ++d) kt[d * ldkt + j] = k[j * sh.hd + d];
    std::vector<int64_t> pos(sh.n_ctx);
    for (int i = 0; i < sh.n_ctx; ++i) pos[i] = i;
    std::vector<float> scores(sh.n_ctx);
    auto run = [&](Isa isa, std::vector<float>* out, std::vector<float>* lse) {
      out->assign(sh.n_ctx * vd, 0.0f);
      lse->assign(sh.n_ctx, 0.0f);
      AttendArgs a{q.data(), sh.hd, sh.n_ctx, pos.data(),    kt.data(),   ldkt,
                   v.data(), sh.hd, sh.hd,    scores.data(), out->data(), vd};
      a.v_dim = sh.vd;
      a.scale = sh.scale;
      a.lse = lse->data();
      a.ld_lse = 1;
      AttendHead(a, isa);
    };
    std::vector<float> want, want_lse;
    run(Isa::kScalar, &want, &want_lse);
    // The scratch keeps the last row's probabilities: compared too, since a
    // tiny probability where the reference has 0 moves no output bit.
    const std::vector<float> want_p = scores;
    for (float p : want_p) underflows += p == 0.0f;
    for (Isa isa : SupportedIsas()) {
      std::vector<float> got, got_lse;
      run(isa, &got, &got_lse);
      EXPECT_TRUE(SameBits(got, want)) << IsaName(isa) << " hd=" << sh.hd;
      EXPECT_TRUE(SameBits(got_lse, want_lse)) << IsaName(isa) << " hd=" << sh.hd;
      EXPECT_TRUE(SameBits(scores, want_p)) << IsaName(isa) << " hd=" << sh.hd;
    }
  }
  EXPECT_GT(underflows, 0);
}

// Heads that share K and V (a GQA group, MLA's heads over one latent) are
// attended together: each head's outputs, log-sum-exps and probabilities
// are the reference's bits for that head alone, on every instruction set,
// whatever the number of heads in the call (more than one pass of them too),
// with rows that see different lengths of the context.
TEST(Attention, HeadsTogetherEqualEachHeadAlone) {
  struct Shape {
    int hd, vd, n_ctx, heads;
    float scale;
  };
  for (const Shape& sh :
       {Shape{8, 0, 77, 8, 0.0f}, Shape{64, 0, 300, 3, 0.0f}, Shape{144, 136, 140, 19, 0.11f}}) {
    const int vd = sh.vd > 0 ? sh.vd : sh.hd;
    const int64_t ldkt = SpreadStride(sh.n_ctx);
    const int rows = 5;
    std::vector<float> k = RandomX(sh.n_ctx, sh.hd, 8), v = RandomX(sh.n_ctx, sh.hd, 9);
    std::vector<float> kt(sh.hd * ldkt);
    for (int j = 0; j < sh.n_ctx; ++j)
      for (int d = 0; d < sh.hd; ++d) kt[d * ldkt + j] = k[j * sh.hd + d];
    // The last rows of the context, as a verify row's positions are.
    std::vector<int64_t> pos(rows);
    for (int r = 0; r < rows; ++r) pos[r] = sh.n_ctx - rows + r;
    std::vector<std::vector<float>> q(sh.heads);
    for (int h = 0; h < sh.heads; ++h) {
      q[h] = RandomX(rows, sh.hd, 100 + h);
      for (float& x : q[h]) x *= 6.0f;
    }
    auto args = [&](int h, float* scores, float* out, float* lse) {
      AttendArgs a{q[h].data(), sh.hd, rows,  pos.data(), kt.data(), ldkt,
                   v.data(),    sh.hd, sh.hd, scores,     out,       vd};
      a.v_dim = sh.vd;
      a.scale = sh.scale;
      a.lse = lse;
      a.ld_lse = 1;
      return a;
    };
    // Each head alone on the scalar reference.
    std::vector<std::vector<float>> want(sh.heads), want_lse(sh.heads), want_p(sh.heads);
    for (int h = 0; h < sh.heads; ++h) {
      want[h].assign(rows * vd, 0.0f);
      want_lse[h].assign(rows, 0.0f);
      want_p[h].assign(sh.n_ctx, 0.0f);
      AttendHead(args(h, want_p[h].data(), want[h].data(), want_lse[h].data()), Isa::kScalar);
    }
    for (Isa isa : SupportedIsas()) {
      std::vector<std::vector<float>> got(sh.heads), got_lse(sh.heads), got_p(sh.heads);
      std::vector<AttendArgs> all;
      for (int h = 0; h < sh.heads; ++h) {
        got[h].assign(rows * vd, -1.0f);
        got_lse[h].assign(rows, 0.0f);
        got_p[h].assign(sh.n_ctx, 0.0f);
        all.push_back(args(h, got_p[h].data(), got[h].data(), got_lse[h].data()));
      }
      AttendHeads(all.data(), sh.heads, isa);
      for (int h = 0; h < sh.heads; ++h) {
        EXPECT_TRUE(SameBits(got[h], want[h])) << IsaName(isa) << " hd=" << sh.hd << " head " << h;
        EXPECT_TRUE(SameBits(got_lse[h], want_lse[h])) << IsaName(isa) << " hd=" << sh.hd;
        EXPECT_TRUE(SameBits(got_p[h], want_p[h])) << IsaName(isa) << " hd=" << sh.hd;
      }
    }
  }
}

// Attention's keys transposed (and the indexer's): dst[c * ld_dst + r] is
// src[r * ld_src + c] exactly, on every instruction set, for shapes that are
// and are not multiples of the vector blocks, and nothing outside the rows
// and columns given is written.
TEST(Transpose, EveryIsaCopiesEveryElementAndNothingElse) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{8, 8}, std::pair{13, 576}, std::pair{77, 8},
                            std::pair{40, 37}, std::pair{300, 64}}) {
    const int64_t ld_src = cols + 3, ld_dst = SpreadStride(rows);
    std::vector<float> src = RandomX(rows, static_cast<int>(ld_src), 31);
    for (Isa isa : SupportedIsas()) {
      std::vector<float> dst(cols * ld_dst, -7.0f);
      Transpose(src.data(), rows, cols, ld_src, dst.data(), ld_dst, isa);
      for (int c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < ld_dst; ++r) {
          const float want = r < rows ? src[r * ld_src + c] : -7.0f;
          ASSERT_EQ(std::memcmp(&dst[c * ld_dst + r], &want, 4), 0)
              << IsaName(isa) << " " << rows << "x" << cols << " at " << r << "," << c;
        }
      }
    }
  }
}

// The DSA indexer's scores: the same bits on every instruction set and for
// any number of keys (a key's score never depends on the others), and the
// published sum_h w_h relu(q_h . k_j) in double precision.
TEST(IndexerScores, SameOnEveryIsaAndForAnyKeyCount) {
  const int heads = 3, hd = 20, n = 37;
  std::vector<float> q = RandomX(heads, hd, 4), k = RandomX(n, hd, 5), w = RandomX(1, heads, 6);
  std::vector<float> kt(hd * n);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) kt[d * n + j] = k[j * hd + d];
  auto run = [&](int64_t keys, Isa isa) {
    std::vector<float> dot(keys), scores(keys);
    IndexerScores({q.data(), w.data(), heads, hd, kt.data(), n, keys, dot.data(), scores.data()},
                  isa);
    return scores;
  };
  const std::vector<float> all = run(n, Isa::kScalar);
  for (Isa isa : SupportedIsas()) {
    EXPECT_TRUE(SameBits(run(n, isa), all)) << IsaName(isa);
    std::vector<float> some = run(11, isa);
    EXPECT_TRUE(SameBits(some, std::vector<float>(all.begin(), all.begin() + 11))) << IsaName(isa);
  }
  for (int j = 0; j < n; ++j) {
    double want = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += double(q[h * hd + d]) * k[j * hd + d];
      want += w[h] * std::max(dot, 0.0);
    }
    EXPECT_NEAR(all[j], want, 1e-4) << j;
  }
}

// A head's context read through GatherKvHead is KvCache::Gather's floats bit
// for bit, row-wise and transposed, on every instruction set: every pool
// dtype, head widths with and without a tail of 8, contexts ending inside a
// block and inside a group of 8 slots, FP8 slots holding NaN codes,
// subnormal codes and scales far from 1. Nothing outside the context is
// written.
TEST(GatherKvHead, EveryIsaGivesTheCacheGatherBits) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-30, 30);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
    for (auto [kv_heads, hd, bs] : {std::tuple{2, 8, 16}, std::tuple{3, 64, 16},
                                    std::tuple{1, 20, 16}, std::tuple{2, 13, 5}}) {
      KvPoolSpec spec;
      spec.num_blocks = 12;
      spec.block_size = bs;
      spec.dtype = dtype;
      auto cache = KvCache::Create(2, kv_heads, hd, spec);
      ASSERT_TRUE(cache.ok());
      // Blocks out of order, as a pool hands them out.
      const std::vector<int32_t> blocks = {7, 2, 11, 0, 5, 9, 1, 3, 10, 4, 6, 8};
      const int64_t cap = int64_t{bs} * static_cast<int64_t>(blocks.size());
      std::vector<float> row(kv_heads * hd);
      for (int64_t p = 0; p < cap; ++p) {
        // Each token its own magnitude: FP8 scales from 2^-30 to 2^30.
        const float m = std::ldexp(1.0f, magnitude(rng));
        for (int layer = 0; layer < 2; ++layer) {
          for (int kv = 0; kv < 2; ++kv) {
            for (float& x : row) x = u(rng) * m;
            // A few tiny values among large ones: FP8 subnormal codes.
            row[p % row.size()] *= 1e-3f;
            (*cache)->Store(blocks[p / bs], static_cast<int>(p % bs), layer, kv, row.data());
          }
        }
      }
      if (dtype == DType::kFP8E4M3) {
        // NaN codes in a few slots (a NaN activation stores 0x7F).
        for (int64_t p : {int64_t{3}, int64_t{bs + 1}, cap - 2}) {
          for (int kv = 0; kv < 2; ++kv) {
            const KvCache::HeadRows r = (*cache)->RowsOf(blocks[p / bs], 1, kv, kv_heads - 1);
            (*cache)->BlockData(blocks[p / bs])[r.elems - (*cache)->BlockData(blocks[p / bs]) +
                                                (p % bs) * r.slot_stride + hd / 2] =
                p % 2 == 0 ? 0x7F : 0xFF;
          }
        }
      }
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{bs}, int64_t{bs + 9}, cap - 3, cap}) {
        for (bool transposed : {false, true}) {
          const int64_t ld = transposed ? SpreadStride(n) : hd + 3;
          const int64_t size = transposed ? hd * ld : n * ld;
          for (int layer = 0; layer < 2; ++layer) {
            for (int kv = 0; kv < 2; ++kv) {
              for (int head = 0; head < kv_heads; ++head) {
                std::vector<float> want(size, -7.0f);
                if (transposed) {
                  (*cache)->GatherTransposed(blocks, n, layer, kv, head, want.data(), ld);
                } else {
                  (*cache)->Gather(blocks, n, layer, kv, head, want.data(), ld);
                }
                for (Isa isa : SupportedIsas()) {
                  std::vector<float> got(size, -7.0f);
                  GatherKvHead(**cache, blocks, n, layer, kv, head, got.data(), ld, transposed,
                               isa);
                  ASSERT_TRUE(SameBits(got, want))
                      << IsaName(isa) << " " << DTypeName(dtype) << " hd " << hd << " bs " << bs
                      << " n " << n << (transposed ? " transposed" : " rows") << " layer " << layer
                      << " kv " << kv << " head " << head;
                }
              }
            }
          }
        }
      }
    }
  }
}

// A latent cache's rows read through GatherLatentRows are GatherColumns' and
// GatherPositions' floats bit for bit on every instruction set: the packed
// FP8 layout with latent widths that are and are not whole groups of 128,
// index keys of odd widths, NaN codes in the latent and the index key, and a
// float pool for the path that is not packed. Nothing outside the rows is
// written.
// A latent pool (blocks of 16, `blocks` a permutation of its block ids) of
// random rows at positions [0, n) of every layer: each position its own
// magnitude (2^-20..2^20) and one tiny value (FP8 subnormal codes).
absl::StatusOr<std::unique_ptr<KvCache>> RandomLatentPool(DType dtype, LatentSplit split,
                                                          int layers,
                                                          const std::vector<int32_t>& blocks,
                                                          int64_t n, uint32_t seed) {
  const int W = split.latent + split.rope + split.index;
  KvPoolSpec spec;
  spec.num_blocks = static_cast<int>(blocks.size());
  spec.block_size = 16;
  spec.dtype = dtype;
  auto cache = KvCache::Create(layers, 1, W, spec, 1, split);
  if (!cache.ok()) return cache;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-20, 20);
  std::vector<float> row(W);
  for (int64_t p = 0; p < n; ++p) {
    const float m = std::ldexp(1.0f, magnitude(rng));
    for (int layer = 0; layer < layers; ++layer) {
      for (float& x : row) x = u(rng) * m;
      row[p % W] *= 1e-3f;
      (*cache)->Store(blocks[p / 16], static_cast<int>(p % 16), layer, 0, row.data());
    }
  }
  return cache;
}

TEST(GatherLatentRows, EveryIsaGivesTheCacheGatherBits) {
  for (DType dtype : {DType::kFP8E4M3, DType::kF32}) {
    for (LatentSplit split :
         {LatentSplit{256, 32, 0}, LatentSplit{200, 12, 41}, LatentSplit{128, 64, 64}}) {
      const int W = split.latent + split.rope + split.index;
      const std::vector<int32_t> blocks = {4, 1, 5, 0, 3, 2};
      const int64_t cap = 16 * static_cast<int64_t>(blocks.size());
      auto cache = RandomLatentPool(dtype, split, 2, blocks, cap, 23);
      ASSERT_TRUE(cache.ok());
      if ((*cache)->packed_latent()) {
        // NaN codes: a latent byte of one position, an index byte of another.
        const_cast<uint8_t*>((*cache)->PackedRow(blocks, 5, 1))[split.latent - 1] = 0x7F;
        if (split.index > 0) {
          const int64_t index0 = split.latent + 4 * ((split.latent + 127) / 128) + 2 * split.rope;
          const_cast<uint8_t*>((*cache)->PackedRow(blocks, 40, 0))[index0 + 3] = 0xFF;
        }
      }
      std::vector<std::pair<int, int>> parts = {{0, split.latent + split.rope}};
      if (split.index > 0) parts.push_back({split.latent + split.rope, split.index});
      if (split.index > 0 || dtype != DType::kFP8E4M3) parts.push_back({0, W});
      const std::vector<int32_t> picked = {0, 5, 6, 17, 40, 41, 95};
      for (auto [col0, cols] : parts) {
        const int64_t ld = cols + 5;
        for (int layer = 0; layer < 2; ++layer) {
          for (auto [first, n] : {std::pair<int64_t, int64_t>{0, cap}, {3, 50}}) {
            std::vector<float> want(n * ld, -7.0f);
            (*cache)->GatherColumns(blocks, first, n, layer, col0, cols, want.data(), ld);
            for (Isa isa : SupportedIsas()) {
              std::vector<float> got(n * ld, -7.0f);
              GatherLatentRows(**cache, blocks, first, nullptr, n, layer, col0, cols, got.data(),
                               ld, isa);
              ASSERT_TRUE(SameBits(got, want))
                  << IsaName(isa) << " " << DTypeName(dtype) << " " << split.latent << "/"
                  << split.rope << "/" << split.index << " cols " << col0 << "+" << cols;
            }
          }
          const int64_t n = static_cast<int64_t>(picked.size());
          std::vector<float> want(n * ld, -7.0f);
          (*cache)->GatherPositions(blocks, picked, layer, col0, cols, want.data(), ld);
          for (Isa isa : SupportedIsas()) {
            std::vector<float> got(n * ld, -7.0f);
            GatherLatentRows(**cache, blocks, 0, picked.data(), n, layer, col0, cols, got.data(),
                             ld, isa);
            ASSERT_TRUE(SameBits(got, want)) << IsaName(isa) << " positions";
          }
        }
      }
    }
  }
}

// Attention reading its context through a KvTileSource gives the bits it
// gives from float copies of the whole context, on every instruction set:
// context lengths around the tile sizes (32 for K, 64 for V) and the 8-lane
// blocks, narrow values (copied whole), a value width with a tail of 8 and
// one below head_dim, more heads than a pass takes, decode and verify rows.
struct CopySource {
  const std::vector<float>* k;
  const std::vector<float>* v;
  int hd;
};
void FillFromCopies(const void* ctx, bool values, int64_t j0, int64_t j1, float* dst, int64_t ld) {
  const CopySource& c = *static_cast<const CopySource*>(ctx);
  for (int64_t j = j0; j < j1; ++j) {
    for (int d = 0; d < c.hd; ++d) {
      if (values) {
        dst[(j - j0) * ld + d] = (*c.v)[j * c.hd + d];
      } else {
        dst[d * ld + (j - j0)] = (*c.k)[j * c.hd + d];
      }
    }
  }
}

TEST(Attention, TileSourceEqualsWholeCopies) {
  struct Shape {
    int hd, vd, heads, rows;
  };
  for (const Shape& sh : {Shape{8, 0, 4, 1}, Shape{20, 0, 3, 1}, Shape{64, 0, 17, 1},
                          Shape{64, 0, 8, 3}, Shape{72, 64, 5, 2}}) {
    for (int n_ctx : {1, 5, 8, 31, 32, 33, 64, 65, 100, 257}) {
      if (n_ctx < sh.rows) continue;
      const int vd = sh.vd > 0 ? sh.vd : sh.hd;
      const int64_t ldkt = SpreadStride(n_ctx);
      std::vector<float> k = RandomX(n_ctx, sh.hd, 41), v = RandomX(n_ctx, sh.hd, 42);
      std::vector<float> kt(sh.hd * ldkt);
      for (int j = 0; j < n_ctx; ++j)
        for (int d = 0; d < sh.hd; ++d) kt[d * ldkt + j] = k[j * sh.hd + d];
      std::vector<int64_t> pos(sh.rows);
      for (int r = 0; r < sh.rows; ++r) pos[r] = n_ctx - sh.rows + r;
      const CopySource copies{&k, &v, sh.hd};
      const KvTileSource source{FillFromCopies, &copies};
      std::vector<std::vector<float>> q(sh.heads);
      for (int h = 0; h < sh.heads; ++h) q[h] = RandomX(sh.rows, sh.hd, 200 + h);
      for (Isa isa : SupportedIsas()) {
        std::vector<std::vector<float>> out[2], lse[2], p[2];
        for (int way = 0; way < 2; ++way) {
          std::vector<AttendArgs> all;
          out[way].resize(sh.heads);
          lse[way].resize(sh.heads);
          p[way].resize(sh.heads);
          for (int h = 0; h < sh.heads; ++h) {
            out[way][h].assign(sh.rows * vd, -1.0f);
            lse[way][h].assign(sh.rows, 0.0f);
            p[way][h].assign(n_ctx, 0.0f);
            AttendArgs a{q[h].data(), sh.hd, sh.rows, pos.data(),       kt.data(),          ldkt,
                         v.data(),    sh.hd, sh.hd,   p[way][h].data(), out[way][h].data(), vd};
            a.v_dim = sh.vd;
            a.lse = lse[way][h].data();
            a.ld_lse = 1;
            if (way == 1) {
              a.kt = nullptr;
              a.v = nullptr;
              a.source = &source;
            }
            all.push_back(a);
          }
          AttendHeads(all.data(), sh.heads, isa);
        }
        for (int h = 0; h < sh.heads; ++h) {
          ASSERT_TRUE(SameBits(out[1][h], out[0][h]))
              << IsaName(isa) << " hd " << sh.hd << " n " << n_ctx << " head " << h;
          ASSERT_TRUE(SameBits(lse[1][h], lse[0][h])) << IsaName(isa) << " n " << n_ctx;
          ASSERT_TRUE(SameBits(p[1][h], p[0][h])) << IsaName(isa) << " n " << n_ctx;
        }
      }
    }
  }
}

// The paged pool as a tile source (FillPagedKv): the same bits as
// attending to GatherKvHead's copies, block sizes that do and do not divide
// the tiles, every pool dtype and instruction set.
TEST(Attention, PagedSourceEqualsGatheredCopies) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
    for (int bs : {16, 5}) {
      const int hd = 64, kv_heads = 2, heads = 4, layers = 1;
      KvPoolSpec spec;
      spec.num_blocks = 48;
      spec.block_size = bs;
      spec.dtype = dtype;
      auto cache = KvCache::Create(layers, kv_heads, hd, spec);
      ASSERT_TRUE(cache.ok());
      std::vector<int32_t> blocks(spec.num_blocks);
      for (int i = 0; i < spec.num_blocks; ++i) blocks[i] = (i * 7) % spec.num_blocks;
      const int64_t n = int64_t{bs} * spec.num_blocks - 3;
      std::vector<float> row(kv_heads * hd);
      for (int64_t p = 0; p < n; ++p) {
        for (int kv = 0; kv < 2; ++kv) {
          for (float& x : row) x = u(rng);
          (*cache)->Store(blocks[p / bs], static_cast<int>(p % bs), 0, kv, row.data());
        }
      }
      const int64_t pos = n - 1;
      const int64_t ldkt = SpreadStride(n);
      for (Isa isa : SupportedIsas()) {
        const int g = 1;
        std::vector<float> kt(hd * ldkt), v(n * hd);
        GatherKvHead(**cache, blocks, n, 0, 0, g, kt.data(), ldkt, true, isa);
        GatherKvHead(**cache, blocks, n, 0, 1, g, v.data(), hd, false, isa);
        const PagedKv ctx{
            .cache = cache->get(), .block_ids = blocks, .n = n, .layer = 0, .head = g, .isa = isa};
        const KvTileSource source{FillPagedKv, &ctx};
        std::vector<float> q = RandomX(heads, hd, 77);
        std::vector<float> out[2], lse[2];
        for (int way = 0; way < 2; ++way) {
          out[way].assign(heads * hd, -1.0f);
          lse[way].assign(heads, 0.0f);
          std::vector<float> scores(heads * n);
          std::vector<AttendArgs> all;
          for (int h = 0; h < heads; ++h) {
            AttendArgs a{q.data() + h * hd,
                         hd,
                         1,
                         &pos,
                         kt.data(),
                         ldkt,
                         v.data(),
                         hd,
                         hd,
                         scores.data() + h * n,
                         out[way].data() + h * hd,
                         hd};
            a.lse = lse[way].data() + h;
            a.ld_lse = 1;
            if (way == 1) a.source = &source;
            all.push_back(a);
          }
          AttendHeads(all.data(), heads, isa);
        }
        EXPECT_TRUE(SameBits(out[1], out[0]))
            << IsaName(isa) << " " << DTypeName(dtype) << " bs " << bs;
        EXPECT_TRUE(SameBits(lse[1], lse[0])) << IsaName(isa) << " " << DTypeName(dtype);
      }
    }
  }
}

// MLA's latent pool as a tile source (FillPagedKv with cols): the same bits as
// attending to GatherLatentRows' copy and its transpose, latents as values
// (v_dim below head_dim), packed FP8 and float pools, every instruction set.
TEST(Attention, PagedLatentSourceEqualsGatheredCopies) {
  const LatentSplit split{128, 32, 0};
  const int W = split.latent + split.rope, heads = 3;
  for (DType dtype : {DType::kFP8E4M3, DType::kBF16}) {
    const std::vector<int32_t> blocks = {3, 8, 0, 5, 1, 7, 2, 6, 4};
    const int64_t n = 16 * 9 - 5;
    auto cache = RandomLatentPool(dtype, split, 1, blocks, n, 31);
    ASSERT_TRUE(cache.ok());
    const int64_t pos = n - 1, ldkt = SpreadStride(n);
    for (Isa isa : SupportedIsas()) {
      std::vector<float> rows(n * W), kt(W * ldkt);
      GatherLatentRows(**cache, blocks, 0, nullptr, n, 0, 0, W, rows.data(), W, isa);
      Transpose(rows.data(), n, W, W, kt.data(), ldkt, isa);
      const PagedKv ctx{
          .cache = cache->get(), .block_ids = blocks, .n = n, .layer = 0, .cols = W, .isa = isa};
      const KvTileSource source{FillPagedKv, &ctx};
      std::vector<float> q = RandomX(heads, W, 78);
      std::vector<float> out[2];
      for (int way = 0; way < 2; ++way) {
        out[way].assign(heads * split.latent, -1.0f);
        std::vector<float> scores(heads * n);
        std::vector<AttendArgs> all;
        for (int h = 0; h < heads; ++h) {
          AttendArgs a{q.data() + h * W,
                       W,
                       1,
                       &pos,
                       kt.data(),
                       ldkt,
                       rows.data(),
                       W,
                       W,
                       scores.data() + h * n,
                       out[way].data() + h * split.latent,
                       split.latent};
          a.v_dim = split.latent;
          a.scale = 0.07f;
          if (way == 1) a.source = &source;
          all.push_back(a);
        }
        AttendHeads(all.data(), heads, isa);
      }
      EXPECT_TRUE(SameBits(out[1], out[0])) << IsaName(isa) << " " << DTypeName(dtype);
    }
  }
}

}  // namespace
}  // namespace ringlane::worker::cpu
