#include "router/request/tool_parser.h"

#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
namespace {

using nlohmann::json;

std::map<std::string, json> DeclaredTools() {
  return {
      {"get_weather", json::parse(R"({"type": "object", "properties": {
          "location": {"type": "string"}, "unit": {"type": "string"},
          "days": {"type": "integer"}}, "required": ["location"]})")},
      {"search", json::parse(R"({"type": "object", "properties": {
          "query": {"type": "string"}, "limit": {"type": "integer"},
          "exact": {"type": "boolean"}, "filters": {"type": "object"},
          "tags": {"type": "array", "items": {"type": "string"}},
          "lang": {"type": ["string", "null"]}}})")},
      {"get_time", json::parse(R"({"type": "object", "properties": {}})")},
      {"run_code", json::parse(R"({"type": "object", "properties": {
          "code": {"type": "string"}}})")},
  };
}

struct ExpectedCall {
  std::string name;
  std::string arguments;  // exact text
};

struct Case {
  std::string name;
  ToolFormat format;
  bool reasoning;
  std::string text;
  std::string content;
  std::string reasoning_content;
  std::vector<ExpectedCall> calls;
  bool no_tools = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ToolParserOptions OptionsFor(const Case& c) {
  ToolParserOptions o;
  o.format = c.format;
  o.reasoning = c.reasoning;
  if (!c.no_tools) o.tool_parameters = DeclaredTools();
  o.id_prefix = "call_";
  return o;
}

// Empty when equal, else what differs.
std::string Diff(const ParsedOutput& got, const ParsedOutput& want) {
  std::string d;
  if (got.content != want.content)
    d += "content: [" + got.content + "] vs [" + want.content + "]\n";
  if (got.reasoning_content != want.reasoning_content) {
    d += "reasoning: [" + got.reasoning_content + "] vs [" + want.reasoning_content + "]\n";
  }
  if (got.tool_calls.size() != want.tool_calls.size()) {
    d += "calls: " + std::to_string(got.tool_calls.size()) + " vs " +
         std::to_string(want.tool_calls.size()) + "\n";
    return d;
  }
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    const ToolCall& g = got.tool_calls[i];
    const ToolCall& w = want.tool_calls[i];
    if (g.id != w.id || g.name != w.name || g.arguments != w.arguments) {
      d += "call " + std::to_string(i) + ": " + g.id + " " + g.name + " " + g.arguments + " vs " +
           w.id + " " + w.name + " " + w.arguments + "\n";
    }
  }
  return d;
}

// Feeds text cut at the given offsets, checks what a client relies on in
// each delta, and returns the folded result. Failures name the chunking.
ParsedOutput Stream(const Case& c, const std::vector<size_t>& cuts, const std::string& label) {
  OutputStreamParser parser(OptionsFor(c));
  std::set<std::string> declared;
  for (const auto& [name, schema] : DeclaredTools()) declared.insert(name);
  ParsedOutput folded;
  size_t announced = 0;
  auto check = [&](const OutputDelta& d) {
    for (const ToolCallDelta& tc : d.tool_calls) {
      if (static_cast<size_t>(tc.index) == announced) {
        // The first delta of a call: whole declared name, deterministic id.
        EXPECT_TRUE(declared.count(tc.name)) << label << ": name [" << tc.name << "]";
        EXPECT_EQ(tc.id, "call_" + std::to_string(tc.index)) << label;
        ++announced;
      } else {
        EXPECT_LT(static_cast<size_t>(tc.index), announced)
            << label << ": delta for call " << tc.index << " before its name";
        EXPECT_TRUE(tc.name.empty()) << label << ": name repeated";
        EXPECT_TRUE(tc.id.empty()) << label << ": id repeated";
      }
    }
    AppendDelta(d, &folded);
  };
  size_t prev = 0;
  for (size_t cut : cuts) {
    check(parser.Feed(std::string_view(c.text).substr(prev, cut - prev)));
    prev = cut;
  }
  check(parser.Feed(std::string_view(c.text).substr(prev)));
  check(parser.Finish());
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_EQ(parser.has_tool_calls(), !folded.tool_calls.empty()) << label;
  for (const ToolCall& call : folded.tool_calls) {
    EXPECT_TRUE(json::accept(call.arguments)) << label << ": " << call.arguments;
  }
  return folded;
}

