#include "router/grammar/grammar.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/grammar/synthetic_vocabulary.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router::grammar {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> SchemaGrammar(const std::string& schema) {
  auto g = JsonSchemaGrammar(Json::parse(schema), "schema");
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

// The index of the first byte refused, -1 when all are taken, -2 when all
// are taken but the text is incomplete.
int FirstRefused(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  Matcher m(g);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!m.Advance(text.substr(i, 1))) return static_cast<int>(i);
  }
  return m.Accepting() ? -1 : -2;
}

struct Case {
  const char* schema;  // nullptr: json_object
  std::string text;
  int want;  // as Run returns
};

class SchemaCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(SchemaCaseTest, ByteByByteAndWhole) {
  const Case& c = GetParam();
  auto g = c.schema == nullptr ? JsonObjectGrammar() : SchemaGrammar(c.schema);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(FirstRefused(g, c.text), c.want) << c.text;
  Matcher whole(g);
  const bool ok = whole.Advance(c.text);
  EXPECT_EQ(ok, c.want < 0) << c.text;
  if (ok) EXPECT_EQ(whole.Accepting(), c.want == -1);
  // A refused Advance leaves the matcher as it was.
  if (!ok) EXPECT_EQ(whole.Advance(c.text.substr(0, c.want)), true);
}

const char kPerson[] = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},
  "required":["name","age"],"additionalProperties":false})";
const char kEnum[] = R"({"enum":["red","green",1,null]})";
const char kConst[] = R"({"const":{"a":[1,2]}})";
const char kAnyOf[] = R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2},
  {"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"]}]})";
const char kTree[] = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
  "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})";
const char kArr[] = R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})";
const char kStr[] = R"({"type":"string","minLength":2,"maxLength":3})";
const char kPrefix[] =
    R"({"type":"array","prefixItems":[{"type":"string"},{"type":"null"}],"minItems":1})";
const char kOptOrder[] = R"({"type":"object","properties":{"a":{"type":"integer"},
  "b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"]})";
const char kTypes[] = R"({"type":["string","null"]})";
const char kMap[] = R"({"type":"object","additionalProperties":{"type":"integer"}})";

INSTANTIATE_TEST_SUITE_P(
    Schemas, SchemaCaseTest,
    ::testing::Values(
        Case{nullptr, R"({})", -1},
        Case{nullptr, R"({"a": [1, 2.5e3, true, null, {"b": "c"}]})", -1},
        Case{nullptr, "{\n  \"a\": 1\n}", -1}, Case{nullptr, R"( {})", 0},
        Case{nullptr, R"({} )", 2}, Case{nullptr, R"([])", 0}, Case{nullptr, R"({"a":01})", 6},
        Case{nullptr, R"({"a":"\u00e9\ud83d\ude00"})", -1}, Case{nullptr, R"({"a":"\ud83d"})", 12},
        Case{nullptr, "{\"a\":\"\x01\"}", 6}, Case{nullptr, "{\"\xc3\xa9\":1}", -1},
        Case{nullptr, "{\"\xc0\xaf\":1}", 2}, Case{nullptr, "{\"\xed\xa0\x80\":1}", 3},
        Case{nullptr, R"({"a":"\q"})", 7}, Case{nullptr, R"({"a":1)", -2},
        Case{nullptr, R"({"a":-1.5E+99})", -1}, Case{nullptr, R"({"a":1e100})", 9},
        Case{nullptr, "{   \"a\":1}", 2}, Case{nullptr, "{\"a\":12345678901234567}", 21},
        Case{kPerson, R"({"name":"Bo","age":3})", -1},
        Case{kPerson, R"({"name":"Bo","age":3,"tags":["x","y"]})", -1},
        Case{kPerson, R"({"age":3,"name":"Bo"})", 2}, Case{kPerson, R"({"name":"Bo"})", 12},
        Case{kPerson, R"({"name":"Bo","age":3.5})", 20},
        Case{kPerson, R"({"name":"Bo","age":3,"x":1})", 22}, Case{kEnum, R"("red")", -1},
        Case{kEnum, R"(1)", -1}, Case{kEnum, R"(null)", -1}, Case{kEnum, R"("blue")", 1},
        Case{kConst, R"({"a":[1,2]})", -1}, Case{kConst, R"({"a":[1,3]})", 8},
        Case{kAnyOf, "12", -1}, Case{kAnyOf, R"("ab")", -1}, Case{kAnyOf, R"("abc")", 3},
        Case{kAnyOf, R"({"x":true})", -1}, Case{kAnyOf, R"(true)", 0},
        Case{kTree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})", -1},
        Case{kTree, R"({"v":1,"kids":[{"kids":[]}]})", 17}, Case{kArr, "[1]", -1},
        Case{kArr, "[1, 2,3]", -1}, Case{kArr, "[]", 1}, Case{kArr, "[1,2,3,4]", 6},
        Case{kStr, R"("ab")", -1}, Case{kStr, "\"\xe2\x82\xac\\n\"", -1}, Case{kStr, R"("a")", 2},
        Case{kStr, R"("abcd")", 4}, Case{kPrefix, R"(["a",null])", -1},
        Case{kPrefix, R"(["a"])", -1}, Case{kPrefix, R"(["a",null,1])", 9},
        Case{kPrefix, R"([])", 1}, Case{kOptOrder, R"({"b":1})", -1},
        Case{kOptOrder, R"({"a":1,"b":2,"c":3})", -1}, Case{kOptOrder, R"({"b":1,"c":2})", -1},
        Case{kOptOrder, R"({"b":1,"a":2})", 8}, Case{kOptOrder, R"({})", 1},
        Case{kTypes, R"(null)", -1}, Case{kTypes, R"("x")", -1}, Case{kTypes, R"(1)", 0},
        Case{kMap, R"({"x":1,"y":2})", -1}, Case{kMap, R"({"x":"1"})", 5}));

