// The tool-call grammar against the output parser: text a masked walk
// writes under ToolCallGrammar is text ParseOutput turns into calls of the
// declared tools, with arguments that are JSON objects of their schemas, in
// every tool-call format.
#include "router/request/tool_grammar.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/errors.h"
#include "router/request/tool_parser.h"

namespace ringlane::router {
namespace {

using grammar::Matcher;
using grammar::TokenMasker;
using grammar::TokenVocabulary;
using ::testing::HasSubstr;

const nlohmann::ordered_json& Tools() {
  static const auto* t = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]},
                     "days": {"type": "integer"}},
      "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "time"}}])"));
  return *t;
}

// Printable ASCII, newline, a few longer pieces, and a stop token last.
std::shared_ptr<const TokenVocabulary> Vocab() {
  auto v = std::make_shared<TokenVocabulary>();
  for (char c = 0x20; c < 0x7f; ++c) v->mid.push_back(std::string(1, c));
  for (const char* s : {"\n", "<tool_call>", "</tool_call>", "\"name\"", "<arg_key>",
                        "</arg_value>", "ity", "</s>"}) {
    v->mid.push_back(s);
  }
  v->first = v->mid;
  v->special.assign(v->mid.size(), false);
  v->special.back() = true;
  return v;
}

bool Bit(const std::string& mask, int32_t t) {
  return (static_cast<uint8_t>(mask[t / 8]) >> (t % 8)) & 1;
}

// Masked random walks; each that stops is parsed. Returns the parsed
// outputs of the walks that stopped.
std::vector<ParsedOutput> Walks(ToolFormat format, std::string_view function, bool single,
                                int walks) {
  auto vocab = Vocab();
  const int32_t stop = static_cast<int32_t>(vocab->mid.size()) - 1;
  TokenMasker masker(vocab, {stop});
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g =
      ToolCallGrammar(format, Tools(), function, single);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return {};
  ToolParserOptions options;
  options.format = format;
  for (const auto& t : Tools()) {
    options.tool_parameters[t["function"]["name"].get<std::string>()] =
        nlohmann::json(t["function"].value("parameters", nlohmann::ordered_json()));
  }
  options.id_prefix = "call_";
  std::mt19937 rng(42);
  std::vector<ParsedOutput> out;
  for (int w = 0; w < walks; ++w) {
    Matcher m(*g);
    std::string text;
    bool stopped = false;
    for (int step = 0; step < 1500 && !stopped; ++step) {
      const std::string mask = masker.Mask(m, step == 0);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < masker.vocab_size(); ++t) {
        if (Bit(mask, t)) allowed.push_back(t);
      }
      EXPECT_FALSE(allowed.empty()) << text;
      if (allowed.empty()) break;
      int32_t t = allowed[rng() % allowed.size()];
      // Past a while, head for the end: the stop, a closing tag, a quote
      // or brace, a digit, in that order.
      if (step > 120) {
        int best = 99;
        for (int32_t c : allowed) {
          const std::string& b = vocab->mid[c];
          const int rank = c == stop                    ? 0
                           : b.rfind("</", 0) == 0      ? 1
                           : b == "\"" || b == "}"      ? 2
                           : b == "\n" && rng() % 2     ? 3
                           : b[0] >= '0' && b[0] <= '9' ? 4
                                                        : 99;
          if (rank < best) best = rank, t = c;
        }
      }
      if (t == stop) {
        stopped = true;
        break;
      }
      text += vocab->mid[t];
      EXPECT_TRUE(masker.Advance(&m, step == 0, t));
    }
    if (!stopped) continue;
    EXPECT_TRUE(m.Accepting()) << text;
    ParsedOutput p = ParseOutput(text, options);
    EXPECT_FALSE(p.tool_calls.empty()) << text;
    EXPECT_EQ(p.content, "") << text;
    out.push_back(std::move(p));
  }
  EXPECT_GE(out.size(), static_cast<size_t>(walks / 2)) << "too few walks stopped to check";
  return out;
}

void CheckCalls(const ParsedOutput& p) {
  for (const ToolCall& c : p.tool_calls) {
    const nlohmann::json args = nlohmann::json::parse(c.arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << c.name << " " << c.arguments;
    if (c.name == "time") {
      EXPECT_TRUE(args.empty()) << c.arguments;
      continue;
    }
    ASSERT_EQ(c.name, "weather");
    ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << c.arguments;
    EXPECT_LE(args["city"].get<std::string>().size(), 6u) << c.arguments;
    ASSERT_TRUE(args.contains("unit")) << c.arguments;
    EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << c.arguments;
    if (args.contains("days")) EXPECT_TRUE(args["days"].is_number_integer()) << c.arguments;
    for (const auto& [k, v] : args.items()) {
      EXPECT_TRUE(k == "city" || k == "unit" || k == "days") << c.arguments;
    }
  }
}

TEST(ToolGrammarTest, MaskedOutputParsesIntoCallsOfTheDeclaredTools) {
  for (ToolFormat f :
       {ToolFormat::kHermes, ToolFormat::kGlm45, ToolFormat::kGlm47, ToolFormat::kLlama31Json}) {
    SCOPED_TRACE(static_cast<int>(f));
    size_t several = 0;
    for (const ParsedOutput& p : Walks(f, "", false, 20)) {
      CheckCalls(p);
      several += p.tool_calls.size() > 1;
    }
    EXPECT_GT(several, 0u) << "required allows several calls; no walk wrote two";
    for (const ParsedOutput& p : Walks(f, "", true, 10)) {
      EXPECT_EQ(p.tool_calls.size(), 1u);
      CheckCalls(p);
    }
    for (const ParsedOutput& p : Walks(f, "weather", false, 10)) {
      ASSERT_EQ(p.tool_calls.size(), 1u);
      EXPECT_EQ(p.tool_calls[0].name, "weather");
      CheckCalls(p);
    }
  }
}

TEST(ToolGrammarTest, WhatTheGrammarCannotExpressNamesItsField) {
  auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}}}])");
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g =
      ToolCallGrammar(ToolFormat::kHermes, tools, "", false);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("tools[0].function.parameters.properties.x"));
  g = ToolCallGrammar(ToolFormat::kHermes, tools, "nope", false);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(ParamOf(g.status()), "constraint.tool_function");
}

}  // namespace
}  // namespace ringlane::router
