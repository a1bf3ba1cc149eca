#include "router/api/openai_response.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "router/api/openai_errors.h"

namespace ringlane::router::openai {

namespace v1 = ringlane::v1;
using nlohmann::json;

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_LOOP:
      return "loop";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "";
  }
}

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, std::string id, int64_t created,
                                 std::string model, int num_prompts, const Tokenizer& tokenizer,
                                 std::optional<ToolParserOptions> output)
    : request_(request),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      output_(request.endpoint == Endpoint::kChatCompletions ? std::move(output) : std::nullopt),
      choices_(static_cast<size_t>(num_prompts * request.n)) {
  for (size_t i = 0; i < choices_.size(); ++i) {
    ChoiceState& c = choices_[i];
    if (output_ && request.stream) {
      c.parser = std::make_unique<OutputStreamParser>(OutputOptions(i));
    }
    c.echo_pending = request.echo;
    if (request.logprobs) {
      c.logprobs = request.endpoint == Endpoint::kChatCompletions
                       ? json{{"content", json::array()}}
                       : json{{"tokens", json::array()},
                              {"token_logprobs", json::array()},
                              {"top_logprobs", json::array()},
                              {"text_offset", json::array()}};
    }
  }
}

ToolParserOptions ResponseBuilder::OutputOptions(size_t index) const {
  ToolParserOptions o = *output_;
  // Unique per response and choice, and the same whole or streamed.
  o.id_prefix = absl::StrCat("call_", id_, "_", index, "_");
  return o;
}

json ResponseBuilder::DeltaJson(const OutputDelta& d) {
  json j = json::object();
  if (!d.reasoning_content.empty()) j["reasoning_content"] = d.reasoning_content;
  if (!d.content.empty()) j["content"] = d.content;
  if (!d.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCallDelta& t : d.tool_calls) {
      json fn = {{"arguments", t.arguments}};
      json call = {{"index", t.index}};
      // The first piece of a call names it, whole.
      if (!t.name.empty()) {
        call["id"] = t.id;
        call["type"] = "function";
        fn["name"] = t.name;
      }
      call["function"] = std::move(fn);
      calls.push_back(std::move(call));
    }
    j["tool_calls"] = std::move(calls);
  }
  return j;
}

json ResponseBuilder::ChunkBase() const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json j = {{"id", id_},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"system_fingerprint", nullptr},
            {"choices", json::array()}};
  if (request_.include_usage) j["usage"] = nullptr;
  return j;
}