TEST(GrammarTest, DeclarationOrderWithOrderedJson) {
  // ordered_json keeps "z" before "a"; nlohmann::json sorts them.
  const char schema[] =
      R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"integer"}},"required":["z","a"]})";
  auto ordered = JsonSchemaGrammar(Json::parse(schema), "s");
  ASSERT_TRUE(ordered.ok());
  EXPECT_EQ(FirstRefused(*ordered, R"({"z":1,"a":2})"), -1);
  auto sorted = JsonSchemaGrammar(nlohmann::json::parse(schema), "s");
  ASSERT_TRUE(sorted.ok());
  EXPECT_EQ(FirstRefused(*sorted, R"({"a":2,"z":1})"), -1);
}

TEST(GrammarTest, InvalidAndUnsupportedSchemas) {
  struct Bad {
    const char* schema;
    const char* message;
  };
  const Bad cases[] = {
      {R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})",
       "response_format.json_schema.schema.properties.age.minimum: not supported"},
      {R"({"type":"string","pattern":"a+"})", "schema.pattern: not supported"},
      {R"({"type":"string","format":"email"})", "schema.format: not supported"},
      {R"({"not":{}})", "schema.not: not supported"},
      {R"({"type":"strin"})", "schema.type: unknown type"},
      {R"({"type":"object","properties":{"a":{}},"required":"a"})", "schema.required: must be"},
      {R"({"type":"object","properties":{"a":{}},"required":[1]})", "schema.required: must be"},
      {R"({"$ref":"#/$defs/missing"})", "schema.$ref: \"#/$defs/missing\" not found"},
      {R"({"anyOf":[{"type":"integer"},{"type":"bogus"}]})", "schema.anyOf[1].type: unknown type"},
      {R"({"allOf":[{},{}]})", "schema.allOf: only a single element"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "schema.required: \"b\""},
      {R"({"type":"array","minItems":3,"maxItems":2})", "schema.maxItems"},
      {R"(3)", "schema: a schema must be"},
  };
  for (const Bad& c : cases) {
    std::string prefix = std::string(c.message).rfind("response_format", 0) == 0
                             ? "response_format.json_schema.schema"
                             : "schema";
    auto g = JsonSchemaGrammar(Json::parse(c.schema), prefix);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.schema;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.message)) << c.schema;
  }
}

