// ringlane-engine-bench: the CPU engine against this machine's own limits,
// measured side by side in one run:
//   - memory read bandwidth (a read-only AVX2 kernel over a buffer far larger
//     than the caches) and the AVX2 FMA peak, at 1 and N threads;
//   - single-stream decode tokens/s at 1 and N threads, as a fraction of the
//     bandwidth roofline (bandwidth / bytes of weights read per token: linear
//     layers, LM head and scales, not the embedding table), and the same
//     fraction from decode chunks paired with read passes right after them;
//   - batched decode of several sequences against single-stream;
//   - prefill of one long prompt as a fraction of the FMA peak.
//
//   ringlane-engine-bench --model=build/models/synth-1b1-fp8
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "tools/read_roofline.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/model/model.h"
#include "worker/model/resident.h"

ABSL_FLAG(std::string, model, "", "model to benchmark (HF directory or llama2.c .bin)");
ABSL_FLAG(int, threads, 2, "largest thread count to measure (1 is always measured too)");
ABSL_FLAG(int, decode_steps, 24, "decode steps timed per measurement");
ABSL_FLAG(int, batch, 5, "sequences in the batched decode measurement");
ABSL_FLAG(int, prefill_tokens, 512, "prompt length for the prefill measurement");
ABSL_FLAG(int, bandwidth_mb, 1024, "buffer size for the bandwidth kernel, MiB");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON to this file");
ABSL_FLAG(int, spin_us, 50, "how long idle engine threads spin before blocking");
ABSL_FLAG(bool, huge_page_weights, true,
          "copy the matrices onto transparent huge pages first, as the worker does");
ABSL_FLAG(bool, interleave_fp8, true,
          "with --huge_page_weights: FP8 rows in interleaved groups, as the worker stores them");
ABSL_FLAG(bool, tile_fp8_rows, true,
          "with --interleave_fp8, store FP8 rows in tiles of 4 (Matrix::row_tile) so "
          "single-row decode reads one stream per tile; false keeps rows apart, for A/B");
ABSL_FLAG(std::string, isa, "best", "kernels: best (AVX-512 where present), avx2, or scalar");

namespace {

namespace rw = ringlane::worker;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "ringlane-engine-bench: error: %s\n", msg.c_str());
  std::exit(2);
}

void Progress(const std::string& what) {
  std::fprintf(stderr, "[bench] %s\n", what.c_str());
  std::fflush(stderr);
}

// Runs fn(thread) on `threads` threads at once and returns the wall time.
template <typename Fn>
double RunThreads(int threads, Fn fn) {
  std::vector<std::thread> ts;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      fn(t);
    });
  }
  while (ready.load() != threads) {
  }
  auto a = Clock::now();
  go.store(true);
  for (auto& t : ts) t.join();
  return Seconds(a, Clock::now());
}

#if defined(__x86_64__)
// 12 independent FMA chains: enough to cover latency x throughput on current
// x86 cores. Returns FMAs (8 lanes each) performed.
__attribute__((target("avx2,fma"))) float FmaKernel(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, c);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float o[8];
  _mm256_store_ps(o, s);
  return o[0];
}

// The same with 512-bit registers (16 lanes).
__attribute__((target("avx512f"))) float FmaKernel512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, c);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float o[16];
  _mm512_store_ps(o, s);
  return o[0] + o[15];
}
#else
float FmaKernel(int64_t iters) { return 0.0f; }
float FmaKernel512(int64_t iters) { return 0.0f; }
#endif

// The roofline's buffer, on huge pages as the worker's weights are.
class ReadBuffer {
 public:
  explicit ReadBuffer(size_t bytes) : n_(bytes / sizeof(float)) {
    buf_ = static_cast<float*>(ringlane::tools::AllocHuge(n_ * sizeof(float)));
    if (buf_ == nullptr) Die("cannot allocate the bandwidth buffer");
    for (size_t i = 0; i < n_; ++i) buf_[i] = 1.0f;
  }
  ~ReadBuffer() { std::free(buf_); }
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;

  // One pass over the buffer by `threads` threads: GB/s (1e9 bytes).
  double Pass(int threads) {
    std::atomic<float> sink{0};
    const double s = RunThreads(threads, [&](int t) {
      size_t per = (n_ / threads) & ~size_t{31};
      sink.store(sink.load() + ringlane::tools::ReadKernel(buf_ + t * per, per));
    });
    return static_cast<double>(n_ / threads * threads) * 4 / s / 1e9;
  }
  // Best of several passes.
  double Best(int threads) {
    double best = 0;
    for (int pass = 0; pass < 5; ++pass) best = std::max(best, Pass(threads));
    return best;
  }

