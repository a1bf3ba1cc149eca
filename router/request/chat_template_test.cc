#include "router/request/chat_template.h"

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
namespace {

// Expected strings are written by hand from each published template's logic
// (not produced by running it):
// - chatml: the generic ChatML loop (as in Qwen3's template without tools,
//   minus its reasoning handling).
// - qwen2: Qwen/Qwen2.5-*-Instruct tokenizer_config.json chat_template, the
//   no-tools branch: a leading system message in its own block, else the
//   default "You are Qwen, created by Alibaba Cloud. ..." block; later system
//   messages are ordinary turns.
// - llama3: meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json: BOS,
//   then header + content|trim + <|eot_id|> per message.
// - llama3.1: meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json without
//   tools: the first system message (trimmed) is pulled into a system block
//   that always starts with the cutoff and date_string "26 Jul 2024" lines.
// - glm4: THUDM/glm-4-9b-chat tokenizer_config.json: [gMASK]<sop>, then
//   <|role|>{metadata}\n{content} for each message whose content is
//   non-empty, and <|assistant|> (no newline) as the generation prompt.
struct RenderCase {
  std::string name;
  std::string tmpl;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
  std::string want;
};

void PrintTo(const RenderCase& c, std::ostream* os) { *os << c.name; }

class ChatTemplateRenderTest : public testing::TestWithParam<RenderCase> {};

TEST_P(ChatTemplateRenderTest, MatchesPublishedTemplate) {
  const RenderCase& c = GetParam();
  auto t = ChatTemplateByName(c.tmpl);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), c.tmpl);
  auto got = t->Render(c.messages, c.add_generation_prompt);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, c.want);
}

const std::vector<ChatMessage> kSystemUser = {{"system", "You are terse."}, {"user", "Hi!"}};
const std::vector<ChatMessage> kUserOnly = {{"user", "What is 2+2?"}};
const std::vector<ChatMessage> kMultiTurn = {{"user", "Hello"},
                                             {"assistant", "Hi there"},
                                             {"user", "Who are you"},
                                             {"assistant", "  I am an assistant \n"},
                                             {"user", "Another question"}};

