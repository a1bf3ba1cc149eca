#include "worker/backend/cpu/cpu_ops.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::worker::cpu {
namespace {

Matrix F32(const std::vector<float>& data, int64_t rows, int64_t cols) {
  Matrix m;
  m.dtype = DType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = data.data();
  m.row_stride_bytes = cols * static_cast<int64_t>(sizeof(float));
  return m;
}

std::vector<float> Ramp(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale);
  return v;
}

// More outputs than the kernel's shared loop takes give each output the same
// sums as a matmul of its own.
TEST(CpuOps, MatMulSharedOfAnyCountMatchesSingleMatMuls) {
  ThreadPool pool(2);
  CpuOps ops(&pool, DetectIsa(), nullptr);
  const int K = 40, N = 24, M = 3;
  std::vector<std::vector<float>> w;
  for (int i = 0; i < 5; ++i) w.push_back(Ramp(N * K, 0.1f * (i + 1)));
  std::vector<Matrix> mats;
  for (const auto& d : w) mats.push_back(F32(d, N, K));
  const std::vector<float> x = Ramp(M * K, 0.37f);
  for (size_t count = 1; count <= mats.size(); ++count) {
    std::vector<std::vector<float>> shared(count, std::vector<float>(M * N));
    std::vector<MatMulTarget> targets;
    for (size_t i = 0; i < count; ++i) targets.push_back({&mats[i], shared[i].data(), N});
    ops.MatMulShared(targets, x.data(), K, M);
    for (size_t i = 0; i < count; ++i) {
      std::vector<float> one(M * N);
      ops.MatMul(mats[i], x.data(), K, M, one.data(), N);
      EXPECT_EQ(shared[i], one) << "output " << i << " of " << count;
    }
  }
}

// A rank writes the rows of its own vocabulary and zeros for the others'.
TEST(CpuOps, EmbedIsVocabularyParallel) {
  ThreadPool pool(1);
  CpuOps ops(&pool, Isa::kScalar, nullptr);
  const std::vector<float> table = Ramp(4 * 8, 0.5f);  // token ids [10, 14)
  const Matrix m = F32(table, 4, 8);
  const std::vector<int32_t> tokens = {9, 10, 13, 14};
  const std::vector<int64_t> positions = {0, 1, 2, 3};
  RoundRows rows;
  rows.rows = 4;
  rows.tokens = tokens.data();
  rows.positions = positions.data();
  ops.BeginRound(rows);
  std::vector<float> out(4 * 8, -1.0f);
  ops.Embed(m, 10, 4, out.data());
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(out[0 * 8 + d], 0.0f);
    EXPECT_EQ(out[1 * 8 + d], table[0 * 8 + d]);
    EXPECT_EQ(out[2 * 8 + d], table[3 * 8 + d]);
    EXPECT_EQ(out[3 * 8 + d], 0.0f);
  }
}

TEST(CpuOps, ScratchKeepsItsMemoryWhileLargeEnough) {
  ThreadPool pool(1);
  CpuOps ops(&pool, Isa::kScalar, nullptr);
  float* a = ops.Scratch(3, 100);
  a[99] = 7.0f;
  EXPECT_EQ(ops.Scratch(3, 50), a);
  EXPECT_EQ(ops.Scratch(3, 100)[99], 7.0f);
  EXPECT_NE(ops.Scratch(0, 100), a);
}