 private:
  size_t n_;
  float* buf_;
};

// FMA peak in GFLOP/s (2 flops per lane) with 8-lane (AVX2) or 16-lane
// (AVX-512) registers.
double MeasureFmaPeak(int threads, int lanes) {
  const int64_t iters = 20'000'000;
  double best = 0;
  std::atomic<float> sink{0};
  for (int pass = 0; pass < 3; ++pass) {
    double s = RunThreads(threads, [&](int) {
      sink.store(sink.load() + (lanes == 16 ? FmaKernel512(iters) : FmaKernel(iters)));
    });
    best = std::max(best, threads * iters * 12.0 * lanes * 2 / s / 1e9);
  }
  return best;
}

int64_t MatrixBytes(const rw::Matrix& m) {
  int64_t b = m.rows * m.cols * static_cast<int64_t>(rw::DTypeSize(m.dtype));
  if (m.scale != nullptr) b += ((m.rows + 127) / 128) * m.scale_cols * 4;
  return b;
}

int64_t DecodeBytesPerToken(const rw::ModelWeights& w) {
  int64_t b = MatrixBytes(w.lm_head);
  for (const auto& l : w.layers) {
    for (const rw::Matrix* m : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo, &l.mlp.w_gate,
                                &l.mlp.w_up, &l.mlp.w_down})
      b += MatrixBytes(*m);
  }
  return b;
}

int64_t LinearParams(const rw::ModelWeights& w) {
  int64_t p = 0;
  for (const auto& l : w.layers) {
    for (const rw::Matrix* m : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo, &l.mlp.w_gate,
                                &l.mlp.w_up, &l.mlp.w_down})
      p += m->rows * m->cols;
  }
  return p;
}

struct Lane {
  std::vector<int32_t> blocks;
  int64_t pos = 0;
  int32_t last = 0;
};

// Prefills `prompt` tokens into each lane, one lane per round, untimed.
void Prefill(rw::Backend* b, std::vector<Lane>& lanes, int prompt, int vocab) {
  for (size_t i = 0; i < lanes.size(); ++i) {
    rw::RoundInput in;
    rw::SeqStep s;
    for (int t = 0; t < prompt; ++t)
      s.tokens.push_back(static_cast<int32_t>((t * 131 + i * 17 + 7) % vocab));
    s.start_position = 0;
    s.block_ids = lanes[i].blocks;
    s.logit_offsets = {prompt - 1};
    in.seqs.push_back(s);
    auto out = b->Step(in);
    if (!out.ok()) Die(std::string(out.status().message()));
    lanes[i].pos = prompt;
    lanes[i].last = static_cast<int32_t>(
        std::max_element(out->logits[0].begin(), out->logits[0].end()) - out->logits[0].begin());
  }
}

// Tokens per second (summed over lanes) over `steps` decode rounds.
double DecodeRate(rw::Backend* b, std::vector<Lane>& lanes, int steps) {
  auto a = Clock::now();
  for (int st = 0; st < steps; ++st) {
    rw::RoundInput in;
    for (Lane& l : lanes) {
      rw::SeqStep s;
      s.start_position = l.pos;
      s.tokens = {l.last};
      s.block_ids = l.blocks;
      s.logit_offsets = {0};
      in.seqs.push_back(std::move(s));
    }
    auto out = b->Step(in);
    if (!out.ok()) Die(std::string(out.status().message()));
    for (size_t i = 0; i < lanes.size(); ++i) {
      lanes[i].pos++;
      const auto& lg = out->logits[i];
      lanes[i].last = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    }
  }
  return lanes.size() * steps / Seconds(a, Clock::now());
}

std::unique_ptr<rw::Backend> MakeBackend(std::shared_ptr<const rw::ModelWeights> m, int threads,
                                         int blocks) {
  rw::CpuBackendOptions o;
  o.threads = threads;
  o.spin_us = absl::GetFlag(FLAGS_spin_us);
  o.allow_avx512 = absl::GetFlag(FLAGS_isa) == "best";
  o.force_scalar = absl::GetFlag(FLAGS_isa) == "scalar";
  absl::StatusOr<std::unique_ptr<rw::Backend>> made = rw::CreateCpuBackend(std::move(m), o);
  if (!made.ok()) Die(std::string(made.status().message()));
  std::unique_ptr<rw::Backend> b = std::move(*made);
  if (absl::Status st = b->AllocateKvPool({blocks, 16, rw::DType::kF32}); !st.ok()) {
    Die(std::string(st.message()));
  }
  return b;
}