json ResponseBuilder::LogprobsOf(const v1::GenerateResponse& msg, ChoiceState& c) const {
  auto bytes_of = [this](int32_t id) {
    absl::StatusOr<std::string> b = tokenizer_.TokenBytes(id);
    return b.ok() ? *b : std::string();
  };
  auto byte_list = [](const std::string& b) {
    json a = json::array();
    for (unsigned char ch : b) a.push_back(static_cast<int>(ch));
    return a;
  };
  if (request_.endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const v1::LogprobEntry& e : msg.logprobs()) {
      json top = json::array();
      for (const v1::TokenLogprob& t : e.top_logprobs()) {
        const std::string b = bytes_of(t.token_id());
        top.push_back({{"token", ValidUtf8(b)}, {"logprob", t.logprob()}, {"bytes", byte_list(b)}});
      }
      content.push_back({{"token", ValidUtf8(e.token_bytes())},
                         {"logprob", e.logprob()},
                         {"bytes", byte_list(e.token_bytes())},
                         {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}};
  }
  json lp = {{"tokens", json::array()},
             {"token_logprobs", json::array()},
             {"top_logprobs", json::array()},
             {"text_offset", json::array()}};
  for (const v1::LogprobEntry& e : msg.logprobs()) {
    lp["tokens"].push_back(ValidUtf8(e.token_bytes()));
    lp["token_logprobs"].push_back(e.logprob());
    json top = json::object();
    for (const v1::TokenLogprob& t : e.top_logprobs()) {
      top[ValidUtf8(bytes_of(t.token_id()))] = t.logprob();
    }
    lp["top_logprobs"].push_back(std::move(top));
    lp["text_offset"].push_back(c.text_offset);
    c.text_offset += static_cast<int64_t>(e.token_bytes().size());
  }
  return lp;
}

std::vector<json> ResponseBuilder::Add(int prompt, const v1::GenerateResponse& msg) {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  const int index = prompt * request_.n + msg.index();
  std::vector<json> chunks;
  if (index < 0 || index >= static_cast<int>(choices_.size())) return chunks;
  ChoiceState& c = choices_[static_cast<size_t>(index)];
  if (msg.has_usage()) {
    prompt_tokens_ += msg.usage().prompt_tokens();
    completion_tokens_ += msg.usage().completion_tokens();
    cached_tokens_ += msg.usage().cached_tokens();
  }
  json lp = nullptr;
  if (c.echo_pending) {
    // The router's first message of an echoing choice is the prompt.
    c.echo_pending = false;
    c.text_offset += static_cast<int64_t>(msg.text().size());
  } else {
    c.completion_tokens += msg.token_ids_size();
    if (request_.logprobs && msg.logprobs_size() > 0) {
      lp = LogprobsOf(msg, c);
      // A stream sends each piece once and never builds Final(): keeping
      // the pieces would grow with the output (gigabytes at long contexts).
      if (!request_.stream) {
        for (auto& [k, v] : lp.items()) {
          for (auto& x : v) c.logprobs[k].push_back(x);
        }
      }
    }
  }
  if (!request_.stream) c.text += msg.text();
  std::string finish = FinishReasonName(msg.finish_reason());
  json delta = json::object();
  if (c.parser) {
    OutputDelta d = c.parser->Feed(msg.text());
    if (!finish.empty()) {
      const OutputDelta rest = c.parser->Finish();
      d.content += rest.content;
      d.reasoning_content += rest.reasoning_content;
      d.tool_calls.insert(d.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
      // A model that stopped after calling tools asks for their results.
      if (finish == "stop" && c.parser->has_tool_calls()) finish = "tool_calls";
    }
    // parallel_tool_calls false: the first call only (under "required" the
    // grammar already allows one).
    if (!request_.parallel_tool_calls) {
      std::erase_if(d.tool_calls, [](const ToolCallDelta& t) { return t.index > 0; });
    }
    delta = DeltaJson(d);
  } else if (!msg.text().empty()) {
    delta = {{"content", msg.text()}};
  }
  if (!finish.empty()) c.finish_reason = finish;
  if (msg.text().empty() && finish.empty() && lp.is_null()) return chunks;
  if (c.parser && delta.empty() && finish.empty() && lp.is_null()) return chunks;

  json ch = {{"index", index},
             {"logprobs", std::move(lp)},
             {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}};
  if (chat) {
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = msg.text();
  }
  json chunk = ChunkBase();
  chunk["choices"].push_back(std::move(ch));
  chunks.push_back(std::move(chunk));
  return chunks;
}

std::vector<json> ResponseBuilder::OpeningChunks() const {
  std::vector<json> out;
  if (request_.endpoint != Endpoint::kChatCompletions) return out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    json chunk = ChunkBase();
    chunk["choices"].push_back({{"index", i},
                                {"delta", {{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}});
    out.push_back(std::move(chunk));
  }
  return out;
}

json ResponseBuilder::Usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

json ResponseBuilder::UsageChunk() const {
  json chunk = ChunkBase();
  chunk["usage"] = Usage();
  return chunk;
}

json ResponseBuilder::Final() const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& c = choices_[i];
    json ch = {{"index", i},
               {"logprobs", request_.logprobs ? c.logprobs : json(nullptr)},
               {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
    if (chat && output_) {
      ParsedOutput parsed = ParseOutput(c.text, OutputOptions(i));
      if (!request_.parallel_tool_calls && parsed.tool_calls.size() > 1)
        parsed.tool_calls.resize(1);
      json msg = {{"role", "assistant"}};
      // OpenAI's message of a call without text has content null.
      msg["content"] = parsed.content.empty() && !parsed.tool_calls.empty() ? json(nullptr)
                                                                            : json(parsed.content);
      if (!parsed.reasoning_content.empty()) msg["reasoning_content"] = parsed.reasoning_content;
      if (!parsed.tool_calls.empty()) {
        json calls = json::array();
        for (const ToolCall& t : parsed.tool_calls) {
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
        msg["tool_calls"] = std::move(calls);
        if (c.finish_reason == "stop") ch["finish_reason"] = "tool_calls";
      }
      ch["message"] = std::move(msg);
    } else if (chat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      ch["text"] = c.text;
    }
    choices.push_back(std::move(ch));
  }
  return {{"id", id_},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"system_fingerprint", nullptr},
          {"choices", std::move(choices)},
          {"usage", Usage()}};
}

}  // namespace ringlane::router::openai
