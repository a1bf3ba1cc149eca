#include "router/request/prepare.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/grammar/grammar.h"
#include "router/request/errors.h"
#include "router/request/json_text.h"
#include "router/request/stop_matcher.h"
#include "router/request/tool_grammar.h"
#include "router/tokenizer/utf8.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return FieldError(field, why);
}

// A SentencePiece model writes the value's first token as "▁{" after a
// prompt that ends in a newline; JSON allows the space, so the grammar does.
grammar::GrammarBuilder::Rule OptionalSpace(grammar::GrammarBuilder& b) {
  return b.Repeat(b.Literal(" "), 0, 1);
}

}  // namespace

absl::Status CheckUtf8(const std::string& field, std::string_view text) {
  const size_t bad = utf8::FirstInvalid(text);
  if (bad == text.size()) return absl::OkStatus();
  return Invalid(field, absl::StrCat("not valid UTF-8 (byte ", bad, " of ", text.size(), ")"));
}

absl::Status CheckRequestId(std::string_view field, std::string_view id, size_t max_bytes) {
  if (id.empty() || id.size() > max_bytes) {
    return Invalid(std::string(field),
                   absl::StrCat("must be 1 to ", max_bytes, " bytes, got ", id.size()));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (!absl::ascii_isalnum(c) &&
        std::string_view("-_.:/@+=~").find(static_cast<char>(c)) == std::string_view::npos) {
      return Invalid(std::string(field),
                     absl::StrCat("byte ", i,
                                  " is not one of A-Z a-z 0-9 - _ . : / @ + = ~ (ids go into "
                                  "response headers and logs)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::ordered_json> ParseTools(std::string_view tools_json) {
  absl::StatusOr<nlohmann::ordered_json> parsed = ParseOrderedJson(tools_json, "tools");
  if (!parsed.ok()) return parsed.status();
  nlohmann::ordered_json& tools = *parsed;
  if (!tools.is_array()) return Invalid("tools", "must be an array");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = absl::StrCat("tools[", i, "]");
    const nlohmann::ordered_json& t = tools[i];
    if (!t.is_object()) return Invalid(field, "must be an object");
    if (t.value("type", nlohmann::ordered_json()) != "function") {
      return Invalid(field + ".type", "must be \"function\"");
    }
    for (const auto& [key, v] : t.items()) {
      if (key != "type" && key != "function") return Invalid(field + "." + key, "unknown field");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return Invalid(field + ".function", "must be an object");
    for (const auto& [key, v] : fn->items()) {
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        return Invalid(absl::StrCat(field, ".function.", key), "unknown field");
      }
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return Invalid(field + ".function.name", "required, a string");
    }
    const std::string n = name->get<std::string>();
    const bool ok_name =
        !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
        });
    if (!ok_name) {
      return Invalid(field + ".function.name", "must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
    }
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      return Invalid(field + ".function.name", absl::StrCat("'", n, "' is declared twice"));
    }
    names.push_back(n);
    if (auto d = fn->find("description"); d != fn->end() && !d->is_string() && !d->is_null()) {
      return Invalid(field + ".function.description", "must be a string");
    }
    if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null()) {
      if (!params->is_object()) return Invalid(field + ".function.parameters", "must be an object");
      if (params->contains("type") && (*params)["type"] != "object") {
        return Invalid(field + ".function.parameters.type", "must be \"object\"");
      }
    }
  }
  return std::move(tools);
}