TEST(GrammarTest, IgnoredAnnotations) {
  auto g = SchemaGrammar(
      R"({"$schema":"x","title":"t","description":"d","type":"integer","default":1,"examples":[2]})");
  EXPECT_EQ(FirstRefused(g, "42"), -1);
}

TEST(GrammarTest, TextUntilAndBuilderPieces) {
  GrammarBuilder b;
  auto text = b.TextUntil("</v>");
  auto g = b.Build(b.Seq({b.Literal("<v>"), text, b.Literal("</v>")}));
  EXPECT_EQ(FirstRefused(g, "<v>a < b </ c \xe2\x82\xac</v>"), -1);
  EXPECT_EQ(FirstRefused(g, "<v>ab</v>x"), 9);
  EXPECT_EQ(FirstRefused(g, "<v>\xff"), 3);
  Matcher m(g);
  ASSERT_TRUE(m.Advance("<v>x</v>"));
  EXPECT_TRUE(m.Finished());

  GrammarBuilder b2;
  auto g2 = b2.Build(b2.Repeat(b2.Alt({b2.Literal("ab"), b2.Literal("a")}), 2, 3));
  EXPECT_EQ(FirstRefused(g2, "aab"), -1);
  EXPECT_EQ(FirstRefused(g2, "a"), -2);
  EXPECT_EQ(FirstRefused(g2, "ababab"), -1);
  EXPECT_EQ(FirstRefused(g2, "abababa"), 6);
  // Bounded raw text counts characters and leaves out the terminator's
  // first byte.
  GrammarBuilder bt;
  auto gt = bt.Build(bt.Seq({bt.TextUntil("</v>", 1, 3), bt.Literal("</v>")}));
  EXPECT_EQ(FirstRefused(gt, "\xe2\x82\xac\xc3\xa9b</v>"), -1);
  EXPECT_EQ(FirstRefused(gt, "</v>"), 0);
  EXPECT_EQ(FirstRefused(gt, "a<b</v>"), 2);  // "<" starts the terminator
  EXPECT_EQ(FirstRefused(gt, "abcd</v>"), 3);
  GrammarBuilder b3;
  auto g3 = b3.Build(b3.Repeat(b3.Repeat(b3.Literal("x"), 0, -1), 0, -1));  // nullable in a star
  EXPECT_EQ(FirstRefused(g3, "xxxx"), -1);
  EXPECT_EQ(FirstRefused(g3, ""), -1);
}

// ---- TokenMasker ----

bool Bit(const std::string& mask, int t) { return (mask[t >> 3] >> (t & 7)) & 1; }

std::shared_ptr<const TokenVocabulary> SmallVocab() {
  auto v = std::make_shared<TokenVocabulary>();
  // 0 "{" 1 "\"" 2 "a" 3 "ab" 4 "\"}" 5 " " 6 "}" 7 <special> 8 <stop> 9 unused
  // 10 ":" 11 "1" 12 " {" (first: "{")
  v->mid = {"{", "\"", "a", "ab", "\"}", " ", "}", "<s>", "</s>", "", ":", "1", " {"};
  v->first = v->mid;
  v->first[12] = "{";
  v->special = {false, false, false, false, false, false, false,
                true,  true,  false, false, false, false};
  v->mid[7] = v->first[7] = v->mid[8] = v->first[8] = "";
  return v;
}

std::vector<int> Bits(const std::string& mask, int n) {
  std::vector<int> out;
  for (int t = 0; t < n; ++t) {
    if (Bit(mask, t)) out.push_back(t);
  }
  return out;
}

