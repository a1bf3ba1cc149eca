#include "router/request/chat_template.h"

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kQwen2DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
// Llama 3.1's template falls back to this date when the caller defines no
// date_string; transformers' apply_chat_template defines none for 3.1.
constexpr std::string_view kLlama31DateLines =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

// Debian's Abseil predates absl::string_view aliasing std::string_view, so
// StrCat takes std::string_view only through this.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Jinja's trim is Python's str.strip(), which strips every code point for
// which str.isspace() is true, not only ASCII blanks.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// Decodes the UTF-8 sequence at s[pos..pos+len); false when malformed, which
// the callers treat as "not a space" so invalid bytes are never trimmed.
bool DecodeAt(std::string_view s, size_t pos, size_t len, uint32_t* cp) {
  if (pos + len > s.size()) return false;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  if (len == 1) {
    if (b(0) >= 0x80) return false;
    *cp = b(0);
    return true;
  }
  const unsigned char lead_mask = len == 2 ? 0xe0 : len == 3 ? 0xf0 : 0xf8;
  const unsigned char lead_bits = len == 2 ? 0xc0 : len == 3 ? 0xe0 : 0xf0;
  if ((b(0) & lead_mask) != lead_bits) return false;
  uint32_t v = b(0) & (0x7f >> len);
  for (size_t i = 1; i < len; ++i) {
    if ((b(i) & 0xc0) != 0x80) return false;
    v = (v << 6) | (b(i) & 0x3f);
  }
  *cp = v;
  return true;
}

// Length of a whitespace code point starting at pos, or 0.
size_t SpaceAtFront(std::string_view s, size_t pos) {
  for (size_t len = 1; len <= 3; ++len) {
    uint32_t cp;
    if (DecodeAt(s, pos, len, &cp)) return IsPythonSpace(cp) ? len : 0;
  }
  return 0;
}

// Length of a whitespace code point ending at end, or 0.
size_t SpaceAtBack(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    uint32_t cp;
    if (DecodeAt(s, end - len, len, &cp)) return IsPythonSpace(cp) ? len : 0;
  }
  return 0;
}

std::string_view PythonStrip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t n = SpaceAtFront(s, begin);
    if (n == 0) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    const size_t n = SpaceAtBack(s.substr(0, end), end);
    if (n == 0) break;
    end -= n;
  }
  return s.substr(begin, end - begin);
}

