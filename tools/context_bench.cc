// ringlane-context-bench: decode speed at long context, and what a token of
// context costs in the KV pool (and a lane in state slots, for a model with
// linear-attention layers such as glm5_next). For a DSA model (deepseek_v32,
// glm_moe_dsa, glm5_next)
// each context is measured twice, beside each other: attending densely to
// every position, and past --dense_window through the indexer's top-k.
//
//   ringlane-synth-model --preset=glm5-small --out=build/models/glm5-small
//   ringlane-context-bench --model=build/models/glm5-small --contexts=4096,65536
//
// The context is filled without a prefill of that length (which would take
// minutes at 64k on two cores): one block is prefilled from real tokens, then
// exported and imported into every other block, so the pool holds valid rows
// of the model's own dtype; decode then runs at the context's end. A step's
// cost depends on how many positions it reads, not on what they hold.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/flags_util.h"
#include "worker/backend/backend.h"
#include "worker/dtype.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, model, "", "model directory (required)");
ABSL_FLAG(std::string, contexts, "4096,65536", "comma-separated context lengths in tokens");
ABSL_FLAG(int, threads, 2, "engine threads");
ABSL_FLAG(int, steps, 5, "decode steps timed per measurement (the median is reported)");
ABSL_FLAG(std::string, kv_dtype, "fp8", "KV cache dtype: f32, bf16 or fp8");
ABSL_FLAG(int, dense_window, 2051, "DSA models: the dense window of the DSA measurement");

namespace rw = ringlane::worker;
using Clock = std::chrono::steady_clock;
using ringlane::services::ExitWithUsageError;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ringlane-context-bench: %s\n", what.c_str());
  std::exit(1);
}

struct Result {
  double tok_s = 0;
  int64_t block_bytes = 0;
  int64_t state_bytes = 0;  // one lane's recurrent state (linear-attention layers)
};

// Median decode tokens/s of one sequence at `context` tokens, dense window
// `window` (a DSA model's; ignored otherwise).
Result Measure(const std::string& path, int64_t context, int window, rw::DType kv) {
  auto loaded = rw::LoadModel(path);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  (*loaded)->config.indexer.dense_window = window;
  std::shared_ptr<const rw::ModelWeights> model(std::move(*loaded));
  rw::CpuBackendOptions opt;
  opt.threads = absl::GetFlag(FLAGS_threads);
  auto backend = rw::CreateCpuBackend(model, opt);
  if (!backend.ok()) Die(std::string(backend.status().message()));
  const int bs = 16, steps = absl::GetFlag(FLAGS_steps);
  const int blocks = static_cast<int>((context + steps + bs) / bs) + 1;
  // One state slot: a model with linear-attention layers keeps the lane's
  // state there, whatever the context (its cost does not grow with it).
  if (absl::Status s = (*backend)->AllocateKvPool({blocks, bs, kv, 1}); !s.ok())
    Die(std::string(s.message()));
  int64_t state_bytes = 0;
  for (const rw::LayerCacheSpec& c : (*backend)->layer_caches()) {
    if (c.kind == rw::CacheKind::kRecurrentState) state_bytes += c.state_floats * 4;
  }
  const int vocab = model->config.vocab;
  rw::SeqStep seq;
  seq.state_slot = 0;
  for (int b = 0; b < blocks; ++b) seq.block_ids.push_back(b);
  for (int i = 0; i < bs; ++i) seq.tokens.push_back((i * 97 + 5) % vocab);
  seq.logit_offsets = {bs - 1};
  rw::RoundInput in;
  in.seqs = {seq};
  if (auto r = (*backend)->Step(in); !r.ok()) Die(std::string(r.status().message()));
  std::vector<uint8_t> block;
  if (absl::Status s = (*backend)->ExportKvBlock(0, &block); !s.ok()) Die(std::string(s.message()));
  for (int b = 1; b < blocks; ++b) {
    if (absl::Status s = (*backend)->ImportKvBlock(b, block); !s.ok())
      Die(std::string(s.message()));
  }
  std::vector<double> seconds;
  for (int i = 0; i < steps + 1; ++i) {  // the first step warms up
    seq.start_position = context + i;
    seq.tokens = {static_cast<int32_t>((i * 31 + 7) % vocab)};
    seq.logit_offsets = {0};
    in.seqs = {seq};
    const auto t0 = Clock::now();
    if (auto r = (*backend)->Step(in); !r.ok()) Die(std::string(r.status().message()));
    if (i > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return {1.0 / seconds[seconds.size() / 2], (*backend)->kv_block_bytes(), state_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Decode tokens/s at long context, dense against DSA, and KV bytes per token.\n"
      "  ringlane-context-bench --model=DIR --contexts=4096,65536");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) ExitWithUsageError("--model is required");
  auto kv = rw::ParseDTypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok() || *kv == rw::DType::kF16) ExitWithUsageError("--kv_dtype must be f32, bf16 or fp8");
  if (absl::GetFlag(FLAGS_steps) < 1) ExitWithUsageError("--steps must be positive");
  std::vector<int64_t> contexts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(c, &v) || v < 16) ExitWithUsageError("--contexts: lengths of 16 or more");
    contexts.push_back(v);
  }
  auto probe = rw::LoadModel(path);
  if (!probe.ok()) Die(std::string(probe.status().message()));
  const rw::ModelConfig cfg = (*probe)->config;
  probe->reset();
  const bool dsa = cfg.indexer.topk > 0;
  const int window = absl::GetFlag(FLAGS_dense_window);
  std::printf("model %s (%s, %d layers), KV %s, %d threads%s\n", path.c_str(),
              cfg.model_type.c_str(), cfg.layers, std::string(rw::DTypeName(*kv)).c_str(),
              absl::GetFlag(FLAGS_threads),
              dsa ? absl::StrCat(", DSA top-", cfg.indexer.topk, " past ", window).c_str() : "");
  std::printf("%10s %14s %12s %14s %12s %12s %10s\n", "context", "KV B/token", "KV MiB",
              "state MiB/lane", "dense tok/s", "DSA tok/s", "DSA/dense");
  for (int64_t context : contexts) {
    std::fprintf(stderr, "context %lld: dense ...\n", static_cast<long long>(context));
    const Result dense = Measure(path, context, static_cast<int>(context) + 1024, *kv);
    Result sparse;
    if (dsa) {
      std::fprintf(stderr, "context %lld: DSA ...\n", static_cast<long long>(context));
      sparse = Measure(path, context, window, *kv);
    }
    const double per_token = static_cast<double>(dense.block_bytes) / 16;
    std::printf("%10lld %14.0f %12.1f %14.2f %12.2f %12s %10s\n", static_cast<long long>(context),
                per_token, per_token * static_cast<double>(context) / (1 << 20),
                static_cast<double>(dense.state_bytes) / (1 << 20), dense.tok_s,
                dsa ? absl::StrCat(sparse.tok_s).c_str() : "-",
                dsa ? absl::StrCat(sparse.tok_s / dense.tok_s).c_str() : "-");
    std::fflush(stdout);
  }
  return 0;
}