TEST(TokenMaskerTest, SmallVocabularyExactBits) {
  TokenMasker masker(SmallVocab(), {8});
  ASSERT_EQ(masker.vocab_size(), 13);
  Matcher m(JsonObjectGrammar());
  EXPECT_THAT(Bits(masker.Mask(m, /*at_start=*/true), 13), ::testing::ElementsAre(0, 12));
  EXPECT_THAT(Bits(masker.Mask(m, /*at_start=*/false), 13), ::testing::ElementsAre(0));
  Matcher open = m;
  ASSERT_TRUE(masker.Advance(&open, true, 12));  // " {" at the start is "{"
  EXPECT_THAT(Bits(masker.Mask(open, false), 13), ::testing::ElementsAre(1, 4, 5, 6));
  Matcher spaced = open;
  ASSERT_TRUE(masker.Advance(&spaced, false, 5));
  EXPECT_THAT(Bits(masker.Mask(spaced, false), 13), ::testing::ElementsAre(1, 4, 6));
  Matcher key = open;
  ASSERT_TRUE(masker.Advance(&key, false, 1));
  EXPECT_THAT(Bits(masker.Mask(key, false), 13),
              ::testing::ElementsAre(0, 1, 2, 3, 5, 6, 10, 11, 12));
  Matcher done = open;
  ASSERT_TRUE(masker.Advance(&done, false, 6));
  EXPECT_TRUE(done.Finished());
  EXPECT_THAT(Bits(masker.Mask(done, false), 13), ::testing::ElementsAre(8));
  EXPECT_TRUE(masker.Advance(&done, false, 8));
  EXPECT_FALSE(masker.Advance(&open, false, 8));
  EXPECT_FALSE(masker.Allows(open, false, 7));
  EXPECT_FALSE(masker.Allows(open, false, 9));
  EXPECT_FALSE(masker.Allows(open, false, 13));
  EXPECT_FALSE(masker.Allows(open, false, -1));
  // Mask agrees with Allows for every token in every state above.
  for (const Matcher* s : {&m, &open, &spaced, &key, &done}) {
    for (bool at_start : {true, false}) {
      const std::string mask = masker.Mask(*s, at_start);
      for (int t = 0; t < 13; ++t) EXPECT_EQ(Bit(mask, t), masker.Allows(*s, at_start, t)) << t;
    }
  }
}

// Walks choosing only masked tokens; every walk must end in a state whose
// text nlohmann::json parses.
void RandomWalks(const std::shared_ptr<const Grammar>& g, const TokenVocabulary& vocab,
                 const TokenMasker& masker, int32_t stop, int walks) {
  std::mt19937 rng(1234);
  int finished = 0;
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    std::string text;
    bool stopped = false;
    for (int step = 0; step < 400 && !stopped; ++step) {
      const bool at_start = step == 0;
      const std::string mask = masker.Mask(m, at_start);
      EXPECT_EQ(mask, masker.Mask(m, at_start));  // same state, same mask
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < masker.vocab_size(); ++t) {
        if (Bit(mask, t)) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      int32_t t = allowed[rng() % allowed.size()];
      // Past some steps, head for the end: stop when allowed, else prefer
      // closing bytes.
      if (step > 40) {
        if (Bit(mask, stop)) t = stop;
        for (int32_t c : allowed) {
          const std::string& b = vocab.mid[c];
          if (!b.empty() && (b[0] == '}' || b[0] == ']' || b[0] == '"') && rng() % 2) t = c;
        }
      }
      ASSERT_TRUE(masker.Allows(m, at_start, t));
      if (t == stop) {
        stopped = true;
        break;
      }
      text += at_start ? vocab.first[t] : vocab.mid[t];
      ASSERT_TRUE(masker.Advance(&m, at_start, t));
    }
    if (!stopped) continue;  // bounded steps; not every walk closes in time
    ++finished;
    EXPECT_TRUE(m.Accepting());
    EXPECT_TRUE(nlohmann::json::accept(text)) << text;
  }
  // Most walks must get to a stop, or the check above proves little.
  EXPECT_GE(finished, walks / 2);
}

std::shared_ptr<const TokenVocabulary> JsonishVocab() {
  auto v = std::make_shared<TokenVocabulary>();
  for (const char* s : {"{",     "}",        "[",    "]",     "\"",       ",",       ":",
                        " ",     "\n",       "  ",   "a",     "b",        "ab",      "1",
                        "0",     "-",        ".",    "e",     "+",        "2",       "\\",
                        "n",     "u",        "00",   "e9",    "\xc3",     "\xa9",    "\xe2\x82\xac",
                        "true",  "false",    "null", "\"a\"", "\":",      "\",",     "x",
                        "y",     "\"}",      "}]",   "},",    "\"name\"", "\"age\"", "\"kids\"",
                        "\"v\"", "\"tags\"", "red",  "green", "</s>"}) {
    v->mid.push_back(s);
  }
  // Every printable ASCII byte too, so no walk is stuck for want of a token.
  for (char c = 0x20; c < 0x7f; ++c) v->mid.insert(v->mid.end() - 1, std::string(1, c));
  v->first = v->mid;
  v->special.assign(v->mid.size(), false);
  v->special.back() = true;
  return v;
}