// transformers replaces Jinja's tojson with json.dumps(ensure_ascii=False):
// keys in the order given, non-ASCII written raw, nothing HTML-escaped (Jinja's
// own filter would sort keys and write < as \u003c). Only these characters
// are escaped, as Python's encoder does.
void AppendPyJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          *out += "\\u00";
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// Python's float repr: the shortest digits that round-trip, fixed notation for
// decimal exponents -4..15 (always with a fractional part), else d.ddde+XX.
void AppendPyFloat(double d, std::string* out) {
  if (d == 0) {
    *out += std::signbit(d) ? "-0.0" : "0.0";
    return;
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  if (sci.front() == '-') {
    out->push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    const int n = static_cast<int>(digits.size());
    if (point <= 0) {
      absl::StrAppend(out, "0.", std::string(-point, '0'), digits);
    } else if (point >= n) {
      absl::StrAppend(out, digits, std::string(point - n, '0'), ".0");
    } else {
      absl::StrAppend(out, digits.substr(0, point), ".", digits.substr(point));
    }
    return;
  }
  out->push_back(digits[0]);
  if (digits.size() > 1) absl::StrAppend(out, ".", digits.substr(1));
  const int mag = std::abs(exp10);
  absl::StrAppend(out, exp10 < 0 ? "e-" : "e+", mag < 10 ? "0" : "", mag);
}

// json.dumps of v; indent < 0 is the one-line form (", " and ": "), else
// Python's indented form ("," ending each line, ": " after keys).
void AppendPyJson(const OrderedJson& v, int indent, int depth, std::string* out) {
  const auto newline = [&](int d) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case OrderedJson::value_t::object: {
      if (v.empty()) {
        *out += "{}";
        return;
      }
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) *out += sep;
        first = false;
        if (indent >= 0) newline(depth + 1);
        AppendPyJsonString(key, out);
        *out += ": ";
        AppendPyJson(value, indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out->push_back('}');
      return;
    }
    case OrderedJson::value_t::array: {
      if (v.empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      bool first = true;
      for (const OrderedJson& value : v) {
        if (!first) *out += sep;
        first = false;
        if (indent >= 0) newline(depth + 1);
        AppendPyJson(value, indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out->push_back(']');
      return;
    }
    case OrderedJson::value_t::string:
      AppendPyJsonString(v.get_ref<const std::string&>(), out);
      return;
    case OrderedJson::value_t::boolean:
      *out += v.get<bool>() ? "true" : "false";
      return;
    case OrderedJson::value_t::number_integer:
      absl::StrAppend(out, v.get<int64_t>());
      return;
    case OrderedJson::value_t::number_unsigned:
      absl::StrAppend(out, v.get<uint64_t>());
      return;
    case OrderedJson::value_t::number_float:
      AppendPyFloat(v.get<double>(), out);
      return;
    default:  // null (discarded values never reach here: parse failures are rejected)
      *out += "null";
      return;
  }
}

std::string PyJson(const OrderedJson& v, int indent = -1) {
  std::string out;
  AppendPyJson(v, indent, 0, &out);
  return out;
}

// A conversation checked against the family and with each tool call's
// arguments parsed (in call order, per message).
struct Conversation {
  absl::Span<const ChatMessage> messages;
  std::vector<std::vector<OrderedJson>> arguments;
  // Null when the request has no tools; may be an empty array.
  const OrderedJson* tools = nullptr;
  // Jinja's truthiness of tools: the Hermes and GLM templates test it.
  bool has_tools() const { return tools != nullptr && !tools->empty(); }
};

absl::Status CheckRoles(absl::Span<const ChatMessage> messages, std::string_view family,
                        absl::Span<const absl::string_view> roles) {
  if (messages.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", Sv(family), ": messages must not be empty"));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    bool known = false;
    for (absl::string_view r : roles) known = known || messages[i].role == r;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template ", Sv(family), ": messages[", i, "] has role \"", messages[i].role,
          "\"; this template renders only ", absl::StrJoin(roles, ", ")));
    }
  }
  return absl::OkStatus();
}

void AppendChatMl(const ChatMessage& m, std::string* out) {
  absl::StrAppend(out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
}

void AppendLlamaBlock(std::string_view role, std::string_view content, std::string* out) {
  absl::StrAppend(out, "<|start_header_id|>", Sv(role), "<|end_header_id|>\n\n", Sv(content),
                  "<|eot_id|>");
}

constexpr std::string_view kHermesToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kHermesToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call>";
constexpr std::string_view kPlainToolsIntro = "system: You may call these tools:\n";
constexpr std::string_view kPlainToolsOutro =
    "To call a tool, write <tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>\n";
constexpr std::string_view kLlama31ToolsIntro =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";
constexpr std::string_view kGlmToolsIntro =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\n<tools>\n";
constexpr std::string_view kGlm45ToolsOutro =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";
constexpr std::string_view kGlm47ToolsOutro =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
    "<arg_value>{arg-value-2}</arg_value>...</tool_call>";

// The Hermes call block Qwen2.5 writes after an assistant's content.
void AppendHermesCall(std::string_view name, const OrderedJson& args, std::string* out) {
  absl::StrAppend(out, "<tool_call>\n{\"name\": \"", Sv(name), "\", \"arguments\": ", PyJson(args),
                  "}\n</tool_call>");
}

// Ours: the bundled model has no template, so tools take the "{role}: ..."
// layout with the Hermes call format (the one its tool_format names).
std::string RenderPlain(const Conversation& c, bool add_generation_prompt) {
  std::string out;
  if (c.has_tools()) {
    out += kPlainToolsIntro;
    for (const OrderedJson& tool : *c.tools) absl::StrAppend(&out, PyJson(tool), "\n");
    out += kPlainToolsOutro;
  }
  for (size_t i = 0; i < c.messages.size(); ++i) {
    const ChatMessage& m = c.messages[i];
    absl::StrAppend(&out, m.role, ": ", m.content);
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      if (!m.content.empty() || j > 0) out += "\n";
      AppendHermesCall(m.tool_calls[j].name, c.arguments[i][j], &out);
    }
    out += "\n";
  }
  if (add_generation_prompt) out += "assistant:";
  return out;
}