class ToolParserTest : public testing::TestWithParam<Case> {};

TEST_P(ToolParserTest, WholeMatchesRecordedExpectation) {
  const Case& c = GetParam();
  ParsedOutput got = ParseOutput(c.text, OptionsFor(c));
  EXPECT_EQ(got.content, c.content);
  EXPECT_EQ(got.reasoning_content, c.reasoning_content);
  ASSERT_EQ(got.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    const ToolCall& call = got.tool_calls[i];
    EXPECT_EQ(call.id, "call_" + std::to_string(i));
    EXPECT_EQ(call.name, c.calls[i].name);
    EXPECT_EQ(call.arguments, c.calls[i].arguments);
    json parsed = json::parse(call.arguments, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << call.arguments;
    EXPECT_TRUE(parsed.is_object());
    EXPECT_EQ(parsed, json::parse(c.calls[i].arguments));
  }
  EXPECT_EQ(HasToolCalls(got), !c.calls.empty());
}

TEST_P(ToolParserTest, EveryChunkingFoldsToTheWholeResult) {
  const Case& c = GetParam();
  // The expectation itself, not the whole parse, so that a bug shared by
  // both paths still fails.
  ParsedOutput want;
  want.content = c.content;
  want.reasoning_content = c.reasoning_content;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    want.tool_calls.push_back({"call_" + std::to_string(i), c.calls[i].name, c.calls[i].arguments});
  }
  const size_t n = c.text.size();
  for (size_t i = 0; i <= n; ++i) {
    std::string label = "split at " + std::to_string(i);
    std::string d = Diff(Stream(c, {i}, label), want);
    ASSERT_EQ(d, "") << label;
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < n; ++i) bytes.push_back(i);
  ASSERT_EQ(Diff(Stream(c, bytes, "bytes"), want), "") << "byte at a time";
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<size_t> cuts;
    size_t at = 0;
    while (true) {
      at += 1 + rng() % 7;
      if (at >= n) break;
      cuts.push_back(at);
    }
    std::string label = "random trial " + std::to_string(trial);
    ASSERT_EQ(Diff(Stream(c, cuts, label), want), "") << label;
  }
}

const std::string kWeatherParis =
    "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"unit\": \"celsius\"}}";

