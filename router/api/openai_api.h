// The OpenAI wire format of the gateway: request bodies of /v1/completions
// and /v1/chat/completions turned into GenerateRequests, the router's
// GenerateResponses turned into OpenAI responses and stream chunks, and
// errors in OpenAI's shape. Pure functions and plain state, no I/O: the
// gateway (gateway.h) does the HTTP side.
//
// Requests are checked strictly: a field this server does not implement
// (tools, response_format, logit_bias, ...) is a 400 that names it rather than
// being ignored, and so is any field it does not know. JSON null counts as
// absent, as OpenAI's own clients send it.
#ifndef RINGLANE_ROUTER_API_OPENAI_API_H_
#define RINGLANE_ROUTER_API_OPENAI_API_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "ringlane/v1/generate.pb.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// An error as OpenAI returns it: {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
std::string ErrorJson(const ApiError& e);

// The HTTP status and error for a failure of the router or of parsing:
// InvalidArgument 400 (404 model_not_found for an unknown model),
// ResourceExhausted 429, Unavailable 503, Unauthenticated 401,
// PermissionDenied 403, NotFound 404, DeadlineExceeded 504, Cancelled 499,
// others 500. `param` is the field a message starts with ("max_tokens: ...").
ApiError ErrorFromStatus(const absl::Status& status);

// Completions' default max_tokens when the request gives none, as in
// OpenAI's legacy API and vLLM; chat completions default to the rest of the
// context.
inline constexpr int kCompletionsDefaultMaxTokens = 16;

// Bounds on what one request body may ask for, each enforced while parsing
// (flags of ringlane-router; defaults documented in README.md).
struct RequestLimits {
  // Nesting of JSON arrays and objects. OpenAI requests need about 6.
  int max_json_depth = 64;
  // Prompts times n of one request: every choice is a lane.
  int max_choices = 64;
  // model, user and other free strings that are echoed or logged.
  size_t max_string_bytes = 256;
  // Checked here as well as by the router: the parsed request copies them
  // into every prompt's GenerateRequest, so a 2 MB stop string times 64
  // prompts would be 128 MB before the router saw one.
  size_t max_stop_bytes = 1024;
  size_t max_session_id_bytes = 256;
  size_t max_request_id_bytes = 128;
};

// InvalidArgument when `body` nests arrays/objects deeper than `max_depth`
// (strings are skipped; malformed JSON is left to the parser).
absl::Status CheckJsonDepth(std::string_view body, int max_depth);

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as the client gave it (echoed back)
  // One per prompt (a completions request may carry a list); chat has one.
  // Choice i of prompt p is index p*n + i in the response.
  std::vector<ringlane::v1::GenerateRequest> prompts;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // return logprobs of generated tokens
  int top_logprobs = 0;
  bool echo = false;  // completions: the prompt's text before the completion
  std::string user;
};

// Parses and checks a request body. InvalidArgument whose message starts
// with the field ("temperature: expected a number, got string"). Ranges the
// router checks itself (temperature, top_p, max_tokens against the context,
// ...) are left to Router::Prepare. `session_header` is X-Session-Id.
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           std::string_view session_header,
                                           const RequestLimits& limits = {});

// /tokenize: {"model"?, "prompt": text, "add_special_tokens"?: bool (default
// true)} or {"model"?, "messages": [...]}.
absl::StatusOr<ringlane::v1::TokenizeRequest> ParseTokenizeRequest(
    std::string_view body, const RequestLimits& limits = {});
// /detokenize: {"model"?, "tokens": [ids]}; the model (may be "") and ids.
absl::StatusOr<std::pair<std::string, std::vector<int32_t>>> ParseDetokenizeRequest(
    std::string_view body, const RequestLimits& limits = {});

// Builds the response of one request from the router's messages, as they
// arrive; the same object gives the streamed chunks and the final JSON, so
// the two cannot disagree.
class ResponseBuilder {
 public:
  // `id` like "cmpl-req-7"; `created` Unix seconds; `num_prompts` * `n`
  // choices.
  ResponseBuilder(const ParsedRequest& request, std::string id, int64_t created, std::string model,
                  int num_prompts, const Tokenizer& tokenizer);

  // Takes one router message of prompt `prompt`. Returns the SSE chunks
  // (JSON objects, without "data: ") to send for it when streaming.
  std::vector<nlohmann::json> Add(int prompt, const ringlane::v1::GenerateResponse& msg);

  // Chunks that open a chat stream: the assistant role of every choice.
  std::vector<nlohmann::json> OpeningChunks() const;
  // The last chunk when include_usage: no choices, the usage.
  nlohmann::json UsageChunk() const;
  // The whole non-streamed response.
  nlohmann::json Final() const;
  nlohmann::json Usage() const;

 private:
  struct ChoiceState {
    std::string text;
    int completion_tokens = 0;
    bool echo_pending = false;  // the next message is the prompt echo
    std::string finish_reason;  // "" while running
    nlohmann::json logprobs;    // accumulated, format per endpoint
    int64_t text_offset = 0;    // completions logprobs: bytes of text so far
  };
  nlohmann::json ChunkBase() const;
  nlohmann::json LogprobsOf(const ringlane::v1::GenerateResponse& msg, ChoiceState& c) const;

  const ParsedRequest& request_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const Tokenizer& tokenizer_;
  std::vector<ChoiceState> choices_;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int64_t cached_tokens_ = 0;
};

// OpenAI's name for a finish reason ("stop", "length", "loop", "abort").
std::string FinishReasonName(ringlane::v1::FinishReason reason);

// Text for JSON: invalid UTF-8 sequences replaced by U+FFFD (token bytes of
// byte-level vocabularies may be part of a character).
std::string ValidUtf8(std::string_view bytes);

}  // namespace ringlane::router::openai

#endif  // RINGLANE_ROUTER_API_OPENAI_API_H_
