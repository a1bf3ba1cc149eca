// Request bodies of /v1/completions, /v1/chat/completions, /tokenize and
// /detokenize turned into the router's messages. Pure functions, no I/O.
//
// Requests are checked strictly: a field this server does not implement
// (tools, response_format, logit_bias, ...) is a 400 that names it rather than
// being ignored, and so is any field it does not know. JSON null counts as
// absent, as OpenAI's own clients send it.
#ifndef RINGLANE_ROUTER_API_OPENAI_REQUEST_H_
#define RINGLANE_ROUTER_API_OPENAI_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "ringlane/v1/generate.pb.h"

namespace ringlane::router::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// Completions' default max_tokens when the request gives none, as in
// OpenAI's legacy API and vLLM; chat completions default to the rest of the
// context.
inline constexpr int kCompletionsDefaultMaxTokens = 16;
// What OpenAI's API itself allows, whatever the workers could do: stop
// sequences per request, and alternatives per token of completions'
// integer `logprobs`.
inline constexpr int kMaxStopSequences = 4;
inline constexpr int kCompletionsMaxLogprobs = 5;

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
  // Alternatives per token the workers' sampler returns at most
  // (WorkerInfo.limits.max_top_logprobs, which the gateway copies from
  // Router::model() for each request), so that a client learns the bound
  // under OpenAI's field name. -1 while no worker group has connected: then
  // only the sign is checked here, and Router::Prepare refuses the request.
  int max_top_logprobs = -1;
  // logit_bias values lie in [-max, max] (WorkerLimits.max_abs_logit_bias,
  // copied the same way); -1: only finiteness is checked here.
  float max_abs_logit_bias = -1;
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
  // Chat tools (checked by ParseTools) and tool_choice: "auto", "none",
  // "required" or "function" (then tool_function names it). Output is
  // parsed for tool calls when tools are declared and the choice is not
  // "none".
  nlohmann::ordered_json tools;
  std::string tool_choice = "auto";
  std::string tool_function;
  bool parallel_tool_calls = true;
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

}  // namespace ringlane::router::openai

#endif  // RINGLANE_ROUTER_API_OPENAI_REQUEST_H_
