// Chat template detection and rendering (router/request/chat_template.h):
// DetectChatTemplate over arbitrary tokenizer_config.json text, and Render of
// arbitrary conversations in every family. What must hold: no crash, no
// undefined behaviour; a rendering that succeeds carries each message's
// content (trimmed where the family trims it), and errors are the documented
// codes.
//
// Input: byte 0 = mode (bit 0: detection, else rendering), byte 1 = family
// and add_generation_prompt for rendering, then for detection the config
// text, for rendering messages as role '\0' content '\0' ... (at most 64).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "router/request/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ringlane::router::ChatMessage;
using ringlane::router::ChatTemplate;
using ringlane::router::ChatTemplateFamily;

constexpr ChatTemplateFamily kFamilies[] = {
    ChatTemplateFamily::kPlain,  ChatTemplateFamily::kChatMl,  ChatTemplateFamily::kQwen2,
    ChatTemplateFamily::kLlama3, ChatTemplateFamily::kLlama31, ChatTemplateFamily::kGlm4,
    ChatTemplateFamily::kGlm45,  ChatTemplateFamily::kGlm47,
};

void RenderAndCheck(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                    bool add_generation_prompt) {
  absl::StatusOr<std::string> text = t.Render(messages, add_generation_prompt);
  if (!text.ok()) {
    FUZZ_CHECK(text.status().code() == absl::StatusCode::kInvalidArgument, "Render failed with %s",
               text.status().ToString().c_str());
    return;
  }
  FUZZ_CHECK(!messages.empty(), "rendered an empty conversation");
  const bool trims =
      t.family() == ChatTemplateFamily::kLlama3 || t.family() == ChatTemplateFamily::kLlama31;
  for (const ChatMessage& m : messages) {
    // Llama 3 strips contents as Python does (Unicode white space); a
    // content that starts and ends with a letter or digit is kept whole
    // there too.
    const bool whole = !m.content.empty() && absl::ascii_isalnum(m.content.front()) &&
                       absl::ascii_isalnum(m.content.back());
    if (trims && !whole) continue;
    // Llama 3.1 writes a tool result as a JSON string (the template's
    // tojson of a non-mapping), escaped, not as the text itself.
    if (t.family() == ChatTemplateFamily::kLlama31 && (m.role == "tool" || m.role == "ipython")) {
      continue;
    }
    // GLM-4.5+ moves an inline <think> block out of assistant turns (and
    // drops it before the last user turn), so such content is not kept whole.
    const bool glm_reasoning =
        t.family() == ChatTemplateFamily::kGlm45 || t.family() == ChatTemplateFamily::kGlm47;
    if (glm_reasoning && (m.content.find("think>") != std::string::npos || m.role == "assistant")) {
      continue;
    }
    FUZZ_CHECK(text->find(m.content) != std::string::npos, "%s: content of a %s message missing",
               std::string(t.name()).c_str(), m.role.c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ringlane::fuzz::ByteReader in(data, size);
  const uint8_t mode = in.Byte();
  const uint8_t choice = in.Byte();
  if ((mode & 1) != 0) {
    const std::string_view config = in.Rest();
    absl::StatusOr<ChatTemplate> t = ringlane::router::DetectChatTemplate(config);
    if (!t.ok()) {
      const absl::StatusCode code = t.status().code();
      FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                     code == absl::StatusCode::kNotFound ||
                     code == absl::StatusCode::kUnimplemented,
                 "DetectChatTemplate failed with %s", t.status().ToString().c_str());
      return 0;
    }
    // A detected template must render the ordinary conversation.
    absl::StatusOr<std::string> text =
        t->Render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}}, true);
    FUZZ_CHECK(text.ok(), "detected %s cannot render system/user/assistant: %s",
               std::string(t->name()).c_str(), text.status().ToString().c_str());
    absl::StatusOr<ChatTemplate> by_name = ringlane::router::ChatTemplateByName(t->name());
    FUZZ_CHECK(by_name.ok() && by_name->family() == t->family(), "name %s does not round-trip",
               std::string(t->name()).c_str());
    return 0;
  }
  std::vector<ChatMessage> messages;
  while (!in.empty() && messages.size() < 64) {
    ChatMessage m;
    m.role = std::string(in.Until('\0'));
    m.content = std::string(in.Until('\0'));
    messages.push_back(std::move(m));
  }
  const ChatTemplate t(kFamilies[(choice >> 1) % std::size(kFamilies)]);
  RenderAndCheck(t, messages, (choice & 1) != 0);
  return 0;
}
