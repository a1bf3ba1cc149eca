#include "router/request/tool_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "router/request/errors.h"

namespace ringlane::router {

namespace {

using grammar::GrammarBuilder;
using json = nlohmann::ordered_json;
using Rule = GrammarBuilder::Rule;

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The parameters schema of a function; OpenAI: "omitting parameters
// defines a function with an empty parameter list".
const json* Parameters(const json& fn) {
  auto it = fn.find("parameters");
  return it == fn.end() || it->is_null() ? nullptr : &*it;
}

// GLM's <arg_key>/<arg_value> pairs: one per declared property in the
// schema's order (required ones always, the others optionally), string
// values raw up to the closing tag and other values as JSON.
absl::StatusOr<Rule> GlmArguments(GrammarBuilder& b, const json* params, std::string_view path,
                                  bool newlines) {
  const std::string nl = newlines ? "\n" : "";
  if (params == nullptr || !params->contains("properties")) return b.Literal("");
  const json& props = (*params)["properties"];
  if (!props.is_object()) return FieldError(absl::StrCat(Sv(path), ".properties"), "not an object");
  std::vector<std::string> required;
  if (auto r = params->find("required"); r != params->end() && r->is_array()) {
    for (const json& k : *r) {
      if (k.is_string()) required.push_back(k.get<std::string>());
    }
  }
  std::vector<Rule> parts;
  for (const auto& [key, schema] : props.items()) {
    const std::string field = absl::StrCat(Sv(path), ".properties.", key);
    // Compiled in every case: a keyword the engine cannot express is
    // refused here too, not silently dropped by the raw-text path.
    absl::StatusOr<Rule> json_value = b.JsonSchema(schema, field);
    if (!json_value.ok()) return json_value.status();
    Rule value = *json_value;
    if (schema.is_object() && schema.value("type", json()) == "string" &&
        !schema.contains("enum") && !schema.contains("const")) {
      // JSON compiled the bounds already; they are small integers here.
      const int min = schema.contains("minLength") ? schema["minLength"].get<int>() : 0;
      const int max = schema.contains("maxLength") ? schema["maxLength"].get<int>() : -1;
      value = b.TextUntil("</arg_value>", min, max);
    }
    Rule pair = b.Seq({b.Literal(absl::StrCat("<arg_key>", key, "</arg_key>", nl, "<arg_value>")),
                       value, b.Literal(absl::StrCat("</arg_value>", nl))});
    const bool req = std::find(required.begin(), required.end(), key) != required.end();
    parts.push_back(req ? pair : b.Repeat(pair, 0, 1));
  }
  return b.Seq(std::move(parts));
}

absl::StatusOr<Rule> OneCall(GrammarBuilder& b, ToolFormat format, const json& fn,
                             std::string_view path) {
  const std::string name = fn["name"].get<std::string>();
  const json* params = Parameters(fn);
  const std::string params_path = absl::StrCat(Sv(path), ".parameters");
  auto json_args = [&]() -> absl::StatusOr<Rule> {
    if (params == nullptr) return b.Literal("{}");
    return b.JsonSchema(*params, params_path);
  };
  switch (format) {
    case ToolFormat::kHermes: {
      absl::StatusOr<Rule> args = json_args();
      if (!args.ok()) return args.status();
      return b.Seq(
          {b.Literal(absl::StrCat("<tool_call>\n{\"name\": \"", name, "\", \"arguments\": ")),
           *args, b.Literal("}\n</tool_call>")});
    }
    case ToolFormat::kLlama31Json: {
      absl::StatusOr<Rule> args = json_args();
      if (!args.ok()) return args.status();
      return b.Seq({b.Literal(absl::StrCat("{\"name\": \"", name, "\", \"parameters\": ")), *args,
                    b.Literal("}")});
    }
    case ToolFormat::kGlm45:
    case ToolFormat::kGlm47: {
      const bool newlines = format == ToolFormat::kGlm45;
      absl::StatusOr<Rule> args = GlmArguments(b, params, params_path, newlines);
      if (!args.ok()) return args.status();
      return b.Seq({b.Literal(absl::StrCat("<tool_call>", name, newlines ? "\n" : "")), *args,
                    b.Literal("</tool_call>")});
    }
  }
  return absl::InternalError("unknown tool format");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(ToolFormat format,
                                                                        const json& tools,
                                                                        std::string_view function,
                                                                        bool single) {
  GrammarBuilder b;
  std::vector<Rule> calls;
  bool found = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tools[i]["function"];
    if (!function.empty() && fn["name"].get<std::string>() != function) continue;
    found = true;
    absl::StatusOr<Rule> call = OneCall(b, format, fn, absl::StrCat("tools[", i, "].function"));
    if (!call.ok()) return call.status();
    calls.push_back(*call);
  }
  if (!found) {
    return FieldError("constraint.tool_function", absl::StrCat("names function '", Sv(function),
                                                               "', which tools does not declare"));
  }
  const Rule any = b.Alt(std::move(calls));
  if (!function.empty() || single) return b.Build(any);
  // Several calls: llama 3.1 separates them with ";", the tagged formats
  // with a newline.
  const Rule sep = b.Literal(format == ToolFormat::kLlama31Json ? "; " : "\n");
  return b.Build(b.Seq({any, b.Repeat(b.Seq({sep, any}), 0, -1)}));
}

}  // namespace ringlane::router
