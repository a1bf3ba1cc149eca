// ringlane-generate: a prompt in, streamed text out, over the worker engine in
// this process. What `make serve` runs until the daemons take over.
//
//   ringlane-generate --model=deploy/models/stories260K/stories260K.bin
//                     --tokenizer=deploy/models/stories260K/tok512.bin
//                     --prompt="Once upon a time"
//
// Without --prompt it reads one prompt per line from standard input.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "router/tokenizer/llama2c_tokenizer.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/sampler.h"

ABSL_FLAG(std::string, model, "deploy/models/stories260K/stories260K.bin",
          "llama2.c checkpoint (.bin) or Hugging Face model directory");
ABSL_FLAG(std::string, tokenizer, "",
          "llama2.c tokenizer file; default: tokenizer.bin or tok*.bin beside the model");
ABSL_FLAG(std::string, prompt, "",
          "prompt to complete; empty: read prompts from stdin, one a line");
ABSL_FLAG(int, max_tokens, 256, "most tokens to generate per prompt");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature; 0 = greedy");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling threshold (1 = off)");
ABSL_FLAG(int, top_k, 0, "keep the k most likely tokens (0 = off)");
ABSL_FLAG(double, min_p, 0.0, "drop tokens below min_p times the top probability (0 = off)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed; -1 derives it from the prompt and parameters");
ABSL_FLAG(bool, random_seed, false, "use a random seed when --seed is not given");
ABSL_FLAG(int, threads, 2, "engine threads");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, bf16 or fp8");
ABSL_FLAG(int, block_size, 16, "KV block size in tokens");
ABSL_FLAG(bool, stats, true, "print tokens/s to stderr after each generation");

namespace {

using ringlane::router::Llama2cTokenizer;
namespace rw = ringlane::worker;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "ringlane-generate: error: %s\n", msg.c_str());
  std::exit(2);
}

std::string FindTokenizer(const std::string& model) {
  namespace fs = std::filesystem;
  fs::path dir = fs::is_directory(model) ? fs::path(model) : fs::path(model).parent_path();
  if (dir.empty()) dir = ".";
  if (fs::exists(dir / "tokenizer.bin")) return (dir / "tokenizer.bin").string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("tok", 0) == 0 && e.path().extension() == ".bin") return e.path().string();
  }
  return "";
}

