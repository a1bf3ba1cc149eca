// Google Benchmark of the matmul kernels on one thread: bytes of weights
// streamed per second for decode-sized row counts, flops for prefill-sized;
// and of one head's attention for one query row against a context.
//
//   build/tools/ringlane-kernels-bench --benchmark_filter=FP8
//   build/tools/ringlane-kernels-bench --benchmark_filter=Attend
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tools/read_roofline.h"
#include "worker/aligned.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/model/resident.h"

namespace {

namespace rw = ringlane::worker;

struct Weights {
  rw::Matrix m;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

Weights Make(rw::DType dt, int64_t rows, int64_t cols, float fp8_size = 100.0f) {
  Weights w;
  w.m.dtype = dt;
  w.m.rows = rows;
  w.m.cols = cols;
  w.m.row_stride_bytes = cols * static_cast<int64_t>(rw::DTypeSize(dt));
  w.bytes.resize(rows * w.m.row_stride_bytes);
  // Weights as a quantized checkpoint has them: Gaussian values scaled so a
  // block's largest magnitude sits near the top of the FP8 range (so FP8
  // subnormals are as rare as in real weights).
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(rows * cols);
  for (size_t i = 0; i < n; ++i) {
    const float v = g(rng);
    uint8_t* p = w.bytes.data() + i * rw::DTypeSize(dt);
    switch (dt) {
      case rw::DType::kFP8E4M3:
        *p = rw::FloatToFp8E4M3(v * fp8_size);
        break;
      case rw::DType::kBF16: {
        uint16_t h = rw::FloatToBf16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case rw::DType::kF16: {
        uint16_t h = rw::FloatToF16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case rw::DType::kF32:
        std::memcpy(p, &v, 4);
        break;
    }
  }
  if (dt == rw::DType::kFP8E4M3) {
    w.m.scale_cols = (cols + 127) / 128;
    w.scales.assign(((rows + 127) / 128) * w.m.scale_cols, 0.01f);
    w.m.scale = w.scales.data();
  }
  w.m.data = w.bytes.data();
  return w;
}

// `rows` 5632 (11.5 MB of FP8) streams from memory or L3; 256 (0.5 MB) stays
// in L2, which shows the kernel's own cost per weight. `tiled`: through
// MatMul, the engine's own split (prefill: tasks of 128 output rows, each
// block's weights converted once and met by 64-row tiles of x), on the
// calling thread, instead of one MatMulRange. `layout`:
// FP8 rows in order, in the interleaved groups the worker stores them in
// (Matrix::interleaved), or those in tiles of 4 rows (Matrix::row_tile, the
// worker's layout).
// `fp8_size`: the FP8 values' standard deviation; 0.01 makes most of them
// subnormal (below 2^-6), which the tiled layout's F32 route multiplies as
// subnormal floats.
enum class Layout { kInOrder, kGrouped, kRowTiles };
void BM_MatMul(benchmark::State& state, rw::DType dt, int64_t rows, bool tiled,
               Layout layout = Layout::kInOrder, float fp8_size = 100.0f) {
  const int M = static_cast<int>(state.range(0));
  // range(1): 0 = the best instruction set here, 1 = AVX2 at most.
  const auto isa = ringlane::worker::cpu::DetectIsa(state.range(1) == 0);
  state.SetLabel(ringlane::worker::cpu::IsaName(isa));
  const int64_t N = rows, K = 2048;
  Weights w = Make(dt, N, K, fp8_size);
  if (layout == Layout::kGrouped) {
    const std::vector<uint8_t> plain = w.bytes;
    for (int64_t r = 0; r < N; ++r) rw::InterleaveFp8Row(&plain[r * K], K, &w.bytes[r * K]);
    w.m.interleaved = true;
  } else if (layout == Layout::kRowTiles) {
    // Both sizes are whole tiles: no padding rows.
    const std::vector<uint8_t> plain = w.bytes;
    rw::Matrix src = w.m;
    src.data = plain.data();
    rw::WriteFp8Tiles(src, rw::kResidentRowTile, w.bytes.data());
    w.m.interleaved = true;
    w.m.row_tile = rw::kResidentRowTile;
  }
  rw::AlignedFloats x(M * K, 0.5f), y(M * N);
  for (auto _ : state) {
    if (tiled) {
      ringlane::worker::cpu::MatMul(w.m, x.data(), K, M, y.data(), N, nullptr, isa);
    } else {
      ringlane::worker::cpu::MatMulRange(w.m, x.data(), K, M, y.data(), N, 0, N, isa);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.bytes.size()));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_MatMul, FP8Tiled, rw::DType::kFP8E4M3, 5632, true)
    ->Args({512, 0})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8, rw::DType::kFP8E4M3, 5632, false)
    ->ArgsProduct({{1, 4, 5, 8, 64, 512}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8InL2, rw::DType::kFP8E4M3, 256, false)
    ->ArgsProduct({{1, 2, 5, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8Grouped, rw::DType::kFP8E4M3, 5632, false, Layout::kGrouped)
    ->ArgsProduct({{1, 4, 5, 8, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8GroupedInL2, rw::DType::kFP8E4M3, 256, false, Layout::kGrouped)
    ->ArgsProduct({{1, 2, 5, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8RowTiles, rw::DType::kFP8E4M3, 5632, false, Layout::kRowTiles)
    ->ArgsProduct({{1, 4, 5, 8, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8RowTilesInL2, rw::DType::kFP8E4M3, 256, false, Layout::kRowTiles)
    ->ArgsProduct({{1, 2, 5, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, FP8RowTilesSubnormalInL2, rw::DType::kFP8E4M3, 256, false,
                  Layout::kRowTiles, 0.01f)
    ->ArgsProduct({{1, 5}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MatMul, BF16, rw::DType::kBF16, 5632, false)
    ->ArgsProduct({{1, 5, 64}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MatMul, F32, rw::DType::kF32, 5632, false)
    ->ArgsProduct({{1, 64}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// The decode kernel streaming a matrix no cache holds (256 MB of FP8 in
// row tiles, on 2 MiB pages as the worker's), with a plain read of as many
// bytes (the engine bench's roofline, tools/read_roofline.h) timed in every
// iteration: counters read_GB/s and of_read (the kernel's bytes per second
// over the read's).
void BM_MatMulDram(benchmark::State& state) {
  const int M = static_cast<int>(state.range(0));
  const auto isa = ringlane::worker::cpu::DetectIsa(state.range(1) == 0);
  state.SetLabel(ringlane::worker::cpu::IsaName(isa));
  const int64_t N = 131072, K = 2048;
  const size_t bytes = static_cast<size_t>(N * K);
  // Codes from a table of quantized Gaussians (drawing 268M normals would
  // take most of the run), at shifting offsets.
  std::vector<uint8_t> table(65537);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& c : table) c = rw::FloatToFp8E4M3(g(rng) * 100.0f);
  auto* w = static_cast<uint8_t*>(ringlane::tools::AllocHuge(bytes));
  // The roofline's own buffer and kernel (engine bench's): the FP8 bytes read
  // as floats would hold subnormals and NaNs.
  auto* plain = static_cast<float*>(ringlane::tools::AllocHuge(bytes));
  if (w == nullptr || plain == nullptr) {
    state.SkipWithError("out of memory");
    return;
  }
  for (size_t i = 0; i < bytes / 4; ++i) plain[i] = 1.0f;
  for (size_t i = 0; i < bytes; i += 65536) {
    std::memcpy(w + i, table.data() + (i / 65536) % 7, std::min<size_t>(65536, bytes - i));
  }
  rw::Matrix m;
  m.dtype = rw::DType::kFP8E4M3;
  m.rows = N;
  m.cols = K;
  m.row_stride_bytes = K;
  m.interleaved = true;
  m.row_tile = rw::kResidentRowTile;
  m.data = w;
  std::vector<float> scales(((N + 127) / 128) * ((K + 127) / 128), 0.01f);
  m.scale = scales.data();
  m.scale_cols = (K + 127) / 128;
  rw::AlignedFloats x(M * K, 0.5f), y(M * N);
  double read_s = 0, kernel_s = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    ringlane::worker::cpu::MatMulRange(m, x.data(), K, M, y.data(), N, 0, N, isa);
    benchmark::DoNotOptimize(y.data());
    kernel_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.PauseTiming();
    const auto r0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(ringlane::tools::ReadKernel(plain, bytes / 4));
    read_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    state.ResumeTiming();
  }
  std::free(w);
  std::free(plain);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["read_GB/s"] = static_cast<double>(bytes) * state.iterations() / read_s / 1e9;
  state.counters["of_read"] = read_s / kernel_s;
}
BENCHMARK(BM_MatMulDram)->Args({1, 0})->Args({5, 0})->Args({1, 1})->Unit(benchmark::kMillisecond);

// One query row of one head against `context` positions (args: head_dim,
// context), on the machine's best instruction set: context positions per
// second. head_dim 8 is the bundled model's (scores and softmax dominate),
// 64 the 1.1B model's (the dot products and values do).
void BM_Attend(benchmark::State& state) {
  const int hd = static_cast<int>(state.range(0));
  const int64_t n = state.range(1);
  std::mt19937 rng(2);
  std::normal_distribution<float> g(0.0f, 1.0f);
  // K transposed at the worker's stride.
  const int64_t ldkt = rw::cpu::SpreadStride(n);
  std::vector<float> q(hd), kt(hd * ldkt), v(n * hd), scores(n), out(hd);
  for (float& x : q) x = g(rng);
  for (float& x : kt) x = g(rng);
  for (float& x : v) x = g(rng);
  const int64_t pos = n - 1;
  const rw::cpu::Isa isa = rw::cpu::DetectIsa();
  for (auto _ : state) {
    rw::cpu::AttendArgs a{q.data(), hd, 1,  &pos,          kt.data(),  ldkt,
                          v.data(), hd, hd, scores.data(), out.data(), hd};
    rw::cpu::AttendHead(a, isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Attend)->ArgsProduct({{8, 64}, {512, 4000, 4096}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
