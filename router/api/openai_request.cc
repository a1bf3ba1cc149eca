#include "router/api/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_json.h"
#include "router/grammar/grammar.h"
#include "router/request/json_text.h"
#include "router/request/prepare.h"

namespace ringlane::router::openai {

namespace v1 = ringlane::v1;
using internal::Bad;
using internal::Bool;
using internal::Int32;
using internal::Integer;
using internal::Number;
using internal::ParseObject;
using internal::String;
using internal::TypeName;
using internal::WrongType;
using nlohmann::json;

namespace {

// Fields of OpenAI's API (or common extensions) not implemented here: named
// in the 400, so that a client knows it was not ignored.
const std::set<std::string>& UnsupportedFields() {
  static const auto* f = new std::set<std::string>{"functions",
                                                   "function_call",
                                                   "suffix",
                                                   "best_of",
                                                   "audio",
                                                   "modalities",
                                                   "prediction",
                                                   "reasoning_effort",
                                                   "web_search_options",
                                                   "guided_json",
                                                   "guided_regex",
                                                   "guided_choice",
                                                   "guided_grammar",
                                                   "repetition_penalty",
                                                   "length_penalty",
                                                   "use_beam_search",
                                                   "min_tokens",
                                                   "skip_special_tokens",
                                                   "spaces_between_special_tokens",
                                                   "truncate_prompt_tokens",
                                                   "prompt_logprobs",
                                                   "include_stop_str_in_output",
                                                   "add_generation_prompt",
                                                   "continue_final_message",
                                                   "chat_template",
                                                   "chat_template_kwargs",
                                                   "documents",
                                                   "service_tier",
                                                   "store",
                                                   "metadata"};
  return *f;
}

// Unsupported fields whose value is harmless when it is the default.
bool IsDefaultValue(const std::string& key, const json& v) {
  if (key == "best_of") return v.is_number() && v.get<double>() == 1;
  if (key == "logit_bias" || key == "metadata") return v.is_object() && v.empty();
  if (key == "tools" || key == "functions") return v.is_array() && v.empty();
  if (key == "suffix") return v.is_string() && v.get<std::string>().empty();
  if (key == "store" || key == "parallel_tool_calls") return v.is_boolean() && !v.get<bool>();
  if (key == "tool_choice") return v.is_string() && v.get<std::string>() == "none";
  if (key == "response_format") {
    return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text";
  }
  return false;
}

absl::Status ParseStop(const json& v, v1::GenerateRequest* r) {
  if (v.is_string()) {
    r->add_stop(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return WrongType("stop", "a string or an array of strings", v);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return WrongType(absl::StrCat("stop[", i, "]"), "a string", v[i]);
    r->add_stop(v[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const json& v, std::string_view field) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StatusOr<int32_t> id = Int32(v[i], absl::StrCat(std::string(field), "[", i, "]"), 0,
                                       std::numeric_limits<int32_t>::max());
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  return ids;
}

// prompt: a string, a list of strings, a list of token ids, or a list of
// lists of token ids.
absl::StatusOr<std::vector<v1::GenerateRequest>> ParsePrompts(const json& v) {
  std::vector<v1::GenerateRequest> out;
  if (v.is_string()) {
    out.emplace_back().set_text(v.get<std::string>());
    return out;
  }
  if (!v.is_array() || v.empty()) {
    return Bad("prompt", v.is_array()
                             ? "empty list"
                             : absl::StrCat("expected a string, a list of strings or of token "
                                            "ids, got ",
                                            TypeName(v)));
  }
  if (v[0].is_number()) {
    absl::StatusOr<std::vector<int32_t>> ids = TokenIds(v, "prompt");
    if (!ids.ok()) return ids.status();
    out.emplace_back().mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
    return out;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = absl::StrCat("prompt[", i, "]");
    if (v[i].is_string()) {
      out.emplace_back().set_text(v[i].get<std::string>());
    } else if (v[i].is_array() && !v[i].empty()) {
      absl::StatusOr<std::vector<int32_t>> ids = TokenIds(v[i], field);
      if (!ids.ok()) return ids.status();
      out.emplace_back().mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
    } else {
      return WrongType(field, "a string or a non-empty list of token ids", v[i]);
    }
  }
  return out;
}

// A count of alternatives per token: an integer in [0, api_max], and within
// what the workers return when that is known (limits.max_top_logprobs).
absl::StatusOr<int32_t> LogprobCount(const json& v, std::string_view field, int64_t api_max,
                                     const RequestLimits& limits) {
  absl::StatusOr<int64_t> i = Integer(v, field);
  if (!i.ok()) return i.status();
  const int64_t hi =
      limits.max_top_logprobs >= 0 ? std::min<int64_t>(api_max, limits.max_top_logprobs) : api_max;
  if (*i >= 0 && *i <= hi) return static_cast<int32_t>(*i);
  if (hi == std::numeric_limits<int32_t>::max()) {
    return Bad(field, *i < 0 ? absl::StrCat("must be >= 0, got ", *i) : "out of range");
  }
  return Bad(field, absl::StrCat("must be in [0, ", hi, "], got ", *i));
}

// response_format: text, json_object, or json_schema {name, schema,
// strict?, description?}. The schema is compiled here once so that an
// unsupported keyword is a 400 naming its place under the OpenAI field.
// `raw`: the member's text in the body, for the schema's key order.
absl::Status ParseResponseFormat(const json& v, std::string_view raw, v1::GenerateRequest* r) {
  if (!v.is_object()) return WrongType("response_format", "an object", v);
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return Bad("response_format.type", "required: \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  for (const auto& [key, val] : v.items()) {
    if (key != "type" && !(t == "json_schema" && key == "json_schema")) {
      return Bad(absl::StrCat("response_format.", key), "unknown field");
    }
  }
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    r->mutable_constraint()->set_json_object(true);
    return absl::OkStatus();
  }
  if (t != "json_schema") {
    return Bad("response_format.type",
               absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", got \"",
                            t.substr(0, 64), "\""));
  }
  auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object()) {
    return Bad("response_format.json_schema", "required, an object");
  }
  for (const auto& [key, val] : js->items()) {
    if (val.is_null()) continue;
    const std::string field = absl::StrCat("response_format.json_schema.", key);
    if (key == "name") {
      if (!val.is_string() || val.get<std::string>().empty() ||
          val.get<std::string>().size() > 64) {
        return Bad(field, "must be a string of 1 to 64 characters");
      }
    } else if (key == "strict") {
      if (!val.is_boolean()) return WrongType(field, "a boolean", val);
    } else if (key == "description") {
      if (!val.is_string()) return WrongType(field, "a string", val);
    } else if (key != "schema") {
      return Bad(field, "unknown field");
    }
  }
  if (!js->contains("name")) return Bad("response_format.json_schema.name", "required");
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) {
    // No schema: any JSON object, as vLLM does.
    r->mutable_constraint()->set_json_object(true);
    return absl::OkStatus();
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return WrongType("response_format.json_schema.schema", "an object", *schema);
  }
  std::optional<std::string_view> text = MemberText(raw, "json_schema");
  if (text) text = MemberText(*text, "schema");
  if (!text) return Bad("response_format.json_schema.schema", "could not be read");
  absl::StatusOr<nlohmann::ordered_json> ordered =
      ParseOrderedJson(*text, "response_format.json_schema.schema");
  if (!ordered.ok()) return ordered.status();
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g =
      grammar::JsonSchemaGrammar(*ordered, "response_format.json_schema.schema");
  if (!g.ok()) return g.status();
  r->mutable_constraint()->set_json_schema(ordered->dump());
  return absl::OkStatus();
}

// logit_bias: {"token id": bias}; OpenAI keys are decimal strings.
absl::Status ParseLogitBias(const json& v, const RequestLimits& limits, v1::SamplingParams* s) {
  if (!v.is_object()) return WrongType("logit_bias", "an object of token id to bias", v);
  if (v.size() > static_cast<size_t>(kMaxLogitBiasTokens)) {
    return Bad("logit_bias",
               absl::StrCat("at most ", kMaxLogitBiasTokens, " tokens, got ", v.size()));
  }
  for (const auto& [key, val] : v.items()) {
    const std::string field = absl::StrCat("logit_bias.", key.substr(0, 32));
    int64_t id = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return Bad(field, "keys must be token ids (decimal integers)");
    }
    absl::StatusOr<double> b = Number(val, field);
    if (!b.ok()) return b.status();
    const double max = limits.max_abs_logit_bias >= 0 ? limits.max_abs_logit_bias
                                                      : std::numeric_limits<float>::max();
    if (!(std::abs(*b) <= max)) {
      return Bad(field, absl::StrCat("must be in [-", max, ", ", max, "], got ", *b));
    }
    (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(*b);
  }
  return absl::OkStatus();
}

// tool_choice: "none", "auto", "required" or {"type": "function",
// "function": {"name": N}}; the name is checked against tools later.
absl::Status ParseToolChoice(const json& v, ParsedRequest* p) {
  if (v.is_string()) {
    const std::string c = v.get<std::string>();
    if (c != "none" && c != "auto" && c != "required") {
      return Bad("tool_choice", absl::StrCat("must be \"none\", \"auto\", \"required\" or a "
                                             "function, got \"",
                                             c.substr(0, 64), "\""));
    }
    p->tool_choice = c;
    return absl::OkStatus();
  }
  if (!v.is_object()) return WrongType("tool_choice", "a string or an object", v);
  if (v.value("type", json()) != "function") return Bad("tool_choice.type", "must be \"function\"");
  auto fn = v.find("function");
  if (fn == v.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
    return Bad("tool_choice.function.name", "required, a string");
  }
  p->tool_choice = "function";
  p->tool_function = (*fn)["name"].get<std::string>();
  return absl::OkStatus();
}

// An assistant message's tool_calls: [{id, type: "function", function:
// {name, arguments: JSON text}}].
absl::Status ParseToolCalls(const json& v, const std::string& field, v1::ChatMessage* msg) {
  if (!v.is_array()) return WrongType(field, "an array", v);
  for (size_t k = 0; k < v.size(); ++k) {
    const std::string f = absl::StrCat(field, "[", k, "]");
    const json& c = v[k];
    if (!c.is_object()) return WrongType(f, "an object", c);
    if (c.contains("type") && c["type"] != "function")
      return Bad(f + ".type", "must be \"function\"");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return Bad(f + ".function", "required, an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
      return Bad(f + ".function.name", "required, a string");
    }
    v1::ToolCall* tc = msg->add_tool_calls();
    tc->set_name(name->get<std::string>());
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return WrongType(f + ".id", "a string", *id);
      tc->set_id(id->get<std::string>());
    }
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      tc->set_arguments("{}");
    } else if (args->is_string()) {
      // Clients send what the API returned: JSON text of an object.
      const json parsed = json::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) {
        return Bad(f + ".function.arguments", "must be JSON text of an object");
      }
      tc->set_arguments(args->get<std::string>());
    } else if (args->is_object()) {
      tc->set_arguments(args->dump());
    } else {
      return WrongType(f + ".function.arguments", "a string of JSON", *args);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ChatMessages> ParseMessages(const json& v) {
  if (!v.is_array()) return WrongType("messages", "an array", v);
  if (v.empty()) return Bad("messages", "empty list");
  v1::ChatMessages out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    const json& m = v[i];
    if (!m.is_object()) return WrongType(field, "an object", m);
    v1::ChatMessage* msg = out.add_messages();
    for (const auto& [key, val] : m.items()) {
      if (val.is_null()) continue;
      if (key == "role") {
        absl::StatusOr<std::string> role = String(val, field + ".role");
        if (!role.ok()) return role.status();
        // OpenAI's "developer" messages are the system messages of older
        // models.
        msg->set_role(*role == "developer" ? "system" : *role);
      } else if (key == "content") {
        if (val.is_string()) {
          msg->set_content(val.get<std::string>());
        } else if (val.is_array()) {
          std::string text;
          for (size_t k = 0; k < val.size(); ++k) {
            const std::string part = absl::StrCat(field, ".content[", k, "]");
            const json& p = val[k];
            if (!p.is_object() || !p.contains("type") || p["type"] != "text" ||
                !p.contains("text") || !p["text"].is_string()) {
              return Bad(part, "only {\"type\": \"text\", \"text\": ...} parts are supported");
            }
            text += p["text"].get<std::string>();
          }
          msg->set_content(text);
        } else {
          return WrongType(field + ".content", "a string or an array of text parts", val);
        }
      } else if (key == "name") {
        absl::StatusOr<std::string> n = String(val, field + ".name");
        if (!n.ok()) return n.status();
        msg->set_name(*n);
      } else if (key == "tool_calls") {
        if (absl::Status st = ParseToolCalls(val, field + ".tool_calls", msg); !st.ok()) return st;
      } else if (key == "tool_call_id") {
        absl::StatusOr<std::string> id = String(val, field + ".tool_call_id");
        if (!id.ok()) return id.status();
        msg->set_tool_call_id(*id);
      } else if (key == "reasoning_content") {
        absl::StatusOr<std::string> r = String(val, field + ".reasoning_content");
        if (!r.ok()) return r.status();
        msg->set_reasoning_content(*r);
      } else {
        return Bad(absl::StrCat(field, ".", key), "not supported");
      }
    }
    if (msg->role().empty()) return Bad(field + ".role", "required");
    // Participant names have no place in the built-in templates; a tool
    // message's name is the tool's.
    if (!msg->name().empty() && msg->role() != "tool") return Bad(field + ".name", "not supported");
    if (msg->tool_calls_size() > 0 && msg->role() != "assistant") {
      return Bad(field + ".tool_calls", "only assistant messages carry tool calls");
    }
    if (msg->role() == "tool" && msg->tool_call_id().empty()) {
      return Bad(field + ".tool_call_id", "required for a tool message");
    }
    if (!msg->tool_call_id().empty() && msg->role() != "tool") {
      return Bad(field + ".tool_call_id", "only tool messages answer a tool call");
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           std::string_view session_header,
                                           const RequestLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;

  ParsedRequest p;
  p.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  v1::GenerateRequest base;
  v1::SamplingParams* s = base.mutable_sampling();
  std::vector<std::string> unsupported;
  std::vector<std::string> unknown;
  bool has_prompt = false;
  std::vector<v1::GenerateRequest> prompts;
  bool have_max_tokens = false;
  json logprobs_value;       // read after the loop: its meaning depends on the endpoint
  bool tools_given = false;  // read from the body's text after the loop
  json top_logprobs_value;

  for (const auto& item : j.items()) {
    // References rather than a structured binding: clang 14 cannot capture
    // a binding in the lambda below.
    const std::string& key = item.key();
    const json& v = item.value();
    if (v.is_null()) continue;
    absl::Status st;
    auto num = [&](auto set) {
      absl::StatusOr<double> d = Number(v, key);
      if (!d.ok()) return d.status();
      // A double beyond float's range has no float value (undefined
      // behaviour to convert); the router's own range checks are narrower.
      if (!(std::abs(*d) <= std::numeric_limits<float>::max())) {
        return Bad(key, absl::StrCat("out of range, got ", *d));
      }
      set(static_cast<float>(*d));
      return absl::OkStatus();
    };
    if (key == "model") {
      absl::StatusOr<std::string> m = String(v, key);
      if (!m.ok()) return m.status();
      if (m->size() > limits.max_string_bytes) {
        return Bad(key, absl::StrCat("longer than ", limits.max_string_bytes, " bytes"));
      }
      p.model = *m;
      base.set_model(*m);
    } else if (!chat && key == "prompt") {
      absl::StatusOr<std::vector<v1::GenerateRequest>> ps = ParsePrompts(v);
      if (!ps.ok()) return ps.status();
      prompts = std::move(*ps);
      has_prompt = true;
    } else if (chat && key == "messages") {
      absl::StatusOr<v1::ChatMessages> ms = ParseMessages(v);
      if (!ms.ok()) return ms.status();
      prompts.emplace_back();
      *prompts.back().mutable_chat() = std::move(*ms);
      has_prompt = true;
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      absl::StatusOr<int64_t> m = Integer(v, key);
      if (!m.ok()) return m.status();
      if (*m < 1) return Bad(key, absl::StrCat("must be >= 1, got ", *m));
      // Larger than any context: the router names the real limit.
      base.set_max_tokens(
          static_cast<int32_t>(std::min<int64_t>(*m, std::numeric_limits<int32_t>::max())));
      have_max_tokens = true;
    } else if (key == "temperature") {
      st = num([&](float f) { s->set_temperature(f); });
    } else if (key == "top_p") {
      st = num([&](float f) { s->set_top_p(f); });
    } else if (key == "min_p") {
      st = num([&](float f) { s->set_min_p(f); });
    } else if (key == "presence_penalty") {
      st = num([&](float f) { s->set_presence_penalty(f); });
    } else if (key == "frequency_penalty") {
      st = num([&](float f) { s->set_frequency_penalty(f); });
    } else if (key == "top_k") {
      // vLLM's -1 means no limit, as 0 does here.
      absl::StatusOr<int32_t> k = Int32(v, key, -1, std::numeric_limits<int32_t>::max());
      if (!k.ok()) return k.status();
      s->set_top_k(std::max(0, *k));
    } else if (key == "seed") {
      absl::StatusOr<int64_t> seed = Integer(v, key);
      if (!seed.ok()) return seed.status();
      s->set_seed(static_cast<uint64_t>(*seed));
    } else if (key == "stop") {
      st = ParseStop(v, &base);
      for (int i = 0; st.ok() && i < base.stop_size(); ++i) {
        if (base.stop(i).size() > limits.max_stop_bytes) {
          st = Bad(v.is_string() ? "stop" : absl::StrCat("stop[", i, "]"),
                   absl::StrCat(base.stop(i).size(), " bytes; at most ", limits.max_stop_bytes,
                                " (--max_stop_bytes)"));
        }
      }
    } else if (key == "stop_token_ids") {
      if (!v.is_array()) return WrongType(key, "an array of token ids", v);
      absl::StatusOr<std::vector<int32_t>> ids = TokenIds(v, key);
      if (!ids.ok()) return ids.status();
      base.mutable_stop_token_ids()->Add(ids->begin(), ids->end());
    } else if (key == "n") {
      absl::StatusOr<int32_t> n = Int32(v, key, 1, 1 << 20);
      if (!n.ok()) return n.status();
      p.n = *n;
      base.set_n(*n);
    } else if (key == "stream") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      p.stream = *b;
    } else if (key == "stream_options") {
      if (!v.is_object()) return WrongType(key, "an object", v);
      for (const auto& [k2, v2] : v.items()) {
        if (v2.is_null()) continue;
        if (k2 != "include_usage") return Bad(absl::StrCat(key, ".", k2), "not supported");
        absl::StatusOr<bool> b = Bool(v2, "stream_options.include_usage");
        if (!b.ok()) return b.status();
        p.include_usage = *b;
      }
    } else if (key == "logprobs") {
      logprobs_value = v;
    } else if (chat && key == "top_logprobs") {
      top_logprobs_value = v;
    } else if (!chat && key == "echo") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      p.echo = *b;
      base.set_echo(*b);
    } else if (key == "user") {
      absl::StatusOr<std::string> u = String(v, key);
      if (!u.ok()) return u.status();
      if (u->size() > limits.max_string_bytes) {
        return Bad(key, absl::StrCat("longer than ", limits.max_string_bytes, " bytes"));
      }
      p.user = *u;
    } else if (key == "prompt_cache_key" || key == "session_id") {
      absl::StatusOr<std::string> k = String(v, key);
      if (!k.ok()) return k.status();
      if (k->size() > limits.max_session_id_bytes) {
        return Bad(key, absl::StrCat(k->size(), " bytes; at most ", limits.max_session_id_bytes,
                                     " (--max_session_id_bytes)"));
      }
      base.set_session_id(*k);
    } else if (key == "request_id") {
      absl::StatusOr<std::string> k = String(v, key);
      if (!k.ok()) return k.status();
      if (k->size() > limits.max_request_id_bytes) {
        return Bad(key, absl::StrCat(k->size(), " bytes; at most ", limits.max_request_id_bytes,
                                     " (--max_request_id_bytes)"));
      }
      base.set_request_id(*k);
    } else if (key == "ignore_eos") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      base.set_ignore_eos(*b);
    } else if (key == "loop_watchdog") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      base.set_loop_watchdog(*b);
    } else if (key == "response_format") {
      std::optional<std::string_view> raw = MemberText(body, key);
      if (!raw) return Bad(key, "could not be read");
      st = ParseResponseFormat(v, *raw, &base);
    } else if (key == "logit_bias") {
      st = ParseLogitBias(v, limits, s);
    } else if (chat && key == "tools") {
      if (!v.is_array()) return WrongType(key, "an array", v);
      tools_given = !v.empty();
    } else if (chat && key == "tool_choice") {
      st = ParseToolChoice(v, &p);
    } else if (chat && key == "parallel_tool_calls") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      p.parallel_tool_calls = *b;
    } else if (key == "tools" || key == "tool_choice" || key == "parallel_tool_calls") {
      return Bad(key, "only /v1/chat/completions calls tools");
    } else if (key == "speculative") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      base.set_speculative(*b);
    } else if (key == "speculative.n_max") {
      // llama.cpp server's name for the per-request draft limit.
      absl::StatusOr<int32_t> k = Int32(v, key, 0, kMaxDraftsPerStep);
      if (!k.ok()) return k.status();
      base.set_max_drafts(*k);
    } else if (UnsupportedFields().count(key) > 0 || (chat && (key == "prompt" || key == "echo")) ||
               (!chat && (key == "messages" || key == "max_completion_tokens"))) {
      if (!IsDefaultValue(key, v)) unsupported.push_back(key);
    } else {
      unknown.push_back(key);
    }
    if (!st.ok()) return st;
  }
  if (!unsupported.empty()) {
    return Bad(unsupported.front(),
               absl::StrCat(unsupported.size() == 1 ? "this field is" : "these fields are",
                            " not supported by this server: ", absl::StrJoin(unsupported, ", ")));
  }
  if (!unknown.empty()) {
    return Bad(unknown.front(), absl::StrCat("unknown field", unknown.size() == 1 ? "" : "s", ": ",
                                             absl::StrJoin(unknown, ", ")));
  }
  if (!has_prompt) return Bad(chat ? "messages" : "prompt", "required");
  if (tools_given) {
    // From the body's text: the template shows each schema as written.
    std::optional<std::string_view> raw = MemberText(body, "tools");
    if (!raw) return Bad("tools", "could not be read");
    absl::StatusOr<nlohmann::ordered_json> tools = ParseTools(*raw);
    if (!tools.ok()) return tools.status();
    p.tools = std::move(*tools);
    const std::string text = p.tools.dump();
    for (v1::GenerateRequest& r : prompts) r.mutable_chat()->set_tools(text);
  }
  if (p.tool_choice != "auto" && p.tool_choice != "none" && p.tools.is_null()) {
    return Bad("tool_choice", absl::StrCat("\"", p.tool_choice, "\" needs tools"));
  }
  if (p.tool_choice == "function") {
    bool found = false;
    for (const auto& t : p.tools) found = found || t["function"]["name"] == p.tool_function;
    if (!found) {
      return Bad("tool_choice.function.name",
                 absl::StrCat("'", p.tool_function.substr(0, 64), "' is not one of tools"));
    }
  }
  if (p.tool_choice == "required" || p.tool_choice == "function") {
    if (base.has_constraint()) {
      return Bad("response_format",
                 "cannot be combined with tool_choice \"required\" or a function");
    }
    if (p.tool_choice == "function") {
      base.mutable_constraint()->set_tool_function(p.tool_function);
    } else {
      base.mutable_constraint()->set_tool_calls(true);
      base.mutable_constraint()->set_single_tool_call(!p.parallel_tool_calls);
    }
  }
  if (p.model.empty()) return Bad("model", "required");
  if (p.include_usage && !p.stream) {
    return Bad("stream_options", "only allowed when stream is true");
  }
  // Every choice is a lane with its own KV blocks, stop matcher and
  // response: the product, not n or the prompt count alone, is what one
  // request multiplies.
  if (static_cast<int64_t>(prompts.size()) * p.n > limits.max_choices) {
    return Bad(prompts.size() > 1 ? "prompt" : "n",
               absl::StrCat(prompts.size(), " prompt(s) with n=", p.n, " make ",
                            static_cast<int64_t>(prompts.size()) * p.n, " choices; at most ",
                            limits.max_choices, " per request (--max_choices_per_request)"));
  }
  if (base.stop_size() > kMaxStopSequences) {
    return Bad("stop", absl::StrCat("at most ", kMaxStopSequences, " stop sequences, got ",
                                    base.stop_size()));
  }

  // logprobs: chat takes a boolean and top_logprobs up to what the workers
  // return; completions an integer up to kCompletionsMaxLogprobs that is
  // also the number of alternatives.
  if (chat) {
    if (!logprobs_value.is_null()) {
      absl::StatusOr<bool> b = Bool(logprobs_value, "logprobs");
      if (!b.ok()) return b.status();
      p.logprobs = *b;
    }
    if (!top_logprobs_value.is_null()) {
      absl::StatusOr<int32_t> t = LogprobCount(top_logprobs_value, "top_logprobs",
                                               std::numeric_limits<int32_t>::max(), limits);
      if (!t.ok()) return t.status();
      if (!p.logprobs) return Bad("top_logprobs", "requires logprobs to be true");
      p.top_logprobs = *t;
    }
  } else if (!logprobs_value.is_null()) {
    absl::StatusOr<int32_t> t =
        LogprobCount(logprobs_value, "logprobs", kCompletionsMaxLogprobs, limits);
    if (!t.ok()) return t.status();
    p.logprobs = true;
    p.top_logprobs = *t;
  }
  if (p.logprobs && p.echo) {
    return Bad("echo",
               "echo with logprobs would need the prompt's logprobs, which this server "
               "does not compute");
  }
  base.set_logprobs(p.logprobs);
  s->set_logprobs(p.logprobs);
  s->set_top_logprobs(p.top_logprobs);
  if (!chat && !have_max_tokens) base.set_max_tokens(kCompletionsDefaultMaxTokens);
  if (base.session_id().empty() && !session_header.empty()) {
    if (session_header.size() > limits.max_session_id_bytes) {
      return Bad("X-Session-Id", absl::StrCat(session_header.size(), " bytes; at most ",
                                              limits.max_session_id_bytes));
    }
    base.set_session_id(std::string(session_header));
  }

  for (size_t i = 0; i < prompts.size(); ++i) {
    v1::GenerateRequest r = base;
    if (prompts[i].has_chat()) {
      *r.mutable_chat() = std::move(*prompts[i].mutable_chat());
    } else if (prompts[i].has_token_ids()) {
      *r.mutable_token_ids() = std::move(*prompts[i].mutable_token_ids());
    } else {
      r.set_text(prompts[i].text());
    }
    if (prompts.size() > 1 && !r.request_id().empty()) {
      r.set_request_id(absl::StrCat(r.request_id(), "-", i));
    }
    p.prompts.push_back(std::move(r));
  }
  return p;
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                         const RequestLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.status();
  v1::TokenizeRequest r;
  r.set_add_special_tokens(true);
  bool has_input = false;
  for (const auto& [key, v] : parsed->items()) {
    if (v.is_null()) continue;
    if (key == "model") {
      absl::StatusOr<std::string> m = String(v, key);
      if (!m.ok()) return m.status();
      r.set_model(*m);
    } else if (key == "prompt") {
      absl::StatusOr<std::string> t = String(v, key);
      if (!t.ok()) return t.status();
      r.set_text(*t);
      has_input = true;
    } else if (key == "messages") {
      absl::StatusOr<v1::ChatMessages> ms = ParseMessages(v);
      if (!ms.ok()) return ms.status();
      *r.mutable_chat() = std::move(*ms);
      has_input = true;
    } else if (key == "add_special_tokens") {
      absl::StatusOr<bool> b = Bool(v, key);
      if (!b.ok()) return b.status();
      r.set_add_special_tokens(*b);
    } else {
      return Bad(key, "unknown field");
    }
  }
  if (!has_input) return Bad("prompt", "required (or messages)");
  return r;
}

absl::StatusOr<std::pair<std::string, std::vector<int32_t>>> ParseDetokenizeRequest(
    std::string_view body, const RequestLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.status();
  std::pair<std::string, std::vector<int32_t>> out;
  bool has_tokens = false;
  for (const auto& [key, v] : parsed->items()) {
    if (v.is_null()) continue;
    if (key == "model") {
      absl::StatusOr<std::string> m = String(v, key);
      if (!m.ok()) return m.status();
      out.first = *m;
    } else if (key == "tokens") {
      if (!v.is_array()) return WrongType(key, "an array of token ids", v);
      absl::StatusOr<std::vector<int32_t>> ids = TokenIds(v, key);
      if (!ids.ok()) return ids.status();
      out.second = std::move(*ids);
      has_tokens = true;
    } else {
      return Bad(key, "unknown field");
    }
  }
  if (!has_tokens) return Bad("tokens", "required");
  return out;
}

}  // namespace ringlane::router::openai