namespace {

// The chat's tools parsed, nullopt when it has none.
absl::StatusOr<std::optional<nlohmann::ordered_json>> ChatTools(const v1::ChatMessages& chat) {
  if (chat.tools().empty()) return std::nullopt;
  absl::StatusOr<nlohmann::ordered_json> tools = ParseTools(chat.tools());
  if (!tools.ok()) return tools.status();
  return std::optional<nlohmann::ordered_json>(*std::move(tools));
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> RequestPreparer::EncodeChat(
    const v1::ChatMessages& chat) const {
  absl::StatusOr<std::optional<nlohmann::ordered_json>> tools = ChatTools(chat);
  if (!tools.ok()) return tools.status();
  return EncodeChat(chat, *tools ? &**tools : nullptr);
}

absl::StatusOr<std::vector<int32_t>> RequestPreparer::EncodeChat(
    const v1::ChatMessages& chat, const nlohmann::ordered_json* tools) const {
  std::vector<ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    if (absl::Status st = CheckUtf8(absl::StrCat("messages[", i, "].content"), m.content());
        !st.ok()) {
      return st;
    }
    ChatMessage msg;
    msg.role = m.role();
    msg.content = m.content();
    for (const v1::ToolCall& tc : m.tool_calls()) {
      msg.tool_calls.push_back({tc.id(), tc.name(), tc.arguments()});
    }
    msg.tool_call_id = m.tool_call_id();
    msg.name = m.name();
    msg.reasoning_content = m.reasoning_content();
    messages.push_back(std::move(msg));
  }
  // Ordered: the template writes the tools' JSON with keys as the client
  // gave them.
  absl::StatusOr<std::string> text = chat_template_->Render(messages, true, tools);
  if (!text.ok()) {
    // The template names the field itself ("messages[2].tool_calls[0]...:
    // why") when the fault is in one; keep that as the error's field.
    const std::string msg(text.status().message());
    const size_t colon = msg.find(": ");
    if (colon != std::string::npos &&
        (msg.rfind("messages[", 0) == 0 || msg.rfind("tools", 0) == 0)) {
      return Invalid(msg.substr(0, colon), msg.substr(colon + 2));
    }
    return Invalid("messages", msg);
  }
  // Templates that spell out their framing tokens (Llama's BOS, GLM's
  // prefix) must not get another; the plain one relies on the tokenizer's.
  const bool add_special = chat_template_->family() == ChatTemplateFamily::kPlain;
  auto ids = tokenizer_->Encode(*text, add_special);
  if (!ids.ok()) return Invalid("messages", std::string(ids.status().message()));
  return ids;
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> RequestPreparer::CompileConstraint(
    const v1::GenerateRequest& request, const nlohmann::ordered_json* tools) const {
  const v1::OutputConstraint& c = request.constraint();
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonObject: {
      if (!c.json_object()) break;
      grammar::GrammarBuilder b;
      return b.Build(b.Seq({OptionalSpace(b), b.JsonObject()}));
    }
    case v1::OutputConstraint::kJsonSchema: {
      absl::StatusOr<nlohmann::ordered_json> schema =
          ParseOrderedJson(c.json_schema(), "constraint.json_schema");
      if (!schema.ok()) return schema.status();
      grammar::GrammarBuilder b;
      absl::StatusOr<grammar::GrammarBuilder::Rule> value =
          b.JsonSchema(*schema, "constraint.json_schema");
      if (!value.ok()) return value.status();
      return b.Build(b.Seq({OptionalSpace(b), *value}));
    }
    case v1::OutputConstraint::kToolCalls:
    case v1::OutputConstraint::kToolFunction: {
      if (c.kind_case() == v1::OutputConstraint::kToolCalls && !c.tool_calls()) break;
      if (tools == nullptr)
        return Invalid("constraint", "tool calls need a chat prompt with tools");
      return ToolCallGrammar(chat_template_->tool_format(), *tools, c.tool_function(),
                             c.single_tool_call());
    }
    case v1::OutputConstraint::KIND_NOT_SET:
      break;
  }
  return Invalid("constraint", "no constraint kind set");
}

absl::StatusOr<v1::TokenizeResponse> RequestPreparer::Tokenize(const v1::TokenizeRequest& request,
                                                               const ModelDescription* m) const {
  if (!request.model().empty() && m && request.model() != m->model_id) {
    return UnknownModelError(request.model(), m->model_id);
  }
  absl::StatusOr<std::vector<int32_t>> ids;
  if (request.input_case() == v1::TokenizeRequest::kChat) {
    ids = EncodeChat(request.chat());
  } else {
    if (absl::Status st = CheckUtf8("text", request.text()); !st.ok()) return st;
    ids = tokenizer_->Encode(request.text(), request.add_special_tokens());
    if (!ids.ok()) return Invalid("text", std::string(ids.status().message()));
  }
  if (!ids.ok()) return ids.status();
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids->begin(), ids->end());
  response.set_max_context_tokens(m ? m->max_context_tokens : 0);
  return response;
}

