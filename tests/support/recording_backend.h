// A worker::Backend decorator that forwards every call to the backend it
// wraps and keeps the last Step's input and output, so that a test can read
// the logits behind a round that worker::RoundExecutor ran (its results
// carry only the sampled tokens). Not owned: the wrapped backend must
// outlive it. Not thread-safe, like any backend.
#ifndef RINGLANE_TESTS_SUPPORT_RECORDING_BACKEND_H_
#define RINGLANE_TESTS_SUPPORT_RECORDING_BACKEND_H_

#include <string>
#include <utility>
#include <vector>

#include "worker/backend/backend.h"

namespace ringlane::testing {

class RecordingBackend final : public worker::Backend {
 public:
  explicit RecordingBackend(worker::Backend* inner) : inner_(inner) {}

  std::string name() const override { return inner_->name(); }
  const worker::ModelConfig& config() const override { return inner_->config(); }
  std::vector<worker::LayerCacheSpec> layer_caches() const override {
    return inner_->layer_caches();
  }
  absl::Status AllocateKvPool(const worker::KvPoolSpec& spec) override {
    return inner_->AllocateKvPool(spec);
  }
  const worker::KvPoolSpec& kv_pool() const override { return inner_->kv_pool(); }
  absl::StatusOr<worker::RoundOutput> Step(const worker::RoundInput& round) override {
    last_input_ = round;
    last_output_ = {};
    absl::StatusOr<worker::RoundOutput> out = inner_->Step(round);
    if (out.ok()) last_output_ = *out;
    ++steps_;
    return out;
  }
  int64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  absl::Status ExportKvBlock(int32_t block, std::vector<uint8_t>* out) const override {
    return inner_->ExportKvBlock(block, out);
  }
  absl::Status ImportKvBlock(int32_t block, absl::Span<const uint8_t> data) override {
    return inner_->ImportKvBlock(block, data);
  }

  // The last Step's round and what it returned (empty when it failed).
  const worker::RoundInput& last_input() const { return last_input_; }
  const worker::RoundOutput& last_output() const { return last_output_; }
  // Step calls so far.
  int64_t steps() const { return steps_; }

 private:
  worker::Backend* const inner_;
  worker::RoundInput last_input_;
  worker::RoundOutput last_output_;
  int64_t steps_ = 0;
};

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_RECORDING_BACKEND_H_