// Qwen2.5-Instruct's template; chatml is the same without the default system
// message, and with tools a leading system message opens the tools block
// followed by a blank line, as Qwen3's does (Qwen2.5's layout would start the
// block with one).
std::string RenderChatMl(const Conversation& c, bool add_generation_prompt,
                         bool qwen2_default_system) {
  std::string out;
  const absl::Span<const ChatMessage> messages = c.messages;
  const bool leading_system = messages.front().role == "system";
  if (c.has_tools()) {
    out += "<|im_start|>system\n";
    if (qwen2_default_system) {
      absl::StrAppend(
          &out,
          Sv(leading_system ? std::string_view(messages.front().content) : kQwen2DefaultSystem),
          "\n\n");
    } else if (leading_system) {
      absl::StrAppend(&out, messages.front().content, "\n\n");
    }
    out += kHermesToolsIntro;
    for (const OrderedJson& tool : *c.tools) absl::StrAppend(&out, "\n", PyJson(tool));
    absl::StrAppend(&out, Sv(kHermesToolsOutro), "<|im_end|>\n");
  } else if (leading_system) {
    AppendChatMl(messages.front(), &out);
  } else if (qwen2_default_system) {
    AppendChatMl({"system", std::string(kQwen2DefaultSystem)}, &out);
  }
  // The leading system message is in the block above; a later one is an
  // ordinary turn. Consecutive tool results share one user turn.
  for (size_t i = leading_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else if (m.tool_calls.empty()) {
      AppendChatMl(m, &out);
    } else {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        out += "\n";
        AppendHermesCall(m.tool_calls[j].name, c.arguments[i][j], &out);
      }
      out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) AppendLlamaBlock(m.role, PythonStrip(m.content), &out);
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Llama-3.1-8B-Instruct's template with its defaults (tools_in_user_message,
// no builtin_tools, date_string "26 Jul 2024"). Callers have checked that each
// assistant turn with calls has exactly one and, with tools, that a user
// message follows the optional system message.
std::string RenderLlama31(const Conversation& c, bool add_generation_prompt) {
  absl::Span<const ChatMessage> messages = c.messages;
  size_t index = 0;  // of messages.front() in c.messages
  std::string out = "<|begin_of_text|>";
  // The first system message is folded into the dated system block that 3.1
  // always emits; a later system message is an ordinary block.
  std::string_view system;
  if (messages.front().role == "system") {
    system = PythonStrip(messages.front().content);
    messages.remove_prefix(1);
    ++index;
  }
  AppendLlamaBlock("system",
                   absl::StrCat(c.tools != nullptr ? "Environment: ipython\n" : "",
                                Sv(kLlama31DateLines), Sv(system)),
                   &out);
  if (c.tools != nullptr) {
    // "tools is not none": an empty list still takes the first user message.
    std::string user(kLlama31ToolsIntro);
    for (const OrderedJson& tool : *c.tools) absl::StrAppend(&user, PyJson(tool, 4), "\n\n");
    absl::StrAppend(&user, Sv(PythonStrip(messages.front().content)));
    AppendLlamaBlock("user", user, &out);
    messages.remove_prefix(1);
    ++index;
  }
  for (size_t k = 0; k < messages.size(); ++k, ++index) {
    const ChatMessage& m = messages[k];
    if (m.role == "tool" || m.role == "ipython") {
      // The template tests "content is iterable", which a string is, so the
      // result is always written as a JSON string.
      std::string quoted;
      AppendPyJsonString(m.content, &quoted);
      AppendLlamaBlock("ipython", quoted, &out);
    } else if (!m.tool_calls.empty()) {
      // The call replaces the message's content, which the template drops.
      AppendLlamaBlock("assistant",
                       absl::StrCat("{\"name\": \"", m.tool_calls[0].name,
                                    "\", \"parameters\": ", PyJson(c.arguments[index][0]), "}"),
                       &out);
    } else {
      AppendLlamaBlock(m.role, PythonStrip(m.content), &out);
    }
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string RenderGlm4(absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out = "[gMASK]<sop>";
  for (const ChatMessage& m : messages) {
    // GLM-4 tests the content's truthiness: an empty message leaves no trace,
    // not even its role marker. Its metadata field (tool names) is empty for
    // plain messages.
    if (m.content.empty()) continue;
    absl::StrAppend(&out, "<|", m.role, "|>\n", m.content);
  }
  if (add_generation_prompt) out += "<|assistant|>";
  return out;
}

std::string_view StripChar(std::string_view s, char c, bool front, bool back) {
  while (front && !s.empty() && s.front() == c) s.remove_prefix(1);
  while (back && !s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

// GLM-4.5 (4.6) and, with glm47, GLM-4.7 / GLM-5, with enable_thinking and
// clear_thinking left undefined as transformers leaves them by default.
std::string RenderGlm45(const Conversation& c, bool add_generation_prompt, bool glm47) {
  const absl::Span<const ChatMessage> messages = c.messages;
  const std::string_view nl = glm47 ? "" : "\n";
  std::string out = "[gMASK]<sop>";
  if (c.has_tools()) {
    out += kGlmToolsIntro;
    for (const OrderedJson& tool : *c.tools) absl::StrAppend(&out, PyJson(tool), "\n");
    out += glm47 ? kGlm47ToolsOutro : kGlm45ToolsOutro;
  }
  // Reasoning is replayed only for the turns after the last user message
  // (the current tool-calling chain); earlier turns get an empty block.
  size_t last_user = messages.size();  // none
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = i;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || m.role == "system") {
      absl::StrAppend(&out, "<|", m.role, "|>", Sv(nl), m.content);
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|observation|>";
      absl::StrAppend(&out, Sv(nl), "<tool_response>", Sv(nl), m.content, Sv(nl),
                      "</tool_response>");
    } else {
      std::string_view reasoning = m.reasoning_content;
      std::string_view content = m.content;
      // Without a reasoning_content field, the template takes the thinking
      // out of an inline <think>...</think> in the content.
      if (reasoning.empty()) {
        if (size_t close = content.find("</think>"); close != std::string_view::npos) {
          std::string_view before = StripChar(content.substr(0, close), '\n', false, true);
          if (size_t open = before.rfind("<think>"); open != std::string_view::npos) {
            before.remove_prefix(open + std::string_view("<think>").size());
          }
          reasoning = StripChar(before, '\n', true, false);
          content = StripChar(content.substr(content.rfind("</think>") + 8), '\n', true, false);
        }
      }
      out += "<|assistant|>";
      const bool replay = (last_user == messages.size() || i > last_user) && !reasoning.empty();
      if (replay) {
        absl::StrAppend(&out, Sv(nl), "<think>", Sv(PythonStrip(reasoning)), "</think>");
      } else {
        out += glm47 ? "</think>" : "\n<think></think>";
      }
      if (std::string_view text = PythonStrip(content); !text.empty()) {
        absl::StrAppend(&out, Sv(nl), Sv(text));
      }
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        absl::StrAppend(&out, Sv(nl), "<tool_call>", m.tool_calls[j].name, Sv(nl));
        for (const auto& [key, value] : c.arguments[i][j].items()) {
          absl::StrAppend(&out, "<arg_key>", key, "</arg_key>", Sv(nl), "<arg_value>",
                          value.is_string() ? value.get_ref<const std::string&>() : PyJson(value),
                          "</arg_value>", Sv(nl));
        }
        out += "</tool_call>";
      }
    }
  }
  if (add_generation_prompt) out += glm47 ? "<|assistant|><think>" : "<|assistant|>";
  return out;
}

// What a family can render beyond {role, content}.
struct FamilyRules {
  std::vector<absl::string_view> roles;
  bool tools;  // tools, tool calls and tool results
};

FamilyRules RulesFor(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kPlain:
    case ChatTemplateFamily::kChatMl:
    case ChatTemplateFamily::kQwen2:
    case ChatTemplateFamily::kGlm45:
    case ChatTemplateFamily::kGlm47:
      return {{"system", "user", "assistant", "tool"}, true};
    case ChatTemplateFamily::kLlama31:
      return {{"system", "user", "assistant", "tool", "ipython"}, true};
    case ChatTemplateFamily::kLlama3:
      return {{"system", "user", "assistant"}, false};
    case ChatTemplateFamily::kGlm4:
      // observation carries a tool's result as plain text; GLM-4 renders it
      // like any other role.
      return {{"system", "user", "assistant", "observation"}, false};
  }
  return {{}, false};
}

absl::StatusOr<Conversation> CheckConversation(ChatTemplateFamily family, std::string_view name,
                                               absl::Span<const ChatMessage> messages,
                                               const OrderedJson* tools) {
  const FamilyRules rules = RulesFor(family);
  if (absl::Status s = CheckRoles(messages, name, rules.roles); !s.ok()) return s;
  const auto invalid = [&](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", Sv(name), ": ", field, ": ", what));
  };
  Conversation c;
  c.messages = messages;
  if (tools != nullptr && !tools->is_null()) {
    if (!rules.tools) return invalid("tools", "this template renders no tools");
    if (!tools->is_array()) return invalid("tools", "must be an array");
    for (size_t t = 0; t < tools->size(); ++t) {
      if (!(*tools)[t].is_object()) {
        return invalid(absl::StrCat("tools[", t, "]"), "must be an object");
      }
    }
    c.tools = tools;
  }
  c.arguments.resize(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.tool_calls.empty()) continue;
    const std::string field = absl::StrCat("messages[", i, "].tool_calls");
    if (!rules.tools) return invalid(field, "this template renders no tool calls");
    if (m.role != "assistant") return invalid(field, "only assistant messages carry tool calls");
    if (family == ChatTemplateFamily::kLlama31 && m.tool_calls.size() != 1) {
      // The template raises "This model only supports single tool-calls at once!".
      return invalid(field, absl::StrCat("Llama 3.1 renders one call per assistant message, got ",
                                         m.tool_calls.size()));
    }
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      const ToolCallMessage& call = m.tool_calls[j];
      if (call.name.empty()) {
        return invalid(absl::StrCat(field, "[", j, "].function.name"), "must not be empty");
      }
      const std::string args_field = absl::StrCat(field, "[", j, "].function.arguments");
      OrderedJson args = OrderedJson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded()) return invalid(args_field, "not valid JSON");
      // GLM writes one <arg_key> per member, and every template means a
      // dictionary of arguments.
      if (!args.is_object()) return invalid(args_field, "must be a JSON object");
      c.arguments[i].push_back(std::move(args));
    }
  }
  if (family == ChatTemplateFamily::kLlama31 && c.tools != nullptr) {
    // The tools go into the first message after the system message, which
    // the template takes as the user's whatever its role; only a user
    // message is accepted here so nothing is silently dropped.
    const size_t first = messages.front().role == "system" ? 1 : 0;
    if (first >= messages.size() || messages[first].role != "user") {
      return invalid(absl::StrCat("messages[", first, "]"),
                     "Llama 3.1 puts the tools into the first user message, which must follow "
                     "the optional system message");
    }
  }
  return c;
}