absl::StatusOr<PreparedRequest> RequestPreparer::Prepare(const v1::GenerateRequest& request,
                                                         const ModelDescription& model) const {
  const ModelDescription* m = &model;
  if (!request.model().empty() && request.model() != m->model_id) {
    return UnknownModelError(request.model(), m->model_id);
  }
  PreparedRequest p;
  // Parsed once for the template and the tool-call grammar.
  std::optional<nlohmann::ordered_json> tools;
  if (request.prompt_case() == v1::GenerateRequest::kChat) {
    absl::StatusOr<std::optional<nlohmann::ordered_json>> t = ChatTools(request.chat());
    if (!t.ok()) return t.status();
    tools = *std::move(t);
  }
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= m->vocab_size) {
          return Invalid(
              absl::StrCat("prompt.token_ids[", i, "]"),
              absl::StrCat(ids[i], " is outside the vocabulary [0, ", m->vocab_size, ")"));
        }
      }
      p.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      auto ids = EncodeChat(request.chat(), tools ? &*tools : nullptr);
      if (!ids.ok()) return ids.status();
      p.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kText:
    case v1::GenerateRequest::PROMPT_NOT_SET: {
      if (absl::Status st = CheckUtf8("prompt.text", request.text()); !st.ok()) return st;
      auto ids = tokenizer_->Encode(request.text(), /*add_special_tokens=*/true);
      if (!ids.ok()) return Invalid("prompt.text", std::string(ids.status().message()));
      p.prompt = std::move(*ids);
      break;
    }
  }
  if (p.prompt.empty()) {
    return Invalid("prompt", "empty, and the model's tokenizer adds no BOS token to start from");
  }
  const int64_t len = static_cast<int64_t>(p.prompt.size());
  if (len >= m->max_context_tokens) {
    return Invalid("prompt",
                   absl::StrCat(len, " tokens leave no room to generate in the context of ",
                                m->max_context_tokens, " tokens"));
  }

  // Sampling: the same ranges the workers' sampler enforces, checked here so
  // that the client learns which field is wrong.
  const v1::SamplingParams& s = request.sampling();
  const float temperature = s.has_temperature() ? s.temperature() : options_.default_temperature;
  if (!(std::isfinite(temperature) && temperature >= 0)) {
    return Invalid("sampling.temperature",
                   absl::StrCat("must be finite and >= 0, got ", temperature));
  }
  const float top_p = s.has_top_p() ? s.top_p() : 1.0f;
  if (!(top_p > 0 && top_p <= 1)) {
    return Invalid("sampling.top_p", absl::StrCat("must be in (0, 1], got ", top_p));
  }
  if (s.top_k() < 0)
    return Invalid("sampling.top_k", absl::StrCat("must be >= 0, got ", s.top_k()));
  if (!(s.min_p() >= 0 && s.min_p() <= 1)) {
    return Invalid("sampling.min_p", absl::StrCat("must be in [0, 1], got ", s.min_p()));
  }
  // Penalty and top_logprobs bounds are the workers' (WorkerInfo.limits).
  const float max_penalty = m->limits.max_abs_penalty();
  if (!(s.presence_penalty() >= -max_penalty && s.presence_penalty() <= max_penalty)) {
    return Invalid("sampling.presence_penalty",
                   absl::StrCat("must be in [", -max_penalty, ", ", max_penalty, "], got ",
                                s.presence_penalty()));
  }
  if (!(s.frequency_penalty() >= -max_penalty && s.frequency_penalty() <= max_penalty)) {
    return Invalid("sampling.frequency_penalty",
                   absl::StrCat("must be in [", -max_penalty, ", ", max_penalty, "], got ",
                                s.frequency_penalty()));
  }
  if (s.top_logprobs() < 0 || s.top_logprobs() > m->limits.max_top_logprobs()) {
    return Invalid(
        "sampling.top_logprobs",
        absl::StrCat("must be in [0, ", m->limits.max_top_logprobs(), "], got ", s.top_logprobs()));
  }
  if (request.n() < 0 || request.n() > options_.max_choices) {
    return Invalid("n",
                   absl::StrCat("must be in [1, ", options_.max_choices, "], got ", request.n()));
  }
  p.n = request.n() == 0 ? 1 : request.n();
  if (request.has_max_tokens() && request.max_tokens() <= 0) {
    return Invalid("max_tokens", absl::StrCat("must be >= 1, got ", request.max_tokens()));
  }
  const int64_t room = m->max_context_tokens - len;
  // An explicit max_tokens the context cannot hold is the client's mistake
  // (as in vLLM); silently generating fewer would look like a model stop.
  if (request.has_max_tokens() && request.max_tokens() > room) {
    return Invalid("max_tokens",
                   absl::StrCat(request.max_tokens(), " tokens after a prompt of ", len,
                                " tokens exceed the model's context of ", m->max_context_tokens,
                                " tokens (at most ", room, " can be generated)"));
  }
  int64_t max_tokens = request.has_max_tokens()          ? request.max_tokens()
                       : options_.max_tokens_default > 0 ? options_.max_tokens_default
                                                         : room;
  p.max_tokens = static_cast<int>(std::min(max_tokens, room));

  if (request.stop_size() > options_.max_stop_strings) {
    return Invalid("stop", absl::StrCat("at most ", options_.max_stop_strings,
                                        " stop strings, got ", request.stop_size()));
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    if (request.stop(i).size() > options_.max_stop_bytes) {
      return Invalid(absl::StrCat("stop[", i, "]"),
                     absl::StrCat(request.stop(i).size(), " bytes; at most ",
                                  options_.max_stop_bytes, " (--max_stop_bytes)"));
    }
    if (absl::Status st = CheckUtf8(absl::StrCat("stop[", i, "]"), request.stop(i)); !st.ok()) {
      return st;
    }
  }
  p.stop.assign(request.stop().begin(), request.stop().end());
  if (auto sm = StopMatcher::Create(p.stop); !sm.ok()) {
    return Invalid("stop", std::string(sm.status().message()));
  }
  if (request.stop_token_ids_size() > options_.max_stop_token_ids) {
    return Invalid("stop_token_ids", absl::StrCat("at most ", options_.max_stop_token_ids,
                                                  " ids, got ", request.stop_token_ids_size()));
  }
  p.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  if (auto st = StopTokens::Create(p.stop_token_ids, {}, false, m->vocab_size); !st.ok()) {
    return Invalid("stop_token_ids", std::string(st.status().message()));
  }
  p.ignore_eos = request.ignore_eos();
  p.default_temperature = !s.has_temperature();
  p.loop_watchdog = request.has_loop_watchdog() ? request.loop_watchdog() : options_.loop_watchdog;
  p.speculative = !request.has_speculative() || request.speculative();
  if (request.has_max_drafts()) {
    if (request.max_drafts() < 0 || request.max_drafts() > kMaxDraftsPerStep) {
      return Invalid("max_drafts", absl::StrCat("must be in [0, ", kMaxDraftsPerStep, "], got ",
                                                request.max_drafts()));
    }
    p.max_drafts = request.max_drafts();
  }
  if (s.logit_bias_size() > kMaxLogitBiasTokens) {
    return Invalid("sampling.logit_bias", absl::StrCat("at most ", kMaxLogitBiasTokens,
                                                       " tokens, got ", s.logit_bias_size()));
  }
  const float max_bias = m->limits.max_abs_logit_bias();
  for (const auto& [token, bias] : s.logit_bias()) {
    const std::string field = absl::StrCat("sampling.logit_bias[", token, "]");
    if (token < 0 || token >= m->vocab_size) {
      return Invalid(field, absl::StrCat("token ", token, " is outside the vocabulary [0, ",
                                         m->vocab_size, ")"));
    }
    if (!(bias >= -max_bias && bias <= max_bias)) {
      return Invalid(field,
                     absl::StrCat("must be in [-", max_bias, ", ", max_bias, "], got ", bias));
    }
  }
  if (request.has_constraint()) {
    absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g =
        CompileConstraint(request, tools ? &*tools : nullptr);
    if (!g.ok()) return g.status();
    p.grammar = *std::move(g);
    if (request.ignore_eos()) {
      return Invalid("ignore_eos",
                     "cannot be combined with a grammar constraint, which ends "
                     "the output where the grammar does");
    }
  }
  p.logprobs = request.logprobs() || s.logprobs() || s.top_logprobs() > 0;
  p.echo = request.echo();
  if (request.session_id().size() > options_.max_session_id_bytes) {
    return Invalid("session_id",
                   absl::StrCat(request.session_id().size(), " bytes; at most ",
                                options_.max_session_id_bytes, " (--max_session_id_bytes)"));
  }
  p.session_id = request.session_id();
  if (!request.request_id().empty()) {
    if (absl::Status st =
            CheckRequestId("request_id", request.request_id(), options_.max_request_id_bytes);
        !st.ok()) {
      return st;
    }
  }
  p.request_id = request.request_id().empty() ? absl::StrCat("req-", next_request_id_.fetch_add(1))
                                              : request.request_id();

  p.sampling = s;
  p.sampling.set_temperature(temperature);
  p.sampling.set_top_p(top_p);
  p.sampling.set_logprobs(p.logprobs);
  SeedParams sp;
  sp.temperature = temperature;
  sp.top_k = s.top_k();
  sp.top_p = top_p;
  sp.min_p = s.min_p();
  sp.presence_penalty = s.presence_penalty();
  sp.frequency_penalty = s.frequency_penalty();
  p.sampling.set_seed(ResolveSeed(s.has_seed() ? std::optional<uint64_t>(s.seed()) : std::nullopt,
                                  options_.seed_policy, p.prompt, sp, [] {
                                    std::random_device rd;
                                    return (static_cast<uint64_t>(rd()) << 32) | rd();
                                  }));
  return p;
}

}  // namespace ringlane::router
