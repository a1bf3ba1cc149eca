#include "tests/support/lane_runner.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "ringlane/v1/worker.pb.h"
#include "router/client/round_builder.h"
#include "router/client/worker_group.h"
#include "tests/support/planned_rounds.h"
#include "tests/support/recording_backend.h"
#include "worker/server/round_executor.h"

namespace ringlane::testing {

namespace {

namespace v1 = ringlane::v1;

v1::SamplingParams ToProto(const worker::SamplingParams& s) {
  v1::SamplingParams p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  p.set_min_p(s.min_p);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  p.set_seed(s.seed);
  if (s.top_logprobs >= 0) p.set_logprobs(true);
  if (s.top_logprobs > 0) p.set_top_logprobs(s.top_logprobs);
  return p;
}

// One rank in-process as a worker group: each plan runs at once through a
// RoundExecutor on the backend. With logits kept, each sampling row's
// logits are taken from the recorded Step, whose sequences are the plan's
// rows that feed tokens, in row order (round_executor.cc).
class InProcessGroup final : public router::WorkerGroup {
 public:
  InProcessGroup(worker::Backend* backend, bool keep_logits)
      : recorder_(backend), executor_(&recorder_, /*rank=*/0), keep_logits_(keep_logits) {
    info_.set_model_id("in-process");
    info_.set_kv_pool_blocks(backend->kv_pool().num_blocks);
    info_.set_block_size_tokens(backend->block_tokens());
    info_.set_tp_world_size(1);
    info_.set_linear_chunk(backend->config().linear.chunk);
  }

  const v1::WorkerInfo& info() const override { return info_; }
  absl::Status Send(const v1::RoundPlan& plan) override {
    const int64_t steps = recorder_.steps();
    absl::StatusOr<v1::RoundResult> r = executor_.Run(plan);
    if (!r.ok()) return r.status();
    if (keep_logits_ && r->error().code() == 0 && recorder_.steps() > steps) Record(plan);
    results_.push_back(std::move(*r));
    return absl::OkStatus();
  }
  absl::StatusOr<v1::RoundResult> Receive() override {
    if (results_.empty()) return absl::FailedPreconditionError("no round in flight");
    v1::RoundResult r = std::move(results_.front());
    results_.pop_front();
    return r;
  }
  absl::Status Check(std::chrono::milliseconds) override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

  // The logits behind the `k`-th token that lane `lane` sampled in round
  // `round_id`; null when none were recorded.
  const float* Logits(uint64_t round_id, uint64_t lane, int k) const {
    auto it = logits_.find({round_id, lane});
    if (it == logits_.end()) return nullptr;
    const size_t at = static_cast<size_t>(k) * vocab_;
    return at + vocab_ <= it->second.size() ? it->second.data() + at : nullptr;
  }
  int vocab() const { return vocab_; }

 private:
  void Record(const v1::RoundPlan& plan) {
    const worker::RoundOutput& out = recorder_.last_output();
    vocab_ = out.vocab;
    size_t seq = 0;
    for (const v1::LaneStep& row : plan.rows()) {
      if (router::RowTokens(row) == 0) continue;
      if (seq >= out.logits.size()) break;
      if (row.sample_last() || row.verify_offsets_size() > 0) {
        logits_[{plan.round_id(), row.lane_id()}] = out.logits[seq];
      }
      ++seq;
    }
  }