struct NamedFamily {
  std::string_view name;
  ChatTemplateFamily family;
};
constexpr NamedFamily kFamilies[] = {
    {"plain", ChatTemplateFamily::kPlain},      {"chatml", ChatTemplateFamily::kChatMl},
    {"qwen2", ChatTemplateFamily::kQwen2},      {"llama3", ChatTemplateFamily::kLlama3},
    {"llama3.1", ChatTemplateFamily::kLlama31}, {"glm4", ChatTemplateFamily::kGlm4},
    {"glm4.5", ChatTemplateFamily::kGlm45},     {"glm4.7", ChatTemplateFamily::kGlm47},
};

}  // namespace

std::string_view ChatTemplate::name() const {
  for (const NamedFamily& f : kFamilies) {
    if (f.family == family_) return f.name;
  }
  return "unknown";
}

ToolFormat ChatTemplate::tool_format() const {
  switch (family_) {
    case ChatTemplateFamily::kPlain:
    case ChatTemplateFamily::kChatMl:
    case ChatTemplateFamily::kQwen2:
      return ToolFormat::kHermes;
    case ChatTemplateFamily::kLlama3:
    case ChatTemplateFamily::kLlama31:
      return ToolFormat::kLlama31Json;
    case ChatTemplateFamily::kGlm4:
    case ChatTemplateFamily::kGlm45:
      return ToolFormat::kGlm45;
    case ChatTemplateFamily::kGlm47:
      return ToolFormat::kGlm47;
  }
  return ToolFormat::kHermes;
}

