// Percentiles and summaries of latency samples for ringlane-bench.
//
// Method (stated in every report): the percentile q of n sorted values
// x[0..n) is the linear interpolation at rank h = (n - 1) * q / 100 between
// x[floor(h)] and x[ceil(h)], i.e. Hyndman and Fan's type 7, NumPy's and
// R's default. It is exact at the sample points (p0 = min, p100 = max) and
// never invents a value outside the samples' range; with few samples a p99
// is close to the maximum, which is what an operator should read it as.
#ifndef RINGLANE_TOOLS_BENCH_STATS_H_
#define RINGLANE_TOOLS_BENCH_STATS_H_

#include <cstdint>
#include <vector>

namespace ringlane::bench {

// The q-th percentile (0 <= q <= 100) of `values` by the method above; NaN
// when `values` is empty. Sorts a copy.
double Percentile(std::vector<double> values, double q);

struct Summary {
  int64_t count = 0;
  double mean = 0;  // NaN when count == 0, as are the percentiles
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};
Summary Summarize(const std::vector<double>& values);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_STATS_H_