  RecordingBackend recorder_;
  worker::RoundExecutor executor_;
  const bool keep_logits_;
  v1::WorkerInfo info_;
  std::deque<v1::RoundResult> results_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<float>> logits_;
  int vocab_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<LaneResult>> RunLanes(worker::Backend* backend,
                                                 const std::vector<LaneSpec>& lanes,
                                                 const RunOptions& options) {
  std::vector<PlannedLane> planned;
  for (const LaneSpec& l : lanes) {
    planned.push_back({.prompt = l.prompt,
                       .max_tokens = l.max_new_tokens,
                       .sampling = ToProto(l.sampling),
                       .arrival_round = l.arrival_round,
                       .stop_token = l.stop_token});
  }
  InProcessGroup group(backend, options.keep_logits);
  absl::StatusOr<std::vector<PlannedLaneOutput>> out = RunPlannedRounds(
      group, planned, {.planner = options.planner, .pipeline_depth = options.pipeline_depth});
  if (!out.ok()) return out.status();
  std::vector<LaneResult> results(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    PlannedLaneOutput& o = (*out)[i];
    LaneResult& r = results[i];
    r.tokens = std::move(o.tokens);
    r.prefill_chunks = std::move(o.prefill_chunks);
    r.mixed_prefill_chunks = o.mixed_prefill_chunks;
    if (!options.keep_logits) continue;
    std::map<std::pair<uint64_t, uint64_t>, int> seen;
    for (size_t t = 0; t < r.tokens.size(); ++t) {
      const std::pair<uint64_t, uint64_t> key{o.token_round_ids[t], o.token_lane_ids[t]};
      const float* lg = group.Logits(key.first, key.second, seen[key]++);
      if (lg == nullptr) {
        return absl::InternalError(absl::StrCat("no logits recorded for lane ", i, " token ", t));
      }
      r.logits.emplace_back(lg, lg + group.vocab());
    }
  }
  return results;
}

absl::StatusOr<std::vector<std::vector<float>>> TeacherForcedLogits(
    worker::Backend* backend, const std::vector<int32_t>& tokens, int chunk) {
  const int bs = backend->block_tokens();
  // One sequence alone in the pool: its blocks are simply 0, 1, 2, ...
  if (static_cast<int64_t>(tokens.size()) > int64_t{backend->kv_pool().num_blocks} * bs) {
    return absl::ResourceExhaustedError("pool too small");
  }
  std::vector<int32_t> blocks;
  std::vector<std::vector<float>> rows;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    const size_t n = std::min(tokens.size() - at, static_cast<size_t>(chunk));
    worker::RoundInput in;
    worker::SeqStep step;
    step.start_position = static_cast<int64_t>(at);
    step.tokens.assign(tokens.begin() + at, tokens.begin() + at + n);
    while (static_cast<int64_t>(blocks.size()) * bs < static_cast<int64_t>(at + n)) {
      blocks.push_back(static_cast<int32_t>(blocks.size()));
    }
    step.block_ids = blocks;
    step.state_slot = 0;  // models with recurrent layers (a pool with state slots)
    for (size_t i = 0; i < n; ++i) step.logit_offsets.push_back(static_cast<int32_t>(i));
    in.seqs.push_back(step);
    auto out = backend->Step(in);
    if (!out.ok()) return out.status();
    const int V = out->vocab;
    for (size_t i = 0; i < n; ++i) {
      rows.emplace_back(out->logits[0].begin() + i * V, out->logits[0].begin() + (i + 1) * V);
    }
  }
  return rows;
}

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(RINGLANE_SOURCE_DIR, "/", relative);
}

absl::StatusOr<std::unique_ptr<worker::Backend>> MakeCpuBackend(
    const std::string& model_path, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options, const ConfigureModel& configure) {
  auto m = worker::LoadModel(model_path);
  if (!m.ok()) return m.status();
  if (configure) configure((*m)->config);
  absl::StatusOr<std::unique_ptr<worker::Backend>> b =
      worker::CreateCpuBackend(std::shared_ptr<const worker::ModelWeights>(std::move(*m)), options);
  if (!b.ok()) return b.status();
  if (absl::Status st = (*b)->AllocateKvPool(kv); !st.ok()) return st;
  return b;
}

absl::StatusOr<std::unique_ptr<worker::Backend>> MakeSyntheticBackend(
    const worker::SyntheticModelOptions& o, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options, const ConfigureModel& configure) {
  if (absl::Status st = worker::WriteSyntheticModel(o); !st.ok()) return st;
  return MakeCpuBackend(o.out_dir, kv, options, configure);
}

const std::vector<GoldenCase>& GoldenCases() {
  static const std::vector<GoldenCase> cases = [] {
    std::ifstream f(SourcePath("deploy/models/stories260K/golden.json"));
    nlohmann::json j = nlohmann::json::parse(f);
    std::vector<GoldenCase> out;
    for (const auto& c : j["cases"]) {
      out.push_back({c["prompt"].get<std::string>(), c["prompt_ids"].get<std::vector<int32_t>>(),
                     c["greedy_ids"].get<std::vector<int32_t>>(),
                     c["greedy_text"].get<std::string>()});
    }
    return out;
  }();
  return cases;
}

}  // namespace ringlane::testing
