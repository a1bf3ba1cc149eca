#include "tests/support/lane_runner.h"

#include <algorithm>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ringlane::testing {

BlockAllocator::BlockAllocator(int num_blocks) {
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockAllocator::Reserve(std::vector<int32_t>* blocks, int64_t positions, int block_size) {
  while (static_cast<int64_t>(blocks->size()) * block_size < positions) {
    if (free_.empty()) return false;
    blocks->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::Release(std::vector<int32_t>* blocks) {
  for (int32_t b : *blocks) free_.push_back(b);
  blocks->clear();
  std::sort(free_.begin(), free_.end(), std::greater<int32_t>());
}

namespace {

struct LaneState {
  const LaneSpec* spec;
  std::vector<int32_t> context;  // prompt + generated
  int64_t done = 0;              // positions already in the KV cache
  int chunk_index = 0;
  std::vector<int32_t> blocks;
  worker::Sampler sampler;
  LaneResult result;
  bool finished = false;
  LaneState(const LaneSpec* s) : spec(s), context(s->prompt), sampler(s->sampling, 0) {}
};

}  // namespace

absl::StatusOr<std::vector<LaneResult>> RunLanes(worker::Backend* backend,
                                                 const std::vector<LaneSpec>& lanes,
                                                 bool keep_logits) {
  const int bs = backend->kv_pool().block_size;
  BlockAllocator alloc(backend->kv_pool().num_blocks);
  std::vector<LaneState> st;
  st.reserve(lanes.size());
  for (const LaneSpec& l : lanes) st.emplace_back(&l);
  for (int round = 0;; ++round) {
    worker::RoundInput in;
    std::vector<int> who;
    bool pending = false;
    for (size_t i = 0; i < st.size(); ++i) {
      LaneState& s = st[i];
      if (s.finished) continue;
      pending = true;
      if (s.spec->arrival_round > round) continue;
      const int64_t prompt_left = static_cast<int64_t>(s.spec->prompt.size()) - s.done;
      int64_t n = 1;
      if (prompt_left > 0) {
        n = prompt_left;
        if (!s.spec->prefill_chunks.empty()) {
          n = std::min<int64_t>(
              n, s.spec->prefill_chunks[s.chunk_index++ % s.spec->prefill_chunks.size()]);
        }
      }
      worker::SeqStep step;
      step.start_position = s.done;
      step.tokens.assign(s.context.begin() + s.done, s.context.begin() + s.done + n);
      if (!alloc.Reserve(&s.blocks, s.done + n, bs)) {
        return absl::ResourceExhaustedError("test KV pool too small");
      }
      step.block_ids = s.blocks;
      // Logits only once the whole prompt is in.
      if (s.done + n >= static_cast<int64_t>(s.spec->prompt.size())) {
        step.logit_offsets.push_back(static_cast<int32_t>(n - 1));
      }
      in.seqs.push_back(std::move(step));
      who.push_back(static_cast<int>(i));
    }
    if (!pending) break;
    if (in.seqs.empty()) continue;
    auto out = backend->Step(in);
    if (!out.ok()) return out.status();
    for (size_t j = 0; j < who.size(); ++j) {
      LaneState& s = st[who[j]];
      s.done += static_cast<int64_t>(in.seqs[j].tokens.size());
      if (in.seqs[j].logit_offsets.empty()) continue;
      const std::vector<float>& lg = out->logits[j];
      worker::SampleResult r = s.sampler.Sample(lg, s.done);
      s.sampler.Observe(r.token);
      s.context.push_back(r.token);
      s.result.tokens.push_back(r.token);
      if (keep_logits) s.result.logits.push_back(lg);
      if (static_cast<int>(s.result.tokens.size()) >= s.spec->max_new_tokens ||
          r.token == s.spec->stop_token) {
        s.finished = true;
        alloc.Release(&s.blocks);
      }
    }
  }
  std::vector<LaneResult> results;
  for (LaneState& s : st) results.push_back(std::move(s.result));
  return results;
}

absl::StatusOr<std::vector<std::vector<float>>> TeacherForcedLogits(
    worker::Backend* backend, const std::vector<int32_t>& tokens, int chunk) {
  const int bs = backend->kv_pool().block_size;
  BlockAllocator alloc(backend->kv_pool().num_blocks);
  std::vector<int32_t> blocks;
  std::vector<std::vector<float>> rows;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    const size_t n = std::min(tokens.size() - at, static_cast<size_t>(chunk));
    worker::RoundInput in;
    worker::SeqStep step;
    step.start_position = static_cast<int64_t>(at);
    step.tokens.assign(tokens.begin() + at, tokens.begin() + at + n);
    if (!alloc.Reserve(&blocks, at + n, bs)) return absl::ResourceExhaustedError("pool too small");
    step.block_ids = blocks;
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
    const worker::CpuBackendOptions& options) {
  auto m = worker::LoadModel(model_path);
  if (!m.ok()) return m.status();
  auto b =
      worker::CreateCpuBackend(std::shared_ptr<const worker::ModelWeights>(std::move(*m)), options);
  if (absl::Status st = b->AllocateKvPool(kv); !st.ok()) return st;
  return b;
}

absl::StatusOr<std::unique_ptr<worker::Backend>> MakeSyntheticBackend(
    const worker::SyntheticModelOptions& o, const worker::KvPoolSpec& kv,
    const worker::CpuBackendOptions& options) {
  if (absl::Status st = worker::WriteSyntheticModel(o); !st.ok()) return st;
  return MakeCpuBackend(o.out_dir, kv, options);
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
