// The grammar of tool_choice "required" and of a named function: the
// model's tool-call format (tool_format.h) with each declared function's
// name and its parameters' JSON schema, so that a constrained model can
// only write calls the output parser turns into valid tool_calls.
#ifndef RINGLANE_ROUTER_REQUEST_TOOL_GRAMMAR_H_
#define RINGLANE_ROUTER_REQUEST_TOOL_GRAMMAR_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/grammar/grammar.h"
#include "router/request/tool_format.h"

namespace ringlane::router {

// `tools`: OpenAI tool definitions (an array of {"type": "function",
// "function": {"name", "parameters"}}), already checked for shape.
// `function` empty: one or more calls of any of them (exactly one when
// `single`); else exactly one call of that one. InvalidArgument naming
// "tools[i].function.parameters..." for a schema the grammar cannot express, or "tool_choice" for
// an unknown name.
absl::StatusOr<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(
    ToolFormat format, const nlohmann::ordered_json& tools, std::string_view function,
    bool single = false);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_TOOL_GRAMMAR_H_
