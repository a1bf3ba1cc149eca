#ifndef RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_
#define RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_

// Built-in chat templates: the prompt text a model family was trained on,
// rendered from a list of {role, content} messages without a Jinja engine.
// Each renderer re-expresses the plain-text path (no tools, no images, no
// reasoning fields) of one published Hugging Face chat_template; the tests
// name the template and version each one follows.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringlane::router {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (GLM-4 also "observation")
  std::string content;
};

enum class ChatTemplateFamily {
  // No template of its own (e.g. the bundled stories260K):
  //   "{role}: {content}\n" per message, then "assistant:" as the generation
  //   prompt (no trailing space: the model's first token carries its own).
  kPlain,
  // ChatML without a default system message:
  //   "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
  //   "<|im_start|>assistant\n" as the generation prompt.
  kChatMl,
  // Qwen2.5 Instruct: ChatML, plus Qwen2.5's default system message when the
  // first message is not a system message. (Qwen2-Instruct's own default was
  // "You are a helpful assistant."; it is not built in.)
  kQwen2,
  // Meta-Llama-3-*-Instruct: BOS, then a header block per message with the
  // content trimmed.
  kLlama3,
  // Llama-3.1-*-Instruct: like kLlama3, but a system block always comes
  // first, carrying the knowledge-cutoff and date lines before the (trimmed)
  // first system message.
  kLlama31,
  // glm-4-9b-chat: "[gMASK]<sop>", then "<|{role}|>\n{content}" per message
  // with non-empty content, "<|assistant|>" as the generation prompt.
  kGlm4,
};

// Renders conversations for one family. Immutable; safe to share between
// threads.
class ChatTemplate {
 public:
  explicit ChatTemplate(ChatTemplateFamily family) : family_(family) {}

  ChatTemplateFamily family() const { return family_; }
  // The --chat_template name: "plain", "chatml", "qwen2", "llama3",
  // "llama3.1" or "glm4".
  std::string_view name() const;

  // The prompt text for messages; with add_generation_prompt it ends with the
  // header that opens an assistant turn. Special tokens appear as their text
  // (Llama's includes "<|begin_of_text|>", GLM's "[gMASK]<sop>"), so encode it
  // with special-token parsing and without adding another BOS.
  // InvalidArgument when messages is empty or a role is not one the family's
  // template renders (the message names the role, its index and the family).
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

 private:
  ChatTemplateFamily family_;
};

// The template for a --chat_template flag value (see ChatTemplate::name).
// InvalidArgument naming the known names otherwise.
absl::StatusOr<ChatTemplate> ChatTemplateByName(std::string_view name);

// Picks the family from the "chat_template" of a tokenizer_config.json (a
// string, or a list of {name, template} of which "default" is used) by the
// markers each family's template carries. A config without a chat_template
// gets kPlain. InvalidArgument when the text is not a JSON object;
// NotFound when the template is of no family built in here (the operator can
// then force one with --chat_template); Unimplemented for GLM templates with
// reasoning turns (GLM-4.5 and later), whose assistant turns differ from GLM-4.
absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view tokenizer_config_json);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_