std::vector<Case> Cases() {
  using F = ToolFormat;
  return {
      // Qwen2.5 / Hermes.
      {"hermes_single_with_content",
       F::kHermes,
       false,
       "Let me check the weather for you.\n<tool_call>\n" + kWeatherParis + "\n</tool_call>",
       "Let me check the weather for you.",
       "",
       {{"get_weather", R"({"location": "Paris", "unit": "celsius"})"}}},
      {"hermes_parallel",
       F::kHermes,
       false,
       "<tool_call>\n" + kWeatherParis +
           "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
           "{}}\n</tool_call>",
       "",
       "",
       {{"get_weather", R"({"location": "Paris", "unit": "celsius"})"}, {"get_time", "{}"}}},
      {"hermes_text_between_and_after",
       F::kHermes,
       false,
       "A\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nB\n"
       "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\nC\n",
       "A\n\nB\n\nC",
       "",
       {{"get_time", "{}"}, {"get_time", "{}"}}},
      {"hermes_typed_values_and_whitespace",
       F::kHermes,
       false,
       "<tool_call>  {\"name\":\"search\",\"arguments\":{\"query\":\"llama\",\"limit\":10,"
       "\"exact\":false,\"filters\":{\"lang\":\"en\",\"year\":[2023,2024]},\"tags\":[],"
       "\"lang\":null,\"score\":-1.5e3}}  </tool_call>",
       "",
       "",
       {{"search",
         R"({"query":"llama","limit":10,"exact":false,"filters":{"lang":"en","year":[2023,2024]},"tags":[],"lang":null,"score":-1.5e3})"}}},
      {"hermes_arguments_as_string",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"location\\\": "
       "\\\"Tokyo\\\"}\"}\n</tool_call>",
       "",
       "",
       {{"get_weather", R"({"location": "Tokyo"})"}}},
      {"hermes_arguments_before_name",
       F::kHermes,
       false,
       "<tool_call>\n{\"arguments\": {\"query\": \"x\"}, \"name\": \"search\"}\n</tool_call>",
       "",
       "",
       {{"search", R"({"query": "x"})"}}},
      {"hermes_parameters_key_and_extra_member",
       F::kHermes,
       false,
       "<tool_call>\n{\"type\": \"function\", \"name\": \"search\", \"parameters\": {\"query\": "
       "\"q\"}, \"id\": 7}\n</tool_call>",
       "",
       "",
       {{"search", R"({"query": "q"})"}}},
      {"hermes_unicode",
       F::kHermes,
       false,
       "Sure — checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
       "\"Zürich 東京 🌧\", \"unit\": \"caf\\u00e9\"}}\n</tool_call>",
       "Sure — checking.",
       "",
       {{"get_weather", R"({"location": "Zürich 東京 🌧", "unit": "caf\u00e9"})"}}},
      {"hermes_raw_newline_in_string",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"run_code\", \"arguments\": {\"code\": \"print(1)\nprint(2)\"}}\n"
       "</tool_call>",
       "",
       "",
       {{"run_code", R"j({"code": "print(1)\nprint(2)"})j"}}},
      {"hermes_unknown_tool_is_content",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"delete_everything\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"delete_everything\", \"arguments\": {}}\n</tool_call>",
       "",
       {}},
      {"hermes_marker_in_prose",
       F::kHermes,
       false,
       "Wrap calls in <tool_call> tags; note that a < b and <tool_ is not a tag.",
       "Wrap calls in <tool_call> tags; note that a < b and <tool_ is not a tag.",
       "",
       {}},
      {"hermes_partial_marker_at_end",
       F::kHermes,
       false,
       "if a < b then <tool_",
       "if a < b then <tool_",
       "",
       {}},
      {"hermes_unterminated_in_string",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Par",
       "",
       "",
       {{"get_weather", R"({"location": "Par"})"}}},
      {"hermes_unterminated_in_number",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\", \"limit\": 1",
       "",
       "",
       {{"search", R"({"query": "x"})"}}},
      {"hermes_cut_before_arguments_is_content",
       F::kHermes,
       false,
       "Checking.\n<tool_call>\n{\"name\": \"get_wea",
       "Checking.\n<tool_call>\n{\"name\": \"get_wea",
       "",
       {}},
      {"hermes_malformed_arguments",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\",, "
       "}}\n</tool_call>\nok",
       "ok",
       "",
       {{"search", R"({"query": "x"})"}}},
      {"hermes_missing_close_tag",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n",
       "",
       "",
       {{"get_time", "{}"}}},
      {"hermes_no_arguments_member",
       F::kHermes,
       false,
       "<tool_call>{\"name\": \"get_time\"}</tool_call>",
       "",
       "",
       {{"get_time", "{}"}}},
      {"hermes_no_tools_declared",
       F::kHermes,
       false,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       "",
       {},
       true},
      {"qwen3_reasoning_then_call",
       F::kHermes,
       true,
       "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n" + kWeatherParis +
           "\n</tool_call>",
       "",
       "The user wants the weather in Paris.",
       {{"get_weather", R"({"location": "Paris", "unit": "celsius"})"}}},
      {"qwen3_call_inside_think",
       F::kHermes,
       true,
       "<think>\nI'll look it up.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
       "</tool_call>\n</think>\n\nIt is noon.",
       "It is noon.",
       "I'll look it up.",
       {{"get_time", "{}"}}},
      {"reasoning_never_closed",
       F::kHermes,
       true,
       "<think>\nStill thinking about </thi",
       "",
       "Still thinking about </thi",
       {}},
      {"reasoning_plain_answer",
       F::kHermes,
       true,
       "<think>\nEasy: a < b.\n</think>\n\nYes, 1 < 2.",
       "Yes, 1 < 2.",
       "Easy: a < b.",
       {}},
      // GLM-4.5 / 4.6: newlines, reasoning opened by the template.
      {"glm45_reasoning_and_call",
       F::kGlm45,
       true,
       "The user asks about Beijing's weather for 3 days.\n</think>\n<tool_call>get_weather\n"
       "<arg_key>location</arg_key>\n<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n"
       "<arg_value>3</arg_value>\n</tool_call>",
       "",
       "The user asks about Beijing's weather for 3 days.",
       {{"get_weather", R"({"location": "北京", "days": 3})"}}},
      {"glm45_typed_values",
       F::kGlm45,
       false,
       "I'll search.\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>rust \"async\" "
       "traits</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n"
       "<arg_key>exact</arg_key>\n<arg_value>true</arg_value>\n<arg_key>filters</arg_key>\n"
       "<arg_value>{\"lang\": \"en\"}</arg_value>\n<arg_key>tags</arg_key>\n"
       "<arg_value>[\"a\", \"b\"]</arg_value>\n</tool_call>",
       "I'll search.",
       "",
       {{"search",
         R"({"query": "rust \"async\" traits", "limit": 5, "exact": true, "filters": {"lang": "en"}, "tags": ["a", "b"]})"}}},
      {"glm45_undeclared_and_untyped_values",
       F::kGlm45,
       false,
       "<tool_call>search\n<arg_key>limit</arg_key>\n<arg_value>five</arg_value>\n"
       "<arg_key>extra</arg_key>\n<arg_value>hello world</arg_value>\n<arg_key>n</arg_key>\n"
       "<arg_value>42</arg_value>\n<arg_key>lang</arg_key>\n<arg_value>null</arg_value>\n"
       "</tool_call>",
       "",
       "",
       {{"search", R"({"limit": "five", "extra": "hello world", "n": 42, "lang": "null"})"}}},
      {"glm45_multiline_string_value",
       F::kGlm45,
       false,
       "<tool_call>run_code\n<arg_key>code</arg_key>\n<arg_value>for i in range(3):\n    "
       "print(\"</arg\", i)\n</arg_value>\n</tool_call>",
       "",
       "",
       {{"run_code", R"({"code": "for i in range(3):\n    print(\"</arg\", i)\n"})"}}},
      {"glm45_zero_arguments",
       F::kGlm45,
       false,
       "<tool_call>get_time\n</tool_call>",
       "",
       "",
       {{"get_time", "{}"}}},
      {"glm45_call_inside_think",
       F::kGlm45,
       true,
       "I need the time first.\n<tool_call>get_time\n</tool_call>\n</think>\nIt is noon.",
       "It is noon.",
       "I need the time first.",
       {{"get_time", "{}"}}},
      {"glm45_unknown_tool",
       F::kGlm45,
       false,
       "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>",
       "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>",
       "",
       {}},
      {"glm45_marker_in_prose",
       F::kGlm45,
       false,
       "Models emit <tool_call> blocks; here 1 < 2 and <arg_key> means nothing.",
       "Models emit <tool_call> blocks; here 1 < 2 and <arg_key> means nothing.",
       "",
       {}},
      {"glm45_unterminated_string_value",
       F::kGlm45,
       false,
       "<tool_call>run_code\n<arg_key>code</arg_key>\n<arg_value>print('hi')\nfor i in </arg_",
       "",
       "",
       {{"run_code", R"({"code": "print('hi')\nfor i in </arg_"})"}}},
      {"glm45_unterminated_typed_value",
       F::kGlm45,
       false,
       "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n"
       "<arg_key>limit</arg_key>\n<arg_value>1",
       "",
       "",
       {{"search", R"({"query": "x"})"}}},
      {"glm45_cut_in_name_is_content",
       F::kGlm45,
       false,
       "<tool_call>get_wea",
       "<tool_call>get_wea",
       "",
       {}},
      // GLM-4.7 / GLM-5: no newlines.
      {"glm47_parallel_no_newlines",
       F::kGlm47,
       true,
       "Two lookups.</think><tool_call>get_weather<arg_key>location</arg_key><arg_value>São "
       "Paulo</arg_value><arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>"
       "<tool_call>get_time</tool_call>",
       "",
       "Two lookups.",
       {{"get_weather", R"({"location": "São Paulo", "unit": "celsius"})"}, {"get_time", "{}"}}},
      {"glm47_object_and_array_values",
       F::kGlm47,
       false,
       "<tool_call>search<arg_key>query</arg_key><arg_value>q</arg_value><arg_key>filters"
       "</arg_key><arg_value>{\"a\": [1, 2]}</arg_value><arg_key>tags</arg_key><arg_value>[]"
       "</arg_value></tool_call>",
       "",
       "",
       {{"search", R"({"query": "q", "filters": {"a": [1, 2]}, "tags": []})"}}},
      {"glm47_broken_call_rest_dropped",
       F::kGlm47,
       false,
       "<tool_call>search<arg_key>query</arg_key><arg_value>q</arg_value>{\"oops\": 1}"
       "</tool_call>Done.",
       "Done.",
       "",
       {{"search", R"({"query": "q"})"}}},
      // Llama 3.1 JSON.
      {"llama_single",
       F::kLlama31Json,
       false,
       "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
       "",
       "",
       {{"get_weather", R"({"location": "Paris"})"}}},
      {"llama_semicolon_separated",
       F::kLlama31Json,
       false,
       "\n\n{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}; {\"name\": "
       "\"get_time\", \"parameters\": {}}",
       "",
       "",
       {{"get_weather", R"({"location": "Paris"})"}, {"get_time", "{}"}}},
      {"llama_python_tag_arguments_key",
       F::kLlama31Json,
       false,
       "<|python_tag|>{\"name\": \"search\", \"arguments\": {\"query\": \"llama 3.1\", \"limit\": "
       "3}}",
       "",
       "",
       {{"search", R"({"query": "llama 3.1", "limit": 3})"}}},
      {"llama_plain_content",
       F::kLlama31Json,
       false,
       "The weather is {sunny} and a < b.",
       "The weather is {sunny} and a < b.",
       "",
       {}},
      {"llama_json_answer_not_a_call",
       F::kLlama31Json,
       false,
       "{\"answer\": 42}",
       "{\"answer\": 42}",
       "",
       {}},
      {"llama_unknown_tool",
       F::kLlama31Json,
       false,
       "{\"name\": \"launch\", \"parameters\": {\"target\": \"moon\"}}",
       "{\"name\": \"launch\", \"parameters\": {\"target\": \"moon\"}}",
       "",
       {}},
      {"llama_call_then_text",
       F::kLlama31Json,
       false,
       "{\"name\": \"get_time\", \"parameters\": {}} Let me know.",
       "Let me know.",
       "",
       {{"get_time", "{}"}}},
      {"llama_unterminated",
       F::kLlama31Json,
       false,
       "{\"name\": \"search\", \"parameters\": {\"query\": \"ll",
       "",
       "",
       {{"search", R"({"query": "ll"})"}}},
      {"llama_python_tag_code_is_content",
       F::kLlama31Json,
       false,
       "<|python_tag|>brave_search.call(query=\"x\")",
       "<|python_tag|>brave_search.call(query=\"x\")",
       "",
       {}},
  };
}

INSTANTIATE_TEST_SUITE_P(Recorded, ToolParserTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ToolParserStreamTest, NameArrivesWholeAndArgumentsStreamBeforeTheCallEnds) {
  ToolParserOptions o;
  o.format = ToolFormat::kHermes;
  o.tool_parameters = DeclaredTools();
  o.id_prefix = "call_abc_";
  OutputStreamParser p(o);
  EXPECT_TRUE(p.Feed("<tool_call>\n{\"name\": \"get_wea").empty());
  OutputDelta d = p.Feed("ther\", \"arguments\": {\"location\": \"Pa");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].id, "call_abc_0");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"location\": \"Pa");
  d = p.Feed("ris\"}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "");
  EXPECT_EQ(d.tool_calls[0].arguments, "ris\"}");
  EXPECT_TRUE(p.has_tool_calls());
  EXPECT_TRUE(p.Finish().empty());
}

TEST(ToolParserStreamTest, HeldMarkerPrefixIsReleasedWhenItIsNotAMarker) {
  ToolParserOptions o;
  o.format = ToolFormat::kGlm47;
  o.reasoning = true;
  o.tool_parameters = DeclaredTools();
  OutputStreamParser p(o);
  EXPECT_EQ(p.Feed("a </thi").reasoning_content, "a");
  EXPECT_EQ(p.Feed("ng> <tool_").reasoning_content, " </thing>");
  EXPECT_EQ(p.Feed("box>").reasoning_content, " <tool_box>");
  EXPECT_FALSE(p.has_tool_calls());
}

TEST(ToolParserStreamTest, GlmStringValueStreamsBeforeItsEnd) {
  ToolParserOptions o;
  o.format = ToolFormat::kGlm47;
  o.tool_parameters = DeclaredTools();
  OutputStreamParser p(o);
  OutputDelta d = p.Feed("<tool_call>run_code<arg_key>code</arg_key><arg_value>x = 1\ny");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "run_code");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"code\": \"x = 1\\ny");
}

