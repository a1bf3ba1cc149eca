// How a model family writes tool calls in its output, and whether it opens
// with a reasoning block. Shared by the chat templates (which render tools
// and earlier calls the same way), the output parsers and the grammar that
// constrains tool_choice "required" / a named function.
#ifndef RINGLANE_ROUTER_REQUEST_TOOL_FORMAT_H_
#define RINGLANE_ROUTER_REQUEST_TOOL_FORMAT_H_

namespace ringlane::router {

enum class ToolFormat {
  // Qwen2.5 / Hermes: "<tool_call>\n{\"name\": N, \"arguments\": {...}}\n</tool_call>",
  // one block per call. Also used for templates without a tool format of
  // their own (plain, chatml), as vLLM's hermes parser is.
  kHermes,
  // GLM-4.5 / 4.6: "<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...
  // </tool_call>", string values raw, others as JSON.
  kGlm45,
  // GLM-4.7 / GLM-5: the same without the newlines:
  // "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>".
  kGlm47,
  // Llama 3.1 JSON tool calling: the whole message is
  // {"name": N, "parameters": {...}} (several separated by ";").
  kLlama31Json,
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_TOOL_FORMAT_H_
