// The OpenAI request parsers (router/api/openai_api.h) over arbitrary bodies:
// /v1/completions and /v1/chat/completions bodies into GenerateRequests, and
// the /tokenize and /detokenize bodies. What must hold for any body: no
// crash, no undefined behaviour, and an error that the gateway can send,
// i.e. a 4xx (bad input is the client's fault, invariant 5 of DESIGN.md)
// whose OpenAI error JSON serializes.
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_api.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

namespace openai = ringlane::router::openai;

void CheckRejection(const absl::Status& status) {
  const openai::ApiError e = openai::ErrorFromStatus(status);
  FUZZ_CHECK(e.status >= 400 && e.status < 500, "bad input got HTTP %d: %s", e.status,
             std::string(status.ToString()).c_str());
  // The gateway sends exactly this text; it must be JSON that a client can
  // read back (the message may quote the client's bytes).
  const std::string body = openai::ErrorJson(e);
  FUZZ_CHECK(nlohmann::json::accept(body), "error body is not JSON: %s", body.c_str());
}

// The gateway passes the workers' advertised bound (WorkerInfo.limits); the
// value is theirs today, any other would do.
openai::RequestLimits WorkerLimits() {
  openai::RequestLimits limits;
  limits.max_top_logprobs = 20;
  return limits;
}

void CheckParsed(const openai::ParsedRequest& r, const openai::RequestLimits& limits) {
  FUZZ_CHECK(!r.prompts.empty(), "accepted a request without prompts");
  FUZZ_CHECK(r.n >= 1, "n = %d", r.n);
  FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= limits.max_top_logprobs, "top_logprobs = %d",
             r.top_logprobs);
  FUZZ_CHECK(!r.model.empty(), "accepted a request without a model");
  for (const ringlane::v1::GenerateRequest& p : r.prompts) {
    FUZZ_CHECK(p.max_tokens() >= 0, "max_tokens = %d", p.max_tokens());
    // It crosses to the router as a message; it must serialize.
    std::string bytes;
    FUZZ_CHECK(p.SerializeToString(&bytes), "a prompt does not serialize");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (openai::Endpoint endpoint :
       {openai::Endpoint::kCompletions, openai::Endpoint::kChatCompletions}) {
    static const openai::RequestLimits limits = WorkerLimits();
    absl::StatusOr<openai::ParsedRequest> r =
        openai::ParseRequest(endpoint, body, "fuzz-session", limits);
    if (r.ok()) {
      CheckParsed(*r, limits);
    } else {
      CheckRejection(r.status());
    }
  }
  if (auto t = openai::ParseTokenizeRequest(body); !t.ok()) CheckRejection(t.status());
  if (auto d = openai::ParseDetokenizeRequest(body); !d.ok()) CheckRejection(d.status());
  return 0;
}