// Texts stitched at random from the pieces the formats are made of (markers,
// names, JSON fragments, prose), so that most are malformed in some way: for
// every one, every two-chunk split and byte-at-a-time feeding must fold to
// the whole parse, and every call's arguments must be a JSON object.
TEST(ToolParserStreamTest, RandomlyStitchedTextsAreChunkingIndependent) {
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "<think>", "</think>", "<arg_key>", "</arg_key>",
      "<arg_value>", "</arg_value>", "<|python_tag|>", "\n", " ", ";", "{", "}", "[", "]", ",", ":",
      "\"", "\\", "{\"name\": \"get_time\"", "{\"name\": \"search\", ",
      "\"arguments\": ", "\"parameters\": {", "\"query\": \"a<b\"", "\"limit\": 12", "-1.5e",
      "true", "nul", "get_weather", "search", "query", "limit", "location", "Zürich", "a < b",
      "<tool_", "</thi", "text", "\"{\\\"q\\\": 1}\"", "\t",
      // Openings of real calls, so that many texts hold (possibly broken) calls.
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"",
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
      "<tool_call>search<arg_key>query</arg_key><arg_value>x",
      "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>",
      "{\"name\": \"search\", \"parameters\": {\"query\": \"", "\"}}", "\"}"};
  std::mt19937 rng(99);
  int calls_seen = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Case c;
    c.name = "random";
    c.format = static_cast<ToolFormat>(trial % 4);
    c.reasoning = (trial / 4) % 2 == 1;
    int n = 1 + rng() % 14;
    for (int i = 0; i < n; ++i) c.text += pieces[rng() % pieces.size()];
    ParsedOutput whole = ParseOutput(c.text, OptionsFor(c));
    calls_seen += static_cast<int>(whole.tool_calls.size());
    for (size_t i = 0; i <= c.text.size(); ++i) {
      std::string label = c.text + " | split at " + std::to_string(i);
      ASSERT_EQ(Diff(Stream(c, {i}, label), whole), "") << label;
    }
    std::vector<size_t> bytes;
    for (size_t i = 1; i < c.text.size(); ++i) bytes.push_back(i);
    ASSERT_EQ(Diff(Stream(c, bytes, c.text), whole), "") << c.text;
    for (const ToolCall& call : whole.tool_calls) {
      EXPECT_TRUE(json::parse(call.arguments, nullptr, false).is_object()) << c.text;
    }
  }
  EXPECT_GT(calls_seen, 0);  // the generator does reach calls
}

}  // namespace
}  // namespace ringlane::router