TEST(CpuOps, WithoutAGroupCollectivesAreTheIdentity) {
  ThreadPool pool(1);
  CpuOps ops(&pool, Isa::kScalar, nullptr);
  EXPECT_EQ(ops.group_size(), 1);
  std::vector<float> data = {1.0f, 2.0f, 3.0f}, out(3);
  ASSERT_TRUE(ops.AllReduceSum(data.data(), 3).ok());
  EXPECT_EQ(data, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  ASSERT_TRUE(ops.AllGather(data.data(), 3, out.data()).ok());
  EXPECT_EQ(out, data);
}

// Hyper-connections, against the same steps written out here: the stream
// weights and sum, the output weights, a mixing matrix whose columns sum to 1
// (the last Sinkhorn step) and whose rows nearly do, and the new streams.
TEST(CpuOps, HyperConnectionsSplitMixAndSum) {
  ThreadPool pool(1);
  CpuOps ops(&pool, Isa::kScalar, nullptr);
  const int n = 3, rows = 2;
  const int64_t dim = 4, mix = (2 + n) * n;
  const std::vector<float> streams = Ramp(rows * n * dim, 0.37f);
  const std::vector<float> mixes = Ramp(rows * mix, 0.91f);
  const std::vector<float> scale = {1.2f, 0.8f, 1.1f};
  const std::vector<float> base = Ramp(mix, 0.23f);
  HyperArgs a;
  a.mult = n;
  a.dim = dim;
  a.sinkhorn_iters = 20;
  a.eps = 1e-6f;
  a.scale = scale;
  a.base = base;
  std::vector<float> y(rows * dim), coeffs(rows * (n + n * n));
  ops.HyperPre(a, streams.data(), mixes.data(), mix, rows, y.data(), coeffs.data());
  auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  for (int t = 0; t < rows; ++t) {
    const float* m = mixes.data() + t * mix;
    const float* c = coeffs.data() + t * (n + n * n);
    for (int64_t d = 0; d < dim; ++d) {
      double want = 0.0;
      for (int h = 0; h < n; ++h) {
        want += (sigmoid(m[h] * 1.2 + base[h]) + 1e-6) * streams[(t * n + h) * dim + d];
      }
      EXPECT_NEAR(y[t * dim + d], want, 1e-5);
    }
    for (int h = 0; h < n; ++h) {
      EXPECT_NEAR(c[h], 2.0 * sigmoid(m[n + h] * 0.8 + base[n + h]), 1e-6);
    }
    for (int b = 0; b < n; ++b) {
      double col = 0.0, row = 0.0;
      for (int r = 0; r < n; ++r) {
        EXPECT_GT(c[n + r * n + b], 0.0f);
        col += c[n + r * n + b];
        row += c[n + b * n + r];
      }
      EXPECT_NEAR(col, 1.0, 1e-5);
      EXPECT_NEAR(row, 1.0, 1e-3);
    }
  }
  // The head's sum writes no coefficients.
  std::vector<float> untouched(coeffs.size(), -7.0f);
  a.head = true;
  ops.HyperPre(a, streams.data(), mixes.data(), mix, rows, y.data(), untouched.data());
  for (float v : untouched) EXPECT_EQ(v, -7.0f);
  // GLM-5.3-Flash's head: the streams' plain mean, no mixes read.
  a.mean = true;
  ops.HyperPre(a, streams.data(), nullptr, 0, rows, y.data(), untouched.data());
  for (int t = 0; t < rows; ++t) {
    for (int64_t d = 0; d < dim; ++d) {
      double want = 0.0;
      for (int h = 0; h < n; ++h) want += streams[(t * n + h) * dim + d];
      EXPECT_NEAR(y[t * dim + d], want / n, 1e-6);
    }
  }
  for (float v : untouched) EXPECT_EQ(v, -7.0f);

  const std::vector<float> o = Ramp(rows * dim, 0.59f);
  std::vector<float> next = streams;
  ops.HyperPost(o.data(), coeffs.data(), n, dim, rows, next.data());
  for (int t = 0; t < rows; ++t) {
    const float* c = coeffs.data() + t * (n + n * n);
    for (int b = 0; b < n; ++b) {
      for (int64_t d = 0; d < dim; ++d) {
        double want = double{c[b]} * o[t * dim + d];
        for (int r = 0; r < n; ++r)
          want += double{c[n + r * n + b]} * streams[(t * n + r) * dim + d];
        EXPECT_NEAR(next[(t * n + b) * dim + d], want, 1e-5);
      }
    }
  }
  std::vector<float> expanded(rows * n * dim);
  ops.HyperExpand(o.data(), n, dim, rows, expanded.data());
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < n; ++h) {
      for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(expanded[(t * n + h) * dim + d], o[t * dim + d]);
    }
  }
}

}  // namespace
}  // namespace ringlane::worker::cpu
