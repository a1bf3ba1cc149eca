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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "router/client/round_builder.h"
#include "router/client/worker_group.h"
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
ABSL_FLAG(std::string, workers, "",
          "comma-separated host:port of a worker group's ranks, rank 0 first; empty = run the "
          "engine in this process");

namespace {

using ringlane::router::Llama2cTokenizer;
namespace rw = ringlane::worker;
namespace rr = ringlane::router;

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

// One lane at a time through some engine: Start feeds the prompt and returns
// the first sampled token; Next feeds the last token and returns the next.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string Describe() const = 0;
  virtual int vocab() const = 0;
  virtual int context() const = 0;
  virtual int eos_id() const = 0;
  virtual absl::StatusOr<int32_t> Start(const std::vector<int32_t>& prompt,
                                        const rw::SamplingParams& p) = 0;
  virtual absl::StatusOr<int32_t> Next() = 0;
  virtual void End() = 0;
};

// The engine in this process; samples here.
class LocalEngine final : public Engine {
 public:
  explicit LocalEngine(std::unique_ptr<rw::Backend> backend) : backend_(std::move(backend)) {}

  absl::Status Init(int block_size, rw::DType kv) {
    const rw::ModelConfig& cfg = backend_->config();
    context_ = cfg.max_position > 0 ? cfg.max_position : 2048;
    block_size_ = block_size;
    const int num_blocks = (context_ + block_size - 1) / block_size;
    kv_ = kv;
    for (int i = 0; i < num_blocks; ++i) blocks_.push_back(i);
    return backend_->AllocateKvPool({num_blocks, block_size, kv});
  }
  std::string Describe() const override {
    const rw::ModelConfig& c = backend_->config();
    return absl::StrCat(c.layers, " layers, hidden ", c.hidden, ", vocab ", c.vocab, " on ",
                        backend_->name(), " in this process, KV ", std::string(rw::DTypeName(kv_)));
  }
  int vocab() const override { return backend_->config().vocab; }
  int context() const override { return context_; }
  int eos_id() const override { return backend_->config().eos_id; }

  absl::StatusOr<int32_t> Start(const std::vector<int32_t>& prompt,
                                const rw::SamplingParams& p) override {
    sampler_ = std::make_unique<rw::Sampler>(p, 0);
    pos_ = 0;
    return Feed(prompt);
  }
  absl::StatusOr<int32_t> Next() override { return Feed({last_}); }
  void End() override { sampler_.reset(); }

 private:
  absl::StatusOr<int32_t> Feed(const std::vector<int32_t>& feed) {
    rw::RoundInput in;
    rw::SeqStep step;
    step.start_position = pos_;
    step.tokens = feed;
    const int64_t end = pos_ + static_cast<int64_t>(feed.size());
    step.block_ids.assign(blocks_.begin(), blocks_.begin() + (end + block_size_ - 1) / block_size_);
    step.logit_offsets = {static_cast<int32_t>(feed.size() - 1)};
    in.seqs.push_back(std::move(step));
    auto out = backend_->Step(in);
    if (!out.ok()) return out.status();
    pos_ = end;
    last_ = sampler_->Sample(out->logits[0], pos_).token;
    sampler_->Observe(last_);
    return last_;
  }

  std::unique_ptr<rw::Backend> backend_;
  std::unique_ptr<rw::Sampler> sampler_;
  std::vector<int32_t> blocks_;
  int context_ = 0, block_size_ = 16;
  rw::DType kv_ = rw::DType::kF32;
  int64_t pos_ = 0;
  int32_t last_ = 0;
};

// A worker group over gRPC: the ranks sample inside the group, so a decode
// plan only says "the last sampled token".
class GroupEngine final : public Engine {
 public:
  explicit GroupEngine(std::unique_ptr<ringlane::router::WorkerGroupClient> g)
      : group_(std::move(g)) {
    const auto& i = group_->info();
    const int per_lane = (context() + i.block_size_tokens() - 1) / i.block_size_tokens();
    for (int b = 0; b < std::min(per_lane, i.kv_pool_blocks()); ++b) blocks_.push_back(b);
  }
  std::string Describe() const override {
    const auto& i = group_->info();
    return absl::StrCat(i.model_id(), " (", i.num_layers(), " layers, vocab ", i.vocab_size(),
                        ") on worker group '", i.group(), "', TP", i.tp_world_size(), ", epoch ",
                        i.group_epoch());
  }
  int vocab() const override { return group_->info().vocab_size(); }
  int context() const override {
    const auto& i = group_->info();
    const int ctx = i.max_context_tokens() > 0 ? i.max_context_tokens() : 2048;
    return std::min<int>(ctx, i.kv_pool_blocks() * i.block_size_tokens());
  }
  int eos_id() const override { return group_->info().eos_token_id(); }

