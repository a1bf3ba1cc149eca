// Test drivers for the engine: a small KV block allocator (in production the
// router owns the ledger) and a scheduler that runs several lanes through
// shared rounds, with chosen prefill chunkings and arrival rounds.
#ifndef RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_
#define RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/synthetic.h"
#include "worker/sampler.h"

namespace ringlane::testing {

// Hands out KV block ids from a fixed pool, lowest free id first.
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  // Grows `blocks` so it covers `positions` tokens; false when the pool is empty.
  bool Reserve(std::vector<int32_t>* blocks, int64_t positions, int block_size);
  void Release(std::vector<int32_t>* blocks);
  int free_blocks() const { return static_cast<int>(free_.size()); }

 private:
  std::vector<int32_t> free_;  // sorted descending, so back() is the lowest id
};

struct LaneSpec {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  // The round in which the lane joins (0 = the first round).
  int arrival_round = 0;
  // Prefill chunk sizes, cycled; empty = the whole prompt in one round.
  std::vector<int> prefill_chunks;
  worker::SamplingParams sampling;  // default: greedy
  // Stop when this token is sampled (it is kept as the last output); -1 = never.
  int32_t stop_token = -1;
};

struct LaneResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per generated token, if kept
};

// Runs all lanes to completion through shared rounds on `backend`, which must
// have a KV pool large enough for all of them at once.
absl::StatusOr<std::vector<LaneResult>> RunLanes(worker::Backend* backend,
                                                 const std::vector<LaneSpec>& lanes,
                                                 bool keep_logits = false);

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

// Loads the model at `model_path` into a CPU backend with a KV pool.
absl::StatusOr<std::unique_ptr<worker::Backend>> MakeCpuBackend(
    const std::string& model_path, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options = {.threads = 2});

// Writes the synthetic model `o` (to o.out_dir) and loads it as above.
absl::StatusOr<std::unique_ptr<worker::Backend>> MakeSyntheticBackend(
    const worker::SyntheticModelOptions& o, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options = {.threads = 2});

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_LANE_RUNNER_H_
