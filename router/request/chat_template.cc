#include "router/request/chat_template.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
namespace {

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

absl::Status CheckRoles(absl::Span<const ChatMessage> messages, std::string_view family,
                        std::initializer_list<absl::string_view> roles) {
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

std::string RenderPlain(absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) absl::StrAppend(&out, m.role, ": ", m.content, "\n");
  if (add_generation_prompt) out += "assistant:";
  return out;
}

std::string RenderChatMl(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                         bool qwen2_default_system) {
  std::string out;
  // Qwen2.5 renders a leading system message in its own branch and every
  // later one like any other turn; only the default is Qwen-specific.
  if (qwen2_default_system && messages.front().role != "system") {
    AppendChatMl({"system", std::string(kQwen2DefaultSystem)}, &out);
  }
  for (const ChatMessage& m : messages) AppendChatMl(m, &out);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) AppendLlamaBlock(m.role, PythonStrip(m.content), &out);
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string RenderLlama31(absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  // The first system message is folded into the dated system block that 3.1
  // always emits; a later system message is an ordinary block.
  std::string_view system;
  if (messages.front().role == "system") {
    system = PythonStrip(messages.front().content);
    messages.remove_prefix(1);
  }
  AppendLlamaBlock("system", absl::StrCat(Sv(kLlama31DateLines), Sv(system)), &out);
  for (const ChatMessage& m : messages) AppendLlamaBlock(m.role, PythonStrip(m.content), &out);
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

struct NamedFamily {
  std::string_view name;
  ChatTemplateFamily family;
};
constexpr NamedFamily kFamilies[] = {
    {"plain", ChatTemplateFamily::kPlain},      {"chatml", ChatTemplateFamily::kChatMl},
    {"qwen2", ChatTemplateFamily::kQwen2},      {"llama3", ChatTemplateFamily::kLlama3},
    {"llama3.1", ChatTemplateFamily::kLlama31}, {"glm4", ChatTemplateFamily::kGlm4},
};

}  // namespace

std::string_view ChatTemplate::name() const {
  for (const NamedFamily& f : kFamilies) {
    if (f.family == family_) return f.name;
  }
  return "unknown";
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  switch (family_) {
    case ChatTemplateFamily::kPlain:
      if (absl::Status s = CheckRoles(messages, name(), {"system", "user", "assistant"}); !s.ok())
        return s;
      return RenderPlain(messages, add_generation_prompt);
    case ChatTemplateFamily::kChatMl:
    case ChatTemplateFamily::kQwen2:
      if (absl::Status s = CheckRoles(messages, name(), {"system", "user", "assistant"}); !s.ok())
        return s;
      return RenderChatMl(messages, add_generation_prompt, family_ == ChatTemplateFamily::kQwen2);
    case ChatTemplateFamily::kLlama3:
      if (absl::Status s = CheckRoles(messages, name(), {"system", "user", "assistant"}); !s.ok())
        return s;
      return RenderLlama3(messages, add_generation_prompt);
    case ChatTemplateFamily::kLlama31:
      if (absl::Status s = CheckRoles(messages, name(), {"system", "user", "assistant"}); !s.ok())
        return s;
      return RenderLlama31(messages, add_generation_prompt);
    case ChatTemplateFamily::kGlm4:
      // observation carries a tool's result as plain text; GLM-4 renders it
      // like any other role.
      if (absl::Status s =
              CheckRoles(messages, name(), {"system", "user", "assistant", "observation"});
          !s.ok())
        return s;
      return RenderGlm4(messages, add_generation_prompt);
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
    if (has("<think>")) {
      return absl::UnimplementedError(
          "chat_template is a GLM template with reasoning turns (GLM-4.5 or later); only "
          "glm-4-9b-chat's is built in (force it with --chat_template=glm4)");
    }
    return ChatTemplate(ChatTemplateFamily::kGlm4);
  }
  if (has("<|im_start|>")) {
    return ChatTemplate(has("You are Qwen, created by Alibaba Cloud")
                            ? ChatTemplateFamily::kQwen2
                            : ChatTemplateFamily::kChatMl);
  }
  return absl::NotFoundError(
      "chat_template matches no built-in family (chatml, qwen2, llama3, llama3.1, glm4); pick "
      "one with --chat_template");
}

}  // namespace ringlane::router