INSTANTIATE_TEST_SUITE_P(
    Families, ChatTemplateRenderTest,
    testing::Values(
        // chatml
        RenderCase{"chatml_system_user", "chatml", kSystemUser, true,
                   "<|im_start|>system\nYou are terse.<|im_end|>\n"
                   "<|im_start|>user\nHi!<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        RenderCase{"chatml_user_only_no_prompt", "chatml", kUserOnly, false,
                   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"},
        RenderCase{"chatml_multi_turn", "chatml", kMultiTurn, true,
                   "<|im_start|>user\nHello<|im_end|>\n"
                   "<|im_start|>assistant\nHi there<|im_end|>\n"
                   "<|im_start|>user\nWho are you<|im_end|>\n"
                   "<|im_start|>assistant\n  I am an assistant \n<|im_end|>\n"
                   "<|im_start|>user\nAnother question<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        // qwen2 (Qwen2.5)
        RenderCase{"qwen2_system_user", "qwen2", kSystemUser, true,
                   "<|im_start|>system\nYou are terse.<|im_end|>\n"
                   "<|im_start|>user\nHi!<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        RenderCase{"qwen2_user_only_default_system", "qwen2", kUserOnly, true,
                   "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                   "helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        RenderCase{"qwen2_multi_turn_no_prompt",
                   "qwen2",
                   {{"user", "Hello"},
                    {"assistant", "Hi there"},
                    {"system", "Now be formal."},
                    {"user", "Bye"}},
                   false,
                   "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                   "helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nHello<|im_end|>\n"
                   "<|im_start|>assistant\nHi there<|im_end|>\n"
                   "<|im_start|>system\nNow be formal.<|im_end|>\n"
                   "<|im_start|>user\nBye<|im_end|>\n"},
        // llama3
        RenderCase{"llama3_system_user",
                   "llama3",
                   {{"system", "  You are terse.\n"}, {"user", "Hi!"}},
                   true,
                   "<|begin_of_text|>"
                   "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        RenderCase{"llama3_user_only_no_prompt", "llama3", kUserOnly, false,
                   "<|begin_of_text|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"},
        RenderCase{"llama3_multi_turn_trims", "llama3", kMultiTurn, true,
                   "<|begin_of_text|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        // Python's str.strip also strips U+00A0 and U+3000; an inner one stays.
        RenderCase{"llama3_trims_unicode_spaces",
                   "llama3",
                   {{"user",
                     "\xc2\xa0"
                     "a\xe3\x80\x80"
                     "b\xe3\x80\x80\t"}},
                   false,
                   "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                   "a\xe3\x80\x80"
                   "b<|eot_id|>"},
        // llama3.1
        RenderCase{"llama31_system_user",
                   "llama3.1",
                   {{"system", "You are terse.\n\n"}, {"user", "Hi!"}},
                   true,
                   "<|begin_of_text|>"
                   "<|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                   "You are terse.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        RenderCase{"llama31_user_only_gets_empty_system", "llama3.1", kUserOnly, true,
                   "<|begin_of_text|>"
                   "<|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                   "<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        RenderCase{"llama31_multi_turn_second_system_is_ordinary",
                   "llama3.1",
                   {{"system", "Be brief."},
                    {"user", "Hello"},
                    {"assistant", " Hi there "},
                    {"system", "Now be formal."},
                    {"user", "Bye"}},
                   false,
                   "<|begin_of_text|>"
                   "<|start_header_id|>system<|end_header_id|>\n\n"
                   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                   "Be brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                   "<|start_header_id|>system<|end_header_id|>\n\nNow be formal.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"},
        // glm4
        RenderCase{"glm4_system_user", "glm4", kSystemUser, true,
                   "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi!<|assistant|>"},
        RenderCase{"glm4_user_only_no_prompt", "glm4", kUserOnly, false,
                   "[gMASK]<sop><|user|>\nWhat is 2+2?"},
        RenderCase{"glm4_multi_turn_no_trim", "glm4", kMultiTurn, true,
                   "[gMASK]<sop><|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you"
                   "<|assistant|>\n  I am an assistant \n<|user|>\nAnother question"
                   "<|assistant|>"},
        RenderCase{"glm4_skips_empty_content_and_renders_observation",
                   "glm4",
                   {{"system", ""},
                    {"user", "Weather?"},
                    {"assistant", "Checking."},
                    {"observation", "{\"temp\": 21}"}},
                   true,
                   "[gMASK]<sop><|user|>\nWeather?<|assistant|>\nChecking."
                   "<|observation|>\n{\"temp\": 21}<|assistant|>"},
        // plain
        RenderCase{"plain_system_user", "plain", kSystemUser, true,
                   "system: You are terse.\nuser: Hi!\nassistant:"},
        RenderCase{"plain_user_only_no_prompt", "plain", kUserOnly, false, "user: What is 2+2?\n"},
        RenderCase{"plain_multi_turn",
                   "plain",
                   {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Bye"}},
                   true,
                   "user: Hello\nassistant: Hi there\nuser: Bye\nassistant:"}),
    [](const testing::TestParamInfo<RenderCase>& info) { return info.param.name; });

TEST(ChatTemplateTest, EmptyMessagesIsInvalidArgument) {
  for (const char* name : {"plain", "chatml", "qwen2", "llama3", "llama3.1", "glm4"}) {
    auto t = ChatTemplateByName(name);
    ASSERT_TRUE(t.ok()) << name;
    auto got = t->Render({}, true);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(got.status().message().find("empty"), std::string::npos) << got.status();
  }
}

TEST(ChatTemplateTest, UnknownRoleIsInvalidArgumentNamingIt) {
  const std::vector<ChatMessage> msgs = {{"user", "a"}, {"wizard", "b"}};
  for (const char* name : {"plain", "chatml", "qwen2", "llama3", "llama3.1", "glm4"}) {
    auto got = ChatTemplateByName(name)->Render(msgs, false);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(got.status().message().find("\"wizard\""), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find("messages[1]"), std::string::npos) << got.status();
  }
  // observation is GLM's tool-result role; the others have no such role.
  auto chatml = ChatTemplateByName("chatml")->Render({{"observation", "x"}}, false);
  EXPECT_EQ(chatml.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ByNameRejectsUnknownName) {
  auto t = ChatTemplateByName("llama2");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("llama2"), std::string::npos);
}

// Conversations with tools, tool calls, tool results and reasoning fields,
// rendered by tools/render_chat_template.py with jinja2 from the template
// texts in testdata/chat_templates/ (the published Qwen2.5-7B-Instruct,
// Llama-3.1-8B-Instruct, GLM-4.5 and GLM-4.7 templates; ringlane's own for
// plain and chatml), set up as transformers' apply_chat_template does. The
// generated cases are in chat_template_tool_cases.inc.
struct ToolRenderCase {
  std::string name;
  std::string tmpl;
  const char* tools_json;  // null: no tools
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
  bool want_error;  // the template raises: InvalidArgument here
  std::string want;
};

void PrintTo(const ToolRenderCase& c, std::ostream* os) { *os << c.name; }

class ChatTemplateToolRenderTest : public testing::TestWithParam<ToolRenderCase> {};

TEST_P(ChatTemplateToolRenderTest, MatchesPublishedTemplate) {
  const ToolRenderCase& c = GetParam();
  auto t = ChatTemplateByName(c.tmpl);
  ASSERT_TRUE(t.ok()) << t.status();
  nlohmann::ordered_json tools;
  if (c.tools_json != nullptr) tools = nlohmann::ordered_json::parse(c.tools_json);
  auto got =
      t->Render(c.messages, c.add_generation_prompt, c.tools_json != nullptr ? &tools : nullptr);
  if (c.want_error) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    return;
  }
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, c.want);
}

// A function, not the macro's argument list: an #include cannot sit there.
const std::vector<ToolRenderCase>& GeneratedToolCases() {
  static const auto* cases = new std::vector<ToolRenderCase>{
#include "router/request/chat_template_tool_cases.inc"
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(Families, ChatTemplateToolRenderTest,
                         testing::ValuesIn(GeneratedToolCases()),
                         [](const testing::TestParamInfo<ToolRenderCase>& info) {
                           return info.param.name;
                         });

TEST(ChatTemplateTest, ToolFormatAndReasoningPerFamily) {
  const struct {
    const char* name;
    ToolFormat format;
    bool reasoning;
  } want[] = {
      {"plain", ToolFormat::kHermes, false},         {"chatml", ToolFormat::kHermes, false},
      {"qwen2", ToolFormat::kHermes, false},         {"llama3", ToolFormat::kLlama31Json, false},
      {"llama3.1", ToolFormat::kLlama31Json, false}, {"glm4", ToolFormat::kGlm45, false},
      {"glm4.5", ToolFormat::kGlm45, true},          {"glm4.7", ToolFormat::kGlm47, true},
  };
  for (const auto& w : want) {
    auto t = ChatTemplateByName(w.name);
    ASSERT_TRUE(t.ok()) << w.name;
    EXPECT_EQ(t->name(), w.name);
    EXPECT_EQ(t->tool_format(), w.format) << w.name;
    EXPECT_EQ(t->reasoning(), w.reasoning) << w.name;
  }
}

// The InvalidArgument message names the field by its path.
void ExpectInvalid(std::string_view tmpl, const std::vector<ChatMessage>& msgs,
                   const nlohmann::ordered_json* tools, std::string_view want_in_message) {
  auto got = ChatTemplateByName(tmpl)->Render(msgs, true, tools);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << tmpl;
  EXPECT_NE(got.status().message().find(std::string(want_in_message)), std::string::npos)
      << tmpl << ": " << got.status();
}

TEST(ChatTemplateTest, BadToolCallsAreInvalidArgumentNamingTheField) {
  const std::vector<ChatMessage> bad_json = {
      {"user", "a"},
      {"assistant", "b"},
      {.role = "assistant", .tool_calls = {{.id = "1", .name = "f", .arguments = "{\"x\": "}}}};
  const std::vector<ChatMessage> not_object = {
      {"user", "a"},
      {.role = "assistant", .tool_calls = {{.id = "1", .name = "f", .arguments = "[1]"}}}};
  const std::vector<ChatMessage> no_name = {
      {"user", "a"}, {.role = "assistant", .tool_calls = {{.id = "1", .arguments = "{}"}}}};
  const std::vector<ChatMessage> on_user = {
      {.role = "user",
       .content = "a",
       .tool_calls = {{.id = "1", .name = "f", .arguments = "{}"}}}};
  for (const char* name : {"plain", "chatml", "qwen2", "llama3.1", "glm4.5", "glm4.7"}) {
    ExpectInvalid(name, bad_json, nullptr,
                  "messages[2].tool_calls[0].function.arguments: not valid JSON");
    ExpectInvalid(name, not_object, nullptr,
                  "messages[1].tool_calls[0].function.arguments: must be a JSON object");
    ExpectInvalid(name, no_name, nullptr, "messages[1].tool_calls[0].function.name");
    ExpectInvalid(name, on_user, nullptr, "messages[0].tool_calls");
  }
}

TEST(ChatTemplateTest, FamiliesWithoutToolsRejectThem) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  const std::vector<ChatMessage> call = {
      {"user", "a"},
      {.role = "assistant", .tool_calls = {{.id = "1", .name = "f", .arguments = "{}"}}}};
  for (const char* name : {"llama3", "glm4"}) {
    ExpectInvalid(name, {{"user", "a"}}, &tools, "tools: this template renders no tools");
    ExpectInvalid(name, call, nullptr, "messages[1].tool_calls");
    ExpectInvalid(name, {{"user", "a"}, {"tool", "r"}}, nullptr, "\"tool\"");
  }
  // A null JSON value is "no tools", not an error.
  const nlohmann::ordered_json null_tools;
  EXPECT_TRUE(ChatTemplateByName("llama3")->Render({{"user", "a"}}, true, &null_tools).ok());
  // GLM-4.5+ name tool results "tool"; "observation" is GLM-4's.
  ExpectInvalid("glm4.5", {{"user", "a"}, {"observation", "r"}}, nullptr, "\"observation\"");
}

TEST(ChatTemplateTest, MalformedToolsAreInvalidArgument) {
  const nlohmann::ordered_json not_array = nlohmann::ordered_json::parse(R"({"type": "function"})");
  const nlohmann::ordered_json not_objects = nlohmann::ordered_json::parse(R"([{}, 3])");
  for (const char* name : {"plain", "chatml", "qwen2", "llama3.1", "glm4.5", "glm4.7"}) {
    ExpectInvalid(name, {{"user", "a"}}, &not_array, "tools: must be an array");
    ExpectInvalid(name, {{"user", "a"}}, &not_objects, "tools[1]: must be an object");
  }
}

TEST(ChatTemplateTest, Llama31ToolLimits) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([])");
  // The template raises for several calls in one message.
  ExpectInvalid("llama3.1",
                {{"user", "a"},
                 {.role = "assistant",
                  .tool_calls = {{.id = "1", .name = "f", .arguments = "{}"},
                                 {.id = "2", .name = "g", .arguments = "{}"}}}},
                nullptr, "messages[1].tool_calls: Llama 3.1 renders one call");
  // With tools, a user message must follow the optional system message.
  ExpectInvalid("llama3.1", {{"system", "s"}}, &tools, "messages[1]");
  ExpectInvalid("llama3.1", {{"system", "s"}, {"assistant", "x"}, {"user", "u"}}, &tools,
                "messages[1]");
}

// Python's json.dumps, as transformers' tojson calls it, for the argument
// values the generated cases do not cover.
TEST(ChatTemplateTest, ArgumentsSerializeAsPythonJsonDumps) {
  const auto render = [](const std::string& args) {
    auto got = ChatTemplateByName("qwen2")->Render(
        {{"user", "a"},
         {.role = "assistant", .tool_calls = {{.id = "1", .name = "f", .arguments = args}}}},
        false);
    EXPECT_TRUE(got.ok()) << got.status();
    const std::string& s = *got;
    const size_t begin = s.find("\"arguments\": ") + 13;
    return s.substr(begin, s.find("}\n</tool_call>") - begin);
  };
  EXPECT_EQ(render(R"({"a": 0.0001, "b": 0.00001, "c": 1e16, "d": 1e15, "e": 123.456})"),
            R"({"a": 0.0001, "b": 1e-05, "c": 1e+16, "d": 1000000000000000.0, "e": 123.456})");
  EXPECT_EQ(render(R"({"a": -1.5e-300, "b": 5e-324, "c": 1.7976931348623157e308, "d": -12})"),
            R"({"a": -1.5e-300, "b": 5e-324, "c": 1.7976931348623157e+308, "d": -12})");
  EXPECT_EQ(render(R"({"s": "\u007f\u001f\b\f\r\\/ \u00e9 \ud83d\ude00"})"),
            "{\"s\": \"\x7f\\u001f\\b\\f\\r\\\\/ \xc3\xa9 \xf0\x9f\x98\x80\"}");
}

struct DetectCase {
  std::string name;
  std::string config_json;
  std::string want;  // template name, or "" for an error
  absl::StatusCode want_code = absl::StatusCode::kOk;
};

void PrintTo(const DetectCase& c, std::ostream* os) { *os << c.name; }

class DetectChatTemplateTest : public testing::TestWithParam<DetectCase> {};

TEST_P(DetectChatTemplateTest, PicksFamily) {
  const DetectCase& c = GetParam();
  auto t = DetectChatTemplate(c.config_json);
  ASSERT_EQ(t.status().code(), c.want_code) << t.status();
  if (t.ok()) {
    EXPECT_EQ(t->name(), c.want);
  }
}

// Abbreviated chat_template strings keeping the markers of each published
// template; the full texts are long and only their markers matter here.
INSTANTIATE_TEST_SUITE_P(
    Configs, DetectChatTemplateTest,
    testing::Values(
        DetectCase{
            "qwen25",
            R"({"chat_template": "{%- if tools %}...{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"})",
            "qwen2"},
        DetectCase{
            "qwen3_chatml",
            R"({"chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}{%- endfor %}"})",
            "chatml"},
        DetectCase{
            "llama3",
            R"({"bos_token": "<|begin_of_text|>", "chat_template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% endfor %}"})",
            "llama3"},
        DetectCase{
            "llama31",
            R"({"chat_template": "{{- bos_token }}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}"})",
            "llama3.1"},
        DetectCase{
            "glm4",
            R"({"chat_template": "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"})",
            "glm4"},
        DetectCase{"glm45_reasoning",
                   R"({"chat_template": "[gMASK]<sop>{{ '\n<think></think>' }}"})", "",
                   absl::StatusCode::kUnimplemented},
        // The tool-call lines of the published templates (JSON-escaped).
        DetectCase{
            "glm45",
            R"({"chat_template": "[gMASK]<sop>\n{{ '\\n<think></think>' }}{{ '\\n<tool_call>' + tc.name }}\n{% for k, v in _args.items() %}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}"})",
            "glm4.5"},
        DetectCase{
            "glm47",
            R"({"chat_template": "[gMASK]<sop>\n{{ '</think>' }}{{- '<tool_call>' + tc.name -}}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}<|assistant|>{{- '<think>' -}}"})",
            "glm4.7"},
        DetectCase{
            "named_list_default",
            R"({"chat_template": [{"name": "tool_use", "template": "[gMASK]"}, {"name": "default", "template": "<|im_start|>"}]})",
            "chatml"},
        DetectCase{"no_template", R"({"model_max_length": 512})", "plain"},
        DetectCase{"null_template", R"({"chat_template": null})", "plain"},
        DetectCase{
            "unknown_template",
            R"({"chat_template": "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"})",
            "", absl::StatusCode::kNotFound},
        DetectCase{"not_json", "{chat_template", "", absl::StatusCode::kInvalidArgument},
        DetectCase{"not_object", "[1, 2]", "", absl::StatusCode::kInvalidArgument},
        DetectCase{"template_wrong_type", R"({"chat_template": 7})", "",
                   absl::StatusCode::kInvalidArgument}),
    [](const testing::TestParamInfo<DetectCase>& info) { return info.param.name; });

// The whole template texts of testdata/chat_templates/.
const std::vector<DetectCase>& GeneratedDetectCases() {
  static const auto* cases = new std::vector<DetectCase>{
#include "router/request/chat_template_detect_cases.inc"
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(TemplateFiles, DetectChatTemplateTest,
                         testing::ValuesIn(GeneratedDetectCases()),
                         [](const testing::TestParamInfo<DetectCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace ringlane::router