bool ChatTemplate::reasoning() const {
  return family_ == ChatTemplateFamily::kGlm45 || family_ == ChatTemplateFamily::kGlm47;
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json* tools) const {
  absl::StatusOr<Conversation> c = CheckConversation(family_, name(), messages, tools);
  if (!c.ok()) return c.status();
  switch (family_) {
    case ChatTemplateFamily::kPlain:
      return RenderPlain(*c, add_generation_prompt);
    case ChatTemplateFamily::kChatMl:
    case ChatTemplateFamily::kQwen2:
      return RenderChatMl(*c, add_generation_prompt, family_ == ChatTemplateFamily::kQwen2);
    case ChatTemplateFamily::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case ChatTemplateFamily::kLlama31:
      return RenderLlama31(*c, add_generation_prompt);
    case ChatTemplateFamily::kGlm4:
      return RenderGlm4(messages, add_generation_prompt);
    case ChatTemplateFamily::kGlm45:
    case ChatTemplateFamily::kGlm47:
      return RenderGlm45(*c, add_generation_prompt, family_ == ChatTemplateFamily::kGlm47);
  }
  return absl::InternalError("chat template: unknown family");
}

absl::StatusOr<ChatTemplate> ChatTemplateByName(std::string_view name) {
  std::vector<absl::string_view> names;
  for (const NamedFamily& f : kFamilies) {
    if (f.name == name) return ChatTemplate(f.family);
    names.push_back(Sv(f.name));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template \"", Sv(name),
                                                 "\"; known: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view tokenizer_config_json) {
  nlohmann::json config =
      nlohmann::json::parse(tokenizer_config_json, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return ChatTemplate(ChatTemplateFamily::kPlain);
  std::string tmpl;
  if (it->is_string()) {
    tmpl = it->get<std::string>();
  } else if (it->is_array()) {
    // Some configs carry several named templates (e.g. "default", "tool_use").
    for (const nlohmann::json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        tmpl = entry["template"].get<std::string>();
      }
    }
    if (tmpl.empty()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: chat_template list has no \"default\" template");
    }
  } else {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template is neither a string nor a list");
  }

  const auto has = [&](std::string_view marker) { return tmpl.find(marker) != std::string::npos; };
  // Order matters: 3.1's template also has Llama 3's header markers, and
  // Qwen2.5's is ChatML with a default system message.
  if (has("<|start_header_id|>")) {
    return ChatTemplate(has("Cutting Knowledge Date") ? ChatTemplateFamily::kLlama31
                                                      : ChatTemplateFamily::kLlama3);
  }
  if (has("[gMASK]")) {
    // GLM-4.5/4.6 put each argument on its own line; GLM-4.7 and GLM-5 write
    // the same tags without the newlines.
    if (has("<arg_key>")) {
      return ChatTemplate(has("</arg_key>\n<arg_value>") ? ChatTemplateFamily::kGlm45
                                                         : ChatTemplateFamily::kGlm47);
    }
    if (has("<think>")) {
      return absl::UnimplementedError(
          "chat_template is a GLM template with reasoning turns but without GLM-4.5's tool "
          "calls (GLM-Z1, GLM-4.1V?); none is built in (force one with --chat_template)");
    }
    return ChatTemplate(ChatTemplateFamily::kGlm4);
  }
  if (has("<|im_start|>")) {
    return ChatTemplate(has("You are Qwen, created by Alibaba Cloud")
                            ? ChatTemplateFamily::kQwen2
                            : ChatTemplateFamily::kChatMl);
  }
  return absl::NotFoundError(
      "chat_template matches no built-in family (chatml, qwen2, llama3, llama3.1, glm4, "
      "glm4.5, glm4.7); pick "
      "one with --chat_template");
}

}  // namespace ringlane::router