TEST(TokenMaskerTest, RandomWalksEndInValidJson) {
  auto vocab = JsonishVocab();
  const int32_t stop = static_cast<int32_t>(vocab->mid.size()) - 1;
  TokenMasker masker(vocab, {stop});
  RandomWalks(JsonObjectGrammar(), *vocab, masker, stop, 30);
  RandomWalks(SchemaGrammar(kPerson), *vocab, masker, stop, 30);
  RandomWalks(SchemaGrammar(kTree), *vocab, masker, stop, 30);
  RandomWalks(SchemaGrammar(kEnum), *vocab, masker, stop, 10);
  RandomWalks(SchemaGrammar(kArr), *vocab, masker, stop, 20);
}

TEST(TokenMaskerTest, BundledTokenizer) {
  auto tok =
      LoadTokenizer(std::string(RINGLANE_SOURCE_DIR) + "/deploy/models/stories260K/tok512.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto vocab = TokenVocabulary::FromTokenizer(**tok);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  TokenMasker masker(*vocab, (*tok)->StopIds());
  Matcher m(JsonObjectGrammar());
  const auto t0 = std::chrono::steady_clock::now();
  const std::string mask = masker.Mask(m, /*at_start=*/true);
  const auto t1 = std::chrono::steady_clock::now();
  int brace = 0;
  for (int32_t t = 0; t < masker.vocab_size(); ++t) {
    const std::string& first = (*vocab)->first[t];
    if (first == "{") {
      EXPECT_TRUE(Bit(mask, t));
      ++brace;
    }
    if (first.size() == 1 && std::isalpha(static_cast<unsigned char>(first[0]))) {
      EXPECT_FALSE(Bit(mask, t)) << t;
    }
    EXPECT_EQ(Bit(mask, t), masker.Allows(m, true, t)) << t;
  }
  EXPECT_GT(brace, 0);
  // Inside a string most of the vocabulary is allowed: the expensive case.
  Matcher in_string = m;
  ASSERT_TRUE(in_string.Advance("{\"k"));
  const auto t2 = std::chrono::steady_clock::now();
  const std::string mask2 = masker.Mask(in_string, false);
  const auto t3 = std::chrono::steady_clock::now();
  for (int32_t t = 0; t < masker.vocab_size(); ++t) {
    EXPECT_EQ(Bit(mask2, t), masker.Allows(in_string, false, t)) << t;
  }
  std::printf("mask of %d tokens: start %.3f ms, in a string %.3f ms\n", masker.vocab_size(),
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t3 - t2).count());
}

// A synthetic 32k vocabulary of random ASCII and UTF-8 pieces, to measure
// (not assert) mask time at a realistic size.
TEST(TokenMaskerTest, Synthetic32kVocabulary) {
  auto v = SyntheticVocabulary(32000);
  TokenMasker masker(v, {});
  auto g = SchemaGrammar(kPerson);
  Matcher m(g);
  ASSERT_TRUE(m.Advance("{\"name\":\"B"));
  Matcher num(g);
  ASSERT_TRUE(num.Advance("{\"name\":\"B\",\"age\":"));
  for (const Matcher* s : {&m, &num}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string mask = masker.Mask(*s, false);
    const auto t1 = std::chrono::steady_clock::now();
    int allowed = 0;
    for (int32_t t = 0; t < masker.vocab_size(); t += 97) {
      EXPECT_EQ(Bit(mask, t), masker.Allows(*s, false, t)) << t;
    }
    for (int32_t t = 0; t < masker.vocab_size(); ++t) allowed += Bit(mask, t);
    std::printf("32k mask: %.3f ms, %d allowed\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count(), allowed);
  }
}

}  // namespace
}  // namespace ringlane::router::grammar
