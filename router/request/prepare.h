// Request validation and tokenization: a GenerateRequest or TokenizeRequest
// checked field by field (InvalidArgument naming the field), its prompt
// encoded (text, token ids, or a conversation through the chat template),
// and its sampling policy resolved (default temperature, seed). Stateless
// apart from the request-id counter; thread-safe.
#ifndef RINGLANE_ROUTER_REQUEST_PREPARE_H_
#define RINGLANE_ROUTER_REQUEST_PREPARE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ringlane/v1/generate.pb.h"
#include "ringlane/v1/worker.pb.h"
#include "router/request/chat_template.h"
#include "router/request/loop_watchdog.h"
#include "router/request/request_state.h"
#include "router/request/seed.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

// What the served model is, from the first group that connected.
struct ModelDescription {
  std::string model_id;
  int32_t max_context_tokens = 0;
  int32_t vocab_size = 0;
  std::vector<int32_t> eos_ids;  // EOS ids that stop generation (unless ignore_eos)
  // What the workers' sampler accepts (WorkerInfo.limits).
  ringlane::v1::WorkerLimits limits;
};

// Most draft tokens one decode step may verify (GenerateRequest.max_drafts,
// --spec_max_drafts).
inline constexpr int kMaxDraftsPerStep = 64;
// Most logit_bias entries per request (ours: the map travels with every
// lane's first row); the value bounds are the workers' (WorkerLimits).
inline constexpr int kMaxLogitBiasTokens = 1024;

// The tools of a chat (ChatMessages.tools, JSON text) checked for shape: an
// array of {"type": "function", "function": {"name": NAME, "description"?,
// "parameters"?: object, "strict"?}} with names of 1..64 of [A-Za-z0-9_-],
// each declared once. InvalidArgument naming "tools[i]...".
absl::StatusOr<nlohmann::ordered_json> ParseTools(std::string_view tools_json);

struct PrepareOptions {
  float default_temperature = 0;
  SeedPolicy seed_policy = SeedPolicy::kDerived;
  int max_choices = 16;
  int max_tokens_default = 0;
  bool loop_watchdog = true;
  // Input bounds (flags of ringlane-router). A request id travels in
  // response headers and logs, so it is short and of a safe alphabet; a
  // session id is kept in the affinity map; stop strings are copied into
  // each choice's matcher.
  size_t max_request_id_bytes = 128;
  size_t max_session_id_bytes = 256;
  int max_stop_strings = 16;
  size_t max_stop_bytes = 1024;
  int max_stop_token_ids = 256;
};

// OK when `id` is a usable request id: 1..max_bytes of [A-Za-z0-9] and
// -_.:/@+=~ (no spaces, quotes or control bytes: it goes into headers).
absl::Status CheckRequestId(std::string_view field, std::string_view id, size_t max_bytes);

// OK, or InvalidArgument naming `field` when `text` is not valid UTF-8 (text
// fields travel as bytes, so that this check, not the protobuf parser,
// answers).
absl::Status CheckUtf8(const std::string& field, std::string_view text);

class RequestPreparer {
 public:
  // `tokenizer` and `chat_template` are not owned and must outlive this.
  RequestPreparer(PrepareOptions options, const Tokenizer* tokenizer,
                  const ChatTemplate* chat_template)
      : options_(options), tokenizer_(tokenizer), chat_template_(chat_template) {}

  absl::StatusOr<PreparedRequest> Prepare(const ringlane::v1::GenerateRequest& request,
                                          const ModelDescription& model) const;
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ringlane::v1::ChatMessages& chat) const;
  // The grammar of request.constraint(); `tools`: the chat's tools as
  // ParseTools gave them (null without). InvalidArgument naming the field.
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> CompileConstraint(
      const ringlane::v1::GenerateRequest& request, const nlohmann::ordered_json* tools) const;
  // `model` is null before any group connected (then any model id passes).
  absl::StatusOr<ringlane::v1::TokenizeResponse> Tokenize(
      const ringlane::v1::TokenizeRequest& request, const ModelDescription* model) const;

 private:
  // `tools`: chat.tools() parsed once by the caller (null without).
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ringlane::v1::ChatMessages& chat,
                                                  const nlohmann::ordered_json* tools) const;
  const PrepareOptions options_;
  const Tokenizer* const tokenizer_;
  const ChatTemplate* const chat_template_;
  mutable std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_PREPARE_H_
