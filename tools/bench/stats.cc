#include "tools/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ringlane::bench {

namespace {

// `sorted` is non-empty and ascending.
double SortedPercentile(const std::vector<double>& sorted, double q) {
  const double h = (static_cast<double>(sorted.size()) - 1) * std::clamp(q, 0.0, 100.0) / 100;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  return SortedPercentile(values, q);
}

Summary Summarize(const std::vector<double>& values) {
  Summary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.mean = s.p50 = s.p90 = s.p99 = s.max = nan;
    return s;
  }
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  s.p50 = SortedPercentile(sorted, 50);
  s.p90 = SortedPercentile(sorted, 90);
  s.p99 = SortedPercentile(sorted, 99);
  s.max = sorted.back();
  return s;
}

}  // namespace ringlane::bench
