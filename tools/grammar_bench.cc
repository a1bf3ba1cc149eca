// Google Benchmark of grammar token masks: one mask per constrained row
// position over a synthetic vocabulary (random ASCII and UTF-8 pieces, the
// size given), inside a JSON string whose every length is a new grammar
// state (maxLength 4096), so no mask comes from the masker's cache. The
// masks of `lanes` positions are computed one after another (threads 1)
// or side by side on a TaskPool, as the planner does with --mask_threads.
//
//   build/tools/ringlane-grammar-bench --benchmark_filter=Masks
//
// Lanes start 256 characters apart and move one character a round, so at
// most 8 lanes and 150 rounds keep every state distinct.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "router/grammar/grammar.h"
#include "router/grammar/synthetic_vocabulary.h"
#include "router/sched/task_pool.h"

namespace {

namespace rg = ringlane::router::grammar;

// args: vocabulary size, lanes (masks per round), threads.
void BM_Masks(benchmark::State& state) {
  const auto vocab = rg::SyntheticVocabulary(static_cast<int>(state.range(0)));
  const rg::TokenMasker masker(vocab, {});
  auto g = rg::JsonSchemaGrammar(
      nlohmann::ordered_json::parse(R"({"type": "string", "maxLength": 4096})"), "schema");
  if (!g.ok()) {
    state.SkipWithError("schema");
    return;
  }
  const size_t lanes = static_cast<size_t>(state.range(1));
  ringlane::router::TaskPool pool(static_cast<int>(state.range(2)));
  std::vector<rg::Matcher> at;
  // Lane i starts i * 256 characters in, so no two lanes share a state.
  for (size_t i = 0; i < lanes; ++i) {
    at.emplace_back(*g);
    at.back().Advance("\"" + std::string(i * 256, 'b'));
  }
  for (auto _ : state) {
    // One more character each round: every state is new.
    for (rg::Matcher& m : at) {
      if (!m.Advance("a")) {
        state.SkipWithError("string too long; fewer iterations");
        return;
      }
    }
    pool.ParallelFor(lanes, [&](size_t i) { benchmark::DoNotOptimize(masker.Mask(at[i], false)); });
  }
  state.counters["masks/s"] = benchmark::Counter(static_cast<double>(state.iterations() * lanes),
                                                 benchmark::Counter::kIsRate);
}

BENCHMARK(BM_Masks)
    ->ArgNames({"vocab", "lanes", "threads"})
    ->Args({32000, 8, 1})
    ->Args({32000, 8, 2})
    ->Args({150000, 8, 1})
    ->Args({150000, 8, 2})
    ->Iterations(150)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
