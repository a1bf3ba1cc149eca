#ifndef RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_
#define RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_

// Built-in chat templates: the prompt text a model family was trained on,
// rendered from a list of messages without a Jinja engine. Each renderer
// re-expresses one published Hugging Face chat_template (text content, OpenAI
// tool calling, reasoning fields; no images) as transformers renders it;
// the tests name the template and version each one follows, and
// router/request/testdata/chat_templates/ holds the texts the expected
// prompts were rendered from (tools/render_chat_template.py).

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json_fwd.hpp"
#include "router/request/tool_format.h"

namespace ringlane::router {

// One call an assistant message made (OpenAI's tool_calls[i]).
struct ToolCallMessage {
  std::string id;
  std::string name;       // function.name
  std::string arguments;  // function.arguments: JSON text of an object
};

// Empty strings and an empty tool_calls stand for absent fields: the
// templates test them for truthiness, so "" and absent render alike.
struct ChatMessage {
  // "system", "user", "assistant", "tool" (a tool's result); Llama 3.1 also
  // "ipython" (its name for "tool"), GLM-4 "observation".
  std::string role;
  std::string content;
  std::vector<ToolCallMessage> tool_calls;  // assistant only
  std::string tool_call_id;                 // tool: the call it answers
  std::string name;                         // tool: the function's name
  std::string reasoning_content;            // assistant: its thinking
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
  // GLM-4.5 / 4.6: "[gMASK]<sop>", "<|{role}|>\n{content}", assistant turns
  // opening with "\n<think>...</think>" (kept only after the last user
  // message), tool calls as <tool_call>NAME\n<arg_key>..., results after
  // <|observation|>; "<|assistant|>" as the generation prompt.
  kGlm45,
  // GLM-4.7 / GLM-5: GLM-4.5's layout without the newlines, a past turn's
  // dropped reasoning written as a bare "</think>", and "<|assistant|><think>"
  // as the generation prompt.
  kGlm47,
};

// Renders conversations for one family. Immutable; safe to share between
// threads.
class ChatTemplate {
 public:
  explicit ChatTemplate(ChatTemplateFamily family) : family_(family) {}

  ChatTemplateFamily family() const { return family_; }
  // The --chat_template name: "plain", "chatml", "qwen2", "llama3",
  // "llama3.1", "glm4", "glm4.5" or "glm4.7".
  std::string_view name() const;

  // How the family's model writes tool calls. Families whose template renders
  // no tools (llama3, glm4) report their successor's (Llama 3.1 JSON,
  // GLM-4.5) only as a fallback: Render rejects tools for them.
  ToolFormat tool_format() const;
  // Whether the model may open its answer with a <think> block after the
  // generation prompt (GLM-4.5 decides itself; GLM-4.7's prompt opens one).
  bool reasoning() const;

  // The prompt text for messages; with add_generation_prompt it ends with the
  // header that opens an assistant turn. Special tokens appear as their text
  // (Llama's includes "<|begin_of_text|>", GLM's "[gMASK]<sop>"), so encode it
  // with special-token parsing and without adding another BOS.
  //
  // tools is null (no tools) or an array of OpenAI tool definitions
  // ({"type": "function", "function": {name, description, parameters}}),
  // written into the prompt as the template's tojson would: in the order
  // given, which is why it is an ordered_json. An empty array is not null:
  // Llama 3.1's template tests "tools is not none".
  //
  // InvalidArgument when messages is empty, a role is not one the family's
  // template renders (naming the role, its index and the family), or a field
  // is malformed or unrenderable, named by its path, e.g.
  // "messages[2].tool_calls[0].function.arguments: not valid JSON".
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json* tools = nullptr) const;

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
// reasoning turns but without GLM-4.5's tool-call markup (GLM-Z1, GLM-4.1V),
// none of which is built in. GLM-5's template is detected as glm4.7.
absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view tokenizer_config_json);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_CHAT_TEMPLATE_H_
