// The router's GenerateResponses turned into OpenAI responses and stream
// chunks. Plain state, no I/O.
#ifndef RINGLANE_ROUTER_API_OPENAI_RESPONSE_H_
#define RINGLANE_ROUTER_API_OPENAI_RESPONSE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "ringlane/v1/generate.pb.h"
#include "router/api/openai_request.h"
#include "router/request/tool_parser.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router::openai {

// Builds the response of one request from the router's messages, as they
// arrive; the same object gives the streamed chunks and the final JSON, so
// the two cannot disagree.
class ResponseBuilder {
 public:
  // `id` like "cmpl-req-7"; `created` Unix seconds; `num_prompts` * `n`
  // choices.
  // `output`: chat output is split into content, reasoning_content and
  // tool_calls by these rules (tools declared, or a reasoning template);
  // absent: the text is the content as generated.
  ResponseBuilder(const ParsedRequest& request, std::string id, int64_t created, std::string model,
                  int num_prompts, const Tokenizer& tokenizer,
                  std::optional<ToolParserOptions> output = std::nullopt);

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
    bool echo_pending = false;                   // the next message is the prompt echo
    std::string finish_reason;                   // "" while running
    nlohmann::json logprobs;                     // accumulated, format per endpoint
    int64_t text_offset = 0;                     // completions logprobs: bytes of text so far
    std::unique_ptr<OutputStreamParser> parser;  // streamed chat with output rules
  };
  // The delta's JSON (content, reasoning_content, tool_calls).
  static nlohmann::json DeltaJson(const OutputDelta& d);
  // The output rules of choice `index` (its ids are its own).
  ToolParserOptions OutputOptions(size_t index) const;
  nlohmann::json ChunkBase() const;
  nlohmann::json LogprobsOf(const ringlane::v1::GenerateResponse& msg, ChoiceState& c) const;

  const ParsedRequest& request_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const Tokenizer& tokenizer_;
  const std::optional<ToolParserOptions> output_;
  std::vector<ChoiceState> choices_;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int64_t cached_tokens_ = 0;
};

// OpenAI's name for a finish reason ("stop", "length", "loop", "abort").
std::string FinishReasonName(ringlane::v1::FinishReason reason);

}  // namespace ringlane::router::openai

#endif  // RINGLANE_ROUTER_API_OPENAI_RESPONSE_H_
