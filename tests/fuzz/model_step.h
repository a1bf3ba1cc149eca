// For the model loader targets: runs one real step over weights a loader
// accepted (a 3-token prompt, greedy, on the CPU backend with a small KV
// pool), so that "accepted" is checked to mean "runnable": a loader that lets
// through a shape the forward pass cannot handle is a finding. CheckLoaded is
// the whole check of one load's result.
#ifndef RINGLANE_TESTS_FUZZ_MODEL_STEP_H_
#define RINGLANE_TESTS_FUZZ_MODEL_STEP_H_

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ringlane/v1/worker.pb.h"
#include "tests/fuzz/fuzz_support.h"
#include "worker/backend/factory.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/server/round_executor.h"

namespace ringlane::fuzz {

inline void RunOneStep(std::unique_ptr<worker::ModelWeights> weights) {
  const int vocab = weights->config.vocab;
  const int max_position = weights->config.max_position;
  worker::BackendOptions options;
  options.cpu.threads = 1;
  auto backend = worker::CreateBackend(
      std::shared_ptr<const worker::ModelWeights>(std::move(weights)), options, nullptr);
  FUZZ_CHECK(backend.ok(), "a loaded model gets no backend: %s",
             backend.status().ToString().c_str());
  const absl::Status pool =
      (*backend)->AllocateKvPool({/*num_blocks=*/2, /*block_size=*/4, worker::DType::kF32});
  // A pool too large for the model's memory is an operator's choice, not the
  // loader's; anything else is a finding.
  if (pool.code() == absl::StatusCode::kResourceExhausted) return;
  FUZZ_CHECK(pool.ok(), "a loaded model gets no KV pool: %s", pool.ToString().c_str());

  v1::RoundPlan plan;
  plan.set_round_id(1);
  v1::LaneStep* row = plan.add_rows();
  row->set_lane_id(1);
  const int tokens = std::min(3, max_position);
  for (int i = 0; i < tokens; ++i) row->add_token_ids((i + 1) % vocab);
  row->add_block_ids(0);
  row->set_sample_last(true);
  row->mutable_sampling()->set_temperature(0);
  row->mutable_sampling()->set_seed(1);
  row->mutable_sampling()->set_top_logprobs(2);
  worker::RoundExecutor exec(backend->get(), /*rank=*/0);
  absl::StatusOr<v1::RoundResult> r = exec.Run(plan);
  FUZZ_CHECK(r.ok(), "a step of a loaded model failed: %s", r.status().ToString().c_str());
  FUZZ_CHECK(!r->has_error() || r->error().code() == 0, "a loaded model refused its step: %s",
             r->error().message().c_str());
  FUZZ_CHECK(r->outputs_size() == 1 && r->outputs(0).tokens_size() == 1, "no sampled token");
  const int token = r->outputs(0).tokens(0).token_id();
  FUZZ_CHECK(token >= 0 && token < vocab, "sampled token %d, vocab %d", token, vocab);
}

// A load either fails with one of `refusals` (anything else, an Internal
// error say, is a finding) or gives weights whose config ValidateConfig
// accepts and that run a step.
inline void CheckLoaded(absl::StatusOr<std::unique_ptr<worker::ModelWeights>> w,
                        std::initializer_list<absl::StatusCode> refusals) {
  if (!w.ok()) {
    FUZZ_CHECK(std::find(refusals.begin(), refusals.end(), w.status().code()) != refusals.end(),
               "LoadModel failed with %s", w.status().ToString().c_str());
    return;
  }
  FUZZ_CHECK(worker::ValidateConfig((*w)->config).ok(),
             "loaded a config that ValidateConfig refuses");
  RunOneStep(std::move(*w));
}

}  // namespace ringlane::fuzz

#endif  // RINGLANE_TESTS_FUZZ_MODEL_STEP_H_