  absl::StatusOr<int32_t> Start(const std::vector<int32_t>& prompt,
                                const rw::SamplingParams& p) override {
    ++lane_;
    pos_ = 0;
    ringlane::v1::RoundPlan plan;
    plan.set_round_id(++round_);
    ringlane::v1::LaneStep* r = rr::AddPrefillRow(&plan, lane_, 0, prompt, true, blocks_, bs());
    pos_ = static_cast<int64_t>(prompt.size());
    ringlane::v1::SamplingParams s;
    s.set_temperature(p.temperature);
    s.set_top_k(p.top_k);
    s.set_top_p(p.top_p);
    s.set_min_p(p.min_p);
    s.set_seed(p.seed);
    rr::SetLaneParams(r, s, 0);
    return Run(plan);
  }
  absl::StatusOr<int32_t> Next() override {
    ringlane::v1::RoundPlan plan;
    plan.set_round_id(++round_);
    rr::AddDecodeRow(&plan, lane_, pos_, {}, blocks_, bs());
    pos_ += 1;
    return Run(plan);
  }
  void End() override {
    ringlane::v1::RoundPlan plan;
    plan.set_round_id(++round_);
    rr::AddReleaseRow(&plan, lane_);
    group_->Run(plan).status().IgnoreError();
  }

 private:
  int32_t bs() const { return group_->info().block_size_tokens(); }
  absl::StatusOr<int32_t> Run(const ringlane::v1::RoundPlan& plan) {
    auto res = group_->Run(plan);
    if (!res.ok()) return res.status();
    if (res->error().code() != 0) return absl::InternalError(res->error().message());
    return res->outputs(0).tokens(0).token_id();
  }

  std::unique_ptr<ringlane::router::WorkerGroupClient> group_;
  std::vector<int32_t> blocks_;
  uint64_t lane_ = 0, round_ = 0;
  int64_t pos_ = 0;
};

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

  auto tok = Llama2cTokenizer::Load(tok_path);
  if (!tok.ok()) Die(std::string(tok.status().message()));

  // Where the tokens come from: the engine in this process, or a worker
  // group over gRPC (which samples inside the group).
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Engine> engine;
  const std::string workers = absl::GetFlag(FLAGS_workers);
  if (workers.empty()) {
    auto model = rw::LoadModel(model_path);
    if (!model.ok()) Die(std::string(model.status().message()));
    rw::CpuBackendOptions opt;
    opt.threads = threads;
    absl::StatusOr<std::unique_ptr<rw::Backend>> backend =
        rw::CreateCpuBackend(std::shared_ptr<const rw::ModelWeights>(std::move(*model)), opt);
    if (!backend.ok()) Die(std::string(backend.status().message()));
    auto local = std::make_unique<LocalEngine>(std::move(*backend));
    if (absl::Status st = local->Init(block_size, *kv_dtype); !st.ok()) {
      Die(std::string(st.message()));
    }
    engine = std::move(local);
  } else {
    std::vector<std::string> addrs = absl::StrSplit(workers, ',', absl::SkipEmpty());
    auto group = ringlane::router::WorkerGroupClient::Connect(addrs, std::chrono::seconds(60));
    if (!group.ok()) Die(std::string(group.status().message()));
    engine = std::make_unique<GroupEngine>(std::move(*group));
  }
  if ((*tok)->vocab_size() != engine->vocab()) {
    Die("tokenizer " + tok_path + " has " + std::to_string((*tok)->vocab_size()) +
        " tokens, the model " + std::to_string(engine->vocab()));
  }
  const int context = engine->context();
  double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "ringlane-generate: %s, context %d, ready in %.0f ms\n",
               engine->Describe().c_str(), context, load_ms);

  std::mt19937_64 rng(std::random_device{}());
  const int eos_id = engine->eos_id();

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
    // Echo the prompt as the model sees it, then stream the continuation.
    auto prompt_text = (*tok)->Decode(ids);
    std::fputs(prompt_text.ok() ? prompt_text->c_str() : prompt.c_str(), stdout);
    std::fflush(stdout);
    auto start = std::chrono::steady_clock::now();
    int32_t prev = ids.back();
    int generated = 0;
    double first_token_ms = 0;
    int64_t end = static_cast<int64_t>(ids.size());
    absl::StatusOr<int32_t> next = engine->Start(ids, p);
    while (next.ok()) {
      if (generated == 0) {
        first_token_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
      }
      ++generated;
      const int32_t t = *next;
      if ((*tok)->IsStop(t) || t == eos_id) break;
      std::string_view piece = (*tok)->DecodePiece(prev, t);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      prev = t;
      if (generated >= max_tokens || ++end >= context) break;
      next = engine->Next();
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!next.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(next.status().message()).c_str());
    }
    engine->End();
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
