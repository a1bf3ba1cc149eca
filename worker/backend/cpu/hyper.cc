// Manifold-constrained hyper-connections on the CPU (ComputeOps::HyperExpand,
// HyperPre, HyperPost). Each row is computed alone, in one order, so a
// token's streams do not depend on the rows it shares a round with. The
// split of the mixes (a few dozen values per row) runs in double: the
// Sinkhorn normalisations repeat divisions whose rounding would otherwise
// add up over the iterations.
#include <cmath>
#include <cstring>
#include <vector>

#include "worker/backend/cpu/cpu_ops.h"

namespace ringlane::worker::cpu {

namespace {

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

void CpuOps::HyperExpand(const float* x, int mult, int64_t dim, int rows, float* streams) {
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < mult; ++h) {
      std::memcpy(streams + (int64_t{t} * mult + h) * dim, x + int64_t{t} * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    }
  }
}

void CpuOps::HyperPre(const HyperArgs& a, const float* streams, const float* mixes,
                      int64_t ld_mixes, int rows, float* y, float* coeffs) {
  const int n = a.mult;
  const double eps = a.eps;
  std::vector<double> pre(static_cast<size_t>(n)), comb(static_cast<size_t>(n) * n);
  for (int t = 0; t < rows; ++t) {
    const float* m = a.mean ? nullptr : mixes + int64_t{t} * ld_mixes;
    for (int h = 0; h < n; ++h) {
      pre[h] = a.mean ? 1.0 / n : Sigmoid(double{m[h]} * a.scale[0] + a.base[h]) + eps;
    }
    const float* s = streams + int64_t{t} * n * a.dim;
    float* out = y + int64_t{t} * a.dim;
    for (int64_t d = 0; d < a.dim; ++d) {
      double acc = 0.0;
      for (int h = 0; h < n; ++h) acc += pre[h] * s[h * a.dim + d];
      out[d] = static_cast<float>(acc);
    }
    if (a.head || a.mean) continue;
    float* c = coeffs + int64_t{t} * (n + n * n);
    for (int h = 0; h < n; ++h) {
      c[h] = static_cast<float>(2.0 * Sigmoid(double{m[n + h]} * a.scale[1] + a.base[n + h]));
    }
    // comb[a][b]: a softmax over b for each a, then Sinkhorn: columns, and
    // (iters - 1) times rows then columns.
    for (int r = 0; r < n; ++r) {
      double mx = -INFINITY;
      for (int b = 0; b < n; ++b) {
        const int i = 2 * n + r * n + b;
        comb[r * n + b] = double{m[i]} * a.scale[2] + a.base[i];
        mx = std::max(mx, comb[r * n + b]);
      }
      double sum = 0.0;
      for (int b = 0; b < n; ++b) sum += (comb[r * n + b] = std::exp(comb[r * n + b] - mx));
      for (int b = 0; b < n; ++b) comb[r * n + b] = comb[r * n + b] / sum + eps;
    }
    auto columns = [&] {
      for (int b = 0; b < n; ++b) {
        double sum = 0.0;
        for (int r = 0; r < n; ++r) sum += comb[r * n + b];
        for (int r = 0; r < n; ++r) comb[r * n + b] /= sum + eps;
      }
    };
    columns();
    for (int it = 1; it < a.sinkhorn_iters; ++it) {
      for (int r = 0; r < n; ++r) {
        double sum = 0.0;
        for (int b = 0; b < n; ++b) sum += comb[r * n + b];
        for (int b = 0; b < n; ++b) comb[r * n + b] /= sum + eps;
      }
      columns();
    }
    for (int i = 0; i < n * n; ++i) c[n + i] = static_cast<float>(comb[i]);
  }
}

void CpuOps::HyperPost(const float* o, const float* coeffs, int mult, int64_t dim, int rows,
                       float* streams) {
  const int n = mult;
  std::vector<float>& old = hyper_old_;
  old.resize(static_cast<size_t>(n) * dim);
  for (int t = 0; t < rows; ++t) {
    float* s = streams + int64_t{t} * n * dim;
    std::memcpy(old.data(), s, old.size() * sizeof(float));
    const float* c = coeffs + int64_t{t} * (n + n * n);
    const float* ot = o + int64_t{t} * dim;
    for (int b = 0; b < n; ++b) {
      for (int64_t d = 0; d < dim; ++d) {
        double acc = double{c[b]} * ot[d];
        for (int r = 0; r < n; ++r) acc += double{c[n + r * n + b]} * old[r * dim + d];
        s[b * dim + d] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace ringlane::worker::cpu