std::vector<Lane> MakeLanes(int n, int tokens_each) {
  std::vector<Lane> lanes(n);
  const int per = (tokens_each + 15) / 16;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < per; ++j) lanes[i].blocks.push_back(i * per + j);
  return lanes;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Benchmarks the CPU engine against memory bandwidth and FMA peak.");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) Die("--model is required (e.g. make bench writes build/models/synth-1b1-fp8)");
  const int max_threads = absl::GetFlag(FLAGS_threads);
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int prefill = absl::GetFlag(FLAGS_prefill_tokens);
  if (max_threads < 1 || steps < 1 || batch < 1 || prefill < 1) {
    Die("--threads, --decode_steps, --batch and --prefill_tokens must be positive");
  }
  const std::string isa_flag = absl::GetFlag(FLAGS_isa);
  if (isa_flag != "best" && isa_flag != "avx2" && isa_flag != "scalar") {
    Die("--isa must be best, avx2 or scalar");
  }
  const ringlane::worker::cpu::Isa isa = isa_flag == "scalar"
                                             ? ringlane::worker::cpu::Isa::kScalar
                                             : ringlane::worker::cpu::DetectIsa(isa_flag == "best");
  // The peak the kernels in use can reach: 16-lane FMAs for AVX-512, else 8.
  const int peak_lanes = isa == ringlane::worker::cpu::Isa::kAvx512 ? 16 : 8;
  std::vector<int> thread_counts = {1};
  if (max_threads > 1) thread_counts.push_back(max_threads);

  Progress("loading " + path);
  auto loaded = rw::LoadModel(path);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  std::shared_ptr<const rw::ModelWeights> model(std::move(*loaded));
  if (absl::GetFlag(FLAGS_huge_page_weights)) {
    Progress("copying the weights onto huge pages");
    auto r = rw::MakeResident(model, nullptr, absl::GetFlag(FLAGS_interleave_fp8),
                              absl::GetFlag(FLAGS_tile_fp8_rows));
    if (!r.ok()) Die(std::string(r.status().message()));
    model = *r;
  }
  const rw::ModelConfig& cfg = model->config;
  const int64_t bytes_per_token = DecodeBytesPerToken(*model);
  const int64_t linear_params = LinearParams(*model);
  Progress(
      absl::StrFormat("model: %d layers, hidden %d, intermediate %d, heads %d/%d, vocab %d, "
                      "%.3f GB read per decode token",
                      cfg.layers, cfg.hidden, cfg.intermediate, cfg.heads, cfg.kv_heads, cfg.vocab,
                      bytes_per_token / 1e9));

  struct Row {
    int threads;
    double bw, peak, decode, roofline;
    // The median over kPairs of (a decode chunk's bytes per second / a read
    // pass's, the read right after the chunk): drift on a shared machine
    // moves both sides of each pair alike. The best-of-5 read taken once
    // before decode (bw) swung 39-58 GB/s at two threads between runs on a
    // shared VM, and "of roofline" with it (59-111%).
    double paired;
  };
  constexpr int kPairs = 7, kPairSteps = 4;
  std::vector<Row> rows;
  ReadBuffer reads(static_cast<size_t>(absl::GetFlag(FLAGS_bandwidth_mb)) << 20);
  for (int t : thread_counts) {
    Row r{t, 0, 0, 0, 0, 0};
    Progress(absl::StrFormat("%d thread(s): memory read bandwidth", t));
    r.bw = reads.Best(t);
    Progress(absl::StrFormat("%d thread(s): FMA peak", t));
    r.peak = MeasureFmaPeak(t, peak_lanes);
    Progress(absl::StrFormat("%d thread(s): single-stream decode", t));
    auto b = MakeBackend(model, t, 64);
    std::vector<Lane> one = MakeLanes(1, 16 + steps + kPairs * kPairSteps + 8);
    Prefill(b.get(), one, 16, cfg.vocab);
    DecodeRate(b.get(), one, 2);  // warm: faults in the mapping
    r.decode = DecodeRate(b.get(), one, steps);
    r.roofline = r.bw * 1e9 / bytes_per_token;
    Progress(absl::StrFormat("%d thread(s): decode paired with reads", t));
    std::vector<double> ratios;
    for (int i = 0; i < kPairs; ++i) {
      const double tps = DecodeRate(b.get(), one, kPairSteps);
      ratios.push_back(tps * bytes_per_token / 1e9 / reads.Pass(t));
    }
    std::nth_element(ratios.begin(), ratios.begin() + kPairs / 2, ratios.end());
    r.paired = ratios[kPairs / 2];
    rows.push_back(r);
  }
  const Row& top = rows.back();

  Progress(absl::StrFormat("%d threads: batched decode of %d sequences", top.threads, batch));
  double batched = 0;
  {
    auto b = MakeBackend(model, top.threads, batch * ((16 + steps + 8 + 15) / 16) + 4);
    std::vector<Lane> lanes = MakeLanes(batch, 16 + steps + 8);
    Prefill(b.get(), lanes, 16, cfg.vocab);
    DecodeRate(b.get(), lanes, 1);
    batched = DecodeRate(b.get(), lanes, steps);
  }

  Progress(absl::StrFormat("%d threads: prefill of %d tokens", top.threads, prefill));
  double prefill_s = 0;
  {
    auto b = MakeBackend(model, top.threads, (prefill + 15) / 16 + 1);
    std::vector<Lane> lanes = MakeLanes(1, prefill);
    auto a = Clock::now();
    Prefill(b.get(), lanes, prefill, cfg.vocab);
    prefill_s = Seconds(a, Clock::now());
  }
  // Matmul flops for every prompt row (the LM head runs for the last row
  // only), plus attention: QK and PV over the causal triangle.
  const double attn_flops =
      4.0 * cfg.layers * cfg.heads * cfg.head_dim * (prefill * (prefill + 1.0) / 2);
  const double prefill_flops =
      2.0 * linear_params * prefill + 2.0 * cfg.vocab * cfg.hidden + attn_flops;
  const double prefill_gflops = prefill_flops / prefill_s / 1e9;

  std::printf("\n## ringlane-engine-bench: %s\n\n", path.c_str());
  std::printf(
      "Bytes read per decode token: %.3f GB (linear layers, LM head, scales). Linear params: %.3f "
      "B.\n\n",
      bytes_per_token / 1e9, linear_params / 1e9);
  std::printf("Kernels: %s. FMA peak measured with %d-lane registers.\n\n",
              ringlane::worker::cpu::IsaName(isa), peak_lanes);
  std::printf(
      "| threads | read GB/s | FMA peak GFLOP/s | decode tok/s | roofline tok/s | of roofline | "
      "of read, paired |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %.1f | %.1f | %.2f | %.2f | %.0f%% | %.0f%% |\n", r.threads, r.bw, r.peak,
                r.decode, r.roofline, 100 * r.decode / r.roofline, 100 * r.paired);
  }
  std::printf(
      "\nof read, paired: the median over %d pairs of a %d-step decode chunk's bytes per second "
      "against one read pass right after it.\n",
      kPairs, kPairSteps);
  std::printf("\n| %d threads | figure | ratio |\n|---|---:|---:|\n", top.threads);
  std::printf("| batched decode, %d sequences | %.2f tok/s | %.2fx single-stream |\n", batch,
              batched, batched / top.decode);
  std::printf("| prefill, %d tokens | %.2f s, %.1f GFLOP/s (%.0f tok/s) | %.0f%% of FMA peak |\n",
              prefill, prefill_s, prefill_gflops, prefill / prefill_s,
              100 * prefill_gflops / top.peak);

  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) Die("cannot write " + json);
    std::fprintf(f, "{\"model\": \"%s\", \"bytes_per_token\": %lld, \"rows\": [", path.c_str(),
                 static_cast<long long>(bytes_per_token));
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "%s{\"threads\": %d, \"read_gbps\": %.3f, \"fma_gflops\": %.3f, \"decode_tps\": "
                   "%.4f, \"roofline_tps\": %.4f, \"paired_of_read\": %.4f}",
                   i ? ", " : "", r.threads, r.bw, r.peak, r.decode, r.roofline, r.paired);
    }
    std::fprintf(f,
                 "], \"batched_decode_tps\": %.4f, \"batch\": %d, \"prefill_seconds\": %.4f, "
                 "\"prefill_tokens\": %d, \"prefill_gflops\": %.3f}\n",
                 batched, batch, prefill_s, prefill, prefill_gflops);
    std::fclose(f);
  }
  return 0;
}
