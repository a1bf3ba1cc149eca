// Test drivers for the engine: RunLanes runs lanes through shared rounds of
// one in-process backend the way the router would (its planner, ledger and
// applier, tests/support/planned_rounds.h, over worker::RoundExecutor), with
// arrival rounds and chunk sizes chosen through the planner's options; and
// helpers to load the bundled and synthetic models.
#ifndef RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_
#define RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/sched/planner.h"
#include "worker/backend/backend.h"
#include "worker/model/synthetic.h"
#include "worker/sampler.h"

namespace ringlane::testing {

struct LaneSpec {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  // The round in which the lane joins the waiting queue (0 = the first).
  int arrival_round = 0;
  worker::SamplingParams sampling;  // default: greedy
  // Stop when this token is sampled (it is kept as the last output); -1 = never.
  int32_t stop_token = -1;
};

struct LaneResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per generated token, if kept
  // The sizes of the prefill rows that fed the prompt, and how many of them
  // shared a round with another lane's decode row (what a test of chunking
  // and mixed rounds checks it really got).
  std::vector<int64_t> prefill_chunks;
  int mixed_prefill_chunks = 0;
};

struct RunOptions {
  // Chunk sizes and admission: see planned_rounds.h. The defaults prefill a
  // lone prompt of up to 512 tokens in one round.
  router::PlannerOptions planner;
  // Rounds planned ahead of the oldest result (the router's pipelining).
  int pipeline_depth = 1;
  // Keep the logits behind every generated token.
  bool keep_logits = false;
};

// Runs all lanes to completion through shared rounds on `backend`. A pool
// too small for all lanes at once preempts, as the router does; one too
// small for a single lane fails it.
absl::StatusOr<std::vector<LaneResult>> RunLanes(worker::Backend* backend,
                                                 const std::vector<LaneSpec>& lanes,
                                                 const RunOptions& options = {});

// Teacher-forced: feeds `tokens` one round per chunk of `chunk` tokens and
// returns the logits after every position (rows of vocab floats).
absl::StatusOr<std::vector<std::vector<float>>> TeacherForcedLogits(
    worker::Backend* backend, const std::vector<int32_t>& tokens, int chunk);

// Path of a file under the repository root.
std::string SourcePath(const std::string& relative);

// One case of deploy/models/stories260K/golden.json: the prompt's text and
// ids, and the reference implementation's greedy continuation (ids, and the
// text of prompt plus continuation).
struct GoldenCase {
  std::string prompt_text;
  std::vector<int32_t> prompt;
  std::vector<int32_t> ids;
  std::string text;
};

// The golden cases, read once.
const std::vector<GoldenCase>& GoldenCases();

// What a serving side sets in a loaded model's config before running it
// (the worker's --dsa_dense_window, say); null: nothing.
using ConfigureModel = std::function<void(worker::ModelConfig&)>;

// Loads the model at `model_path` into a CPU backend with a KV pool.
absl::StatusOr<std::unique_ptr<worker::Backend>> MakeCpuBackend(
    const std::string& model_path, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options = {.threads = 2},
    const ConfigureModel& configure = nullptr);

// Writes the synthetic model `o` (to o.out_dir) and loads it as above.
absl::StatusOr<std::unique_ptr<worker::Backend>> MakeSyntheticBackend(
    const worker::SyntheticModelOptions& o, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options = {.threads = 2},
    const ConfigureModel& configure = nullptr);

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_
