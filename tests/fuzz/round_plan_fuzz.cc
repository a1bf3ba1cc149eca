// RoundPlan validation and execution on a worker rank
// (worker/server/round_executor.h) over arbitrary plans from the router: one
// executor per input, as one Rounds stream, on the CPU backend over the
// bundled stories260K model with a small KV pool, so accepted plans really
// run a step. What must hold: no crash, no undefined behaviour, and a bad
// plan is answered with result.error (INVALID_ARGUMENT), never an execution
// failure; a single CPU rank has no collective that could fail, so a non-OK
// Run means a plan got past validation that the backend could not run.
// Accepted plans' sampled tokens are in the vocabulary, one output per
// sampling row.
//
// Input: a serialized message `repeated RoundPlan plans = 1` (the plans of
// one stream, in order; at most 8 are run), which make_seeds.py writes from
// readable plans.
#include <cstdint>
#include <memory>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "ringlane/v1/worker.pb.h"
#include "tests/fuzz/fuzz_support.h"
#include "worker/backend/factory.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/server/round_executor.h"

namespace {

namespace v1 = ringlane::v1;
using ringlane::worker::Backend;

// 16 blocks of 4 positions: small enough that plans run out of it.
constexpr ringlane::worker::KvPoolSpec kPool{/*num_blocks=*/16, /*block_size=*/4,
                                             ringlane::worker::DType::kF32};
constexpr int kMaxPlans = 8;

Backend& TheBackend() {
  static Backend* backend = [] {
    const std::string path =
        std::string(RINGLANE_SOURCE_DIR) + "/deploy/models/stories260K/stories260K.bin";
    auto model = ringlane::worker::LoadModel(path);
    FUZZ_CHECK(model.ok(), "cannot load %s: %s", path.c_str(), model.status().ToString().c_str());
    ringlane::worker::BackendOptions options;
    options.cpu.threads = 1;
    auto b = ringlane::worker::CreateBackend(
        std::shared_ptr<const ringlane::worker::ModelWeights>(std::move(*model)), options, nullptr);
    FUZZ_CHECK(b.ok(), "cannot create the backend: %s", b.status().ToString().c_str());
    absl::Status s = (*b)->AllocateKvPool(kPool);
    FUZZ_CHECK(s.ok(), "cannot allocate the KV pool: %s", s.ToString().c_str());
    return b->release();
  }();
  return *backend;
}

void CheckResult(const v1::RoundPlan& plan, const v1::RoundResult& result, int vocab) {
  FUZZ_CHECK(result.round_id() == plan.round_id(), "round_id not echoed");
  if (result.has_error() && result.error().code() != 0) {
    FUZZ_CHECK(result.error().code() == static_cast<int>(absl::StatusCode::kInvalidArgument),
               "plan rejected with code %d: %s", result.error().code(),
               result.error().message().c_str());
    FUZZ_CHECK(result.outputs_size() == 0, "a rejected plan has outputs");
    return;
  }
  int sampling_rows = 0;
  for (const v1::LaneStep& row : plan.rows()) {
    sampling_rows += row.sample_last() || row.verify_offsets_size() > 0;
  }
  FUZZ_CHECK(result.outputs_size() == sampling_rows, "%d outputs for %d sampling rows",
             result.outputs_size(), sampling_rows);
  for (const v1::LaneOutput& o : result.outputs()) {
    FUZZ_CHECK(o.tokens_size() >= 1 && o.tokens_size() == o.accepted_draft_count() + 1,
               "%d tokens with %d drafts accepted", o.tokens_size(), o.accepted_draft_count());
    for (const v1::SampledToken& t : o.tokens()) {
      FUZZ_CHECK(t.token_id() >= 0 && t.token_id() < vocab, "sampled token %d, vocab %d",
                 t.token_id(), vocab);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using google::protobuf::internal::WireFormatLite;
  Backend& backend = TheBackend();
  ringlane::worker::RoundExecutor exec(&backend, /*rank=*/0);
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  for (int i = 0; i < kMaxPlans; ++i) {
    const uint32_t tag = in.ReadTag();
    if (tag != WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) break;
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) break;
    const auto limit = in.PushLimit(static_cast<int>(length));
    v1::RoundPlan plan;
    const bool parsed = plan.ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
    in.PopLimit(limit);
    if (!parsed) break;
    absl::StatusOr<v1::RoundResult> result = exec.Run(plan);
    FUZZ_CHECK(result.ok(), "a plan failed in execution instead of validation: %s",
               result.status().ToString().c_str());
    CheckResult(plan, *result, backend.config().vocab);
  }
  return 0;
}
