// ringlane-router-bench: the router's scheduling against a running cluster,
// through its gRPC API. Two measurements, each side by side in one run:
//
//   --scenario=ttft  time to first token of a long prompt, cold (first send)
//                    and warm (the identical resend, served from the cached
//                    prefix); the warm one should be a few percent of cold.
//   --scenario=itl   inter-token gaps of --decoders lanes decoding, median and
//                    worst, first alone and then while a --prompt_tokens
//                    prompt arrives and is prefilled in chunks.
//
//   ringlane-router-bench --router=127.0.0.1:50051 --scenario=ttft --prompt_tokens=3000
//
// Prompts are token ids (so any tokenizer works); ids are drawn from
// [3, --vocab) with a fixed seed, different per run so that a cold prompt is
// never already cached.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "ringlane/v1/generate.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051", "the router's gRPC address");
ABSL_FLAG(std::string, scenario, "ttft", "ttft or itl");
ABSL_FLAG(int, prompt_tokens, 3000, "length of the long prompt");
ABSL_FLAG(int, vocab, 512, "prompt token ids are drawn below this");
ABSL_FLAG(int, decoders, 3, "itl: lanes decoding while the prompt arrives");
ABSL_FLAG(int, decode_tokens, 200, "itl: tokens each decoding lane generates");
ABSL_FLAG(int, repeats, 2, "ttft: cold/warm pairs");

namespace v1 = ringlane::v1;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::vector<int32_t> RandomPrompt(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, absl::GetFlag(FLAGS_vocab) - 1);
  std::vector<int32_t> ids = {1};  // BOS
  while (static_cast<int>(ids.size()) < n) ids.push_back(d(rng));
  return ids;
}

struct Timing {
  bool ok = false;
  std::string error;
  double ttft_ms = 0;
  std::vector<double> gaps_ms;  // between consecutive token messages
  int cached = 0;
};

Timing Run(v1::Generate::Stub& stub, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  grpc::ClientContext ctx;
  const auto t0 = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  Timing t;
  Clock::time_point last;
  bool first = true;
  while (reader->Read(&m)) {
    const auto now = Clock::now();
    if (m.token_ids_size() > 0) {
      if (first) {
        t.ttft_ms = Ms(now - t0);
        first = false;
      } else {
        // A message may carry several tokens (held-back text); spread evenly.
        for (int i = 0; i < m.token_ids_size(); ++i) {
          t.gaps_ms.push_back(Ms(now - last) / m.token_ids_size());
        }
      }
      last = now;
    }
    if (m.has_usage()) t.cached = m.usage().cached_tokens();
  }
  grpc::Status st = reader->Finish();
  t.ok = st.ok();
  t.error = st.error_message();
  return t;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

int Ttft(v1::Generate::Stub& stub) {
  const int n = absl::GetFlag(FLAGS_prompt_tokens);
  std::printf("%-8s %12s %12s %14s %12s\n", "pair", "cold ms", "warm ms", "warm / cold",
              "warm cached");
  const uint64_t base = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    std::fprintf(stderr, "[router-bench] ttft pair %d: cold %d-token prompt\n", r + 1, n);
    std::vector<int32_t> prompt = RandomPrompt(n, base + r);
    Timing cold = Run(stub, prompt, 1);
    std::fprintf(stderr, "[router-bench] ttft pair %d: warm resend\n", r + 1);
    Timing warm = Run(stub, prompt, 1);
    if (!cold.ok || !warm.ok) {
      std::fprintf(stderr, "error: %s\n", (cold.ok ? warm : cold).error.c_str());
      return 1;
    }
    std::printf("%-8d %12.1f %12.1f %13.1f%% %12d\n", r + 1, cold.ttft_ms, warm.ttft_ms,
                100 * warm.ttft_ms / cold.ttft_ms, warm.cached);
  }
  return 0;
}

int Itl(v1::Generate::Stub& stub) {
  const int decoders = absl::GetFlag(FLAGS_decoders);
  const int tokens = absl::GetFlag(FLAGS_decode_tokens);
  const uint64_t base = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  std::printf("%-34s %10s %10s %10s\n", "decoding lanes' inter-token gaps", "median ms", "p90 ms",
              "worst ms");
  for (int with_arrival = 0; with_arrival < 2; ++with_arrival) {
    std::fprintf(stderr, "[router-bench] itl: %d decoders%s\n", decoders,
                 with_arrival ? " + a long prompt arriving" : " alone");
    std::vector<Timing> out(decoders);
    std::vector<std::thread> threads;
    for (int d = 0; d < decoders; ++d) {
      threads.emplace_back(
          [&, d] { out[d] = Run(stub, RandomPrompt(16, base + 100 * with_arrival + d), tokens); });
    }
    Timing arrival;
    if (with_arrival) {
      // Let the decoders reach steady decoding, then send the long prompt.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      arrival = Run(stub, RandomPrompt(absl::GetFlag(FLAGS_prompt_tokens), base + 7), 1);
    }
    for (auto& t : threads) t.join();
    std::vector<double> gaps;
    for (const Timing& t : out) {
      if (!t.ok) {
        std::fprintf(stderr, "error: %s\n", t.error.c_str());
        return 1;
      }
      gaps.insert(gaps.end(), t.gaps_ms.begin(), t.gaps_ms.end());
    }
    std::printf("%-34s %10.2f %10.2f %10.2f\n",
                with_arrival ? "with a long prompt arriving" : "alone", Percentile(gaps, 0.5),
                Percentile(gaps, 0.9), Percentile(gaps, 1.0));
    if (with_arrival) {
      std::printf("  (the %d-token prompt's first token came after %.1f ms)\n",
                  absl::GetFlag(FLAGS_prompt_tokens), arrival.ttft_ms);
    }
  }
  return 0;
}

// Waits for the router to have a ready worker group (it connects in the
// background after it starts listening).
bool WaitReady(v1::Generate::Stub& stub) {
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    v1::ListModelsResponse resp;
    if (stub.ListModels(&ctx, {}, &resp).ok() && resp.models_size() > 0 &&
        resp.models(0).num_ready_groups() > 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ringlane-router-bench --router=HOST:PORT --scenario=ttft|itl [--prompt_tokens=N]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_prompt_tokens) < 2 || absl::GetFlag(FLAGS_vocab) < 4) {
    std::fprintf(stderr, "error: --prompt_tokens must be >= 2 and --vocab >= 4\n");
    return 2;
  }
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_router), grpc::InsecureChannelCredentials()));
  if (!WaitReady(*stub)) {
    std::fprintf(stderr, "error: no ready worker group behind %s after 60 s\n",
                 absl::GetFlag(FLAGS_router).c_str());
    return 1;
  }
  const std::string s = absl::GetFlag(FLAGS_scenario);
  if (s == "ttft") return Ttft(*stub);
  if (s == "itl") return Itl(*stub);
  std::fprintf(stderr, "error: --scenario must be ttft or itl\n");
  return 2;
}