// The default seed: a hash of the prompt and the sampling parameters, so a
// resend of the same request reproduces its output.
uint64_t DerivedSeed(const std::vector<int32_t>& ids, const rw::SamplingParams& p) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (int32_t t : ids) mix(static_cast<uint32_t>(t));
  mix(static_cast<uint64_t>(p.temperature * 1e6));
  mix(static_cast<uint64_t>(p.top_p * 1e6));
  mix(static_cast<uint64_t>(p.top_k));
  mix(static_cast<uint64_t>(p.min_p * 1e6));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Generates text from a prompt with the ringlane engine.");
  absl::ParseCommandLine(argc, argv);

  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens <= 0) Die("--max_tokens must be positive");
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0 || threads > 256) Die("--threads must be in [1, 256]");
  const int block_size = absl::GetFlag(FLAGS_block_size);
  if (block_size <= 0 || block_size > 4096) Die("--block_size must be in [1, 4096]");
  auto kv_dtype = rw::ParseDTypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) Die("--kv_dtype: " + std::string(kv_dtype.status().message()));

  rw::SamplingParams params;
  params.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  params.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  params.top_k = absl::GetFlag(FLAGS_top_k);
  params.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  if (absl::Status st = rw::ValidateSamplingParams(params); !st.ok())
    Die(std::string(st.message()));

  const std::string model_path = absl::GetFlag(FLAGS_model);
  std::string tok_path = absl::GetFlag(FLAGS_tokenizer);
  if (tok_path.empty()) tok_path = FindTokenizer(model_path);
  if (tok_path.empty()) Die("no tokenizer found beside " + model_path + "; pass --tokenizer");

  auto t0 = std::chrono::steady_clock::now();
  auto model = rw::LoadModel(model_path);
  if (!model.ok()) Die(std::string(model.status().message()));
  auto tok = Llama2cTokenizer::Load(tok_path);
  if (!tok.ok()) Die(std::string(tok.status().message()));
  const rw::ModelConfig cfg = (*model)->config;
  if ((*tok)->vocab_size() != cfg.vocab) {
    Die("tokenizer " + tok_path + " has " + std::to_string((*tok)->vocab_size()) +
        " tokens, the model " + std::to_string(cfg.vocab));
  }
  rw::CpuBackendOptions opt;
  opt.threads = threads;
  auto backend =
      rw::CreateCpuBackend(std::shared_ptr<const rw::ModelWeights>(std::move(*model)), opt);
  const int context = cfg.max_position > 0 ? cfg.max_position : 2048;
  const int num_blocks = (context + block_size - 1) / block_size;
  if (absl::Status st = backend->AllocateKvPool({num_blocks, block_size, *kv_dtype}); !st.ok()) {
    Die(std::string(st.message()));
  }
  double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "ringlane-generate: %s (%d layers, hidden %d, vocab %d, context %d) on %s, "
               "KV %s, loaded in %.0f ms\n",
               model_path.c_str(), cfg.layers, cfg.hidden, cfg.vocab, context,
               backend->name().c_str(), std::string(rw::DTypeName(*kv_dtype)).c_str(), load_ms);

  std::vector<int32_t> blocks(num_blocks);
  for (int i = 0; i < num_blocks; ++i) blocks[i] = i;
  std::mt19937_64 rng(std::random_device{}());

  auto generate = [&](const std::string& prompt) {
    std::vector<int32_t> ids = (*tok)->Encode(prompt, /*add_bos=*/true);
    if (static_cast<int>(ids.size()) >= context) {
      std::fprintf(stderr, "error: prompt has %zu tokens, the context holds %d\n", ids.size(),
                   context);
      return;
    }
    rw::SamplingParams p = params;
    const int64_t seed_flag = absl::GetFlag(FLAGS_seed);
    p.seed = seed_flag >= 0 ? static_cast<uint64_t>(seed_flag)
                            : (absl::GetFlag(FLAGS_random_seed) ? rng() : DerivedSeed(ids, p));
    rw::Sampler sampler(p, 0);
    // Echo the prompt as the model sees it, then stream the continuation.
    auto prompt_text = (*tok)->Decode(ids);
    std::fputs(prompt_text.ok() ? prompt_text->c_str() : prompt.c_str(), stdout);
    std::fflush(stdout);
    auto start = std::chrono::steady_clock::now();
    int64_t pos = 0;
    std::vector<int32_t> feed = ids;
    int32_t prev = ids.back();
    int generated = 0;
    double first_token_ms = 0;
    while (generated < max_tokens && pos + static_cast<int64_t>(feed.size()) <= context) {
      rw::RoundInput in;
      rw::SeqStep step;
      step.start_position = pos;
      step.tokens = feed;
      const int64_t end = pos + static_cast<int64_t>(feed.size());
      step.block_ids.assign(blocks.begin(), blocks.begin() + (end + block_size - 1) / block_size);
      step.logit_offsets = {static_cast<int32_t>(feed.size() - 1)};
      in.seqs.push_back(std::move(step));
      auto out = backend->Step(in);
      if (!out.ok()) {
        std::fprintf(stderr, "\nerror: %s\n", std::string(out.status().message()).c_str());
        return;
      }
      pos = end;
      rw::SampleResult r = sampler.Sample(out->logits[0], pos);
      if (generated == 0) {
        first_token_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
      }
      ++generated;
      if ((*tok)->IsStop(r.token) || r.token == cfg.eos_id) break;
      sampler.Observe(r.token);
      std::string_view piece = (*tok)->DecodePiece(prev, r.token);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      prev = r.token;
      feed = {r.token};
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_stats)) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr,
                   "[%zu prompt tokens, %d generated, first token %.1f ms, %.1f tokens/s]\n",
                   ids.size(), generated, first_token_ms, generated / s);
    }
  };

  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    generate(absl::GetFlag(FLAGS_prompt));
    return 0;
  }
  const bool tty = isatty(STDIN_FILENO);
  std::string line;
  for (;;) {
    if (tty) {
      std::fputs("prompt> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    generate(line);
  }
  return 0;
}
