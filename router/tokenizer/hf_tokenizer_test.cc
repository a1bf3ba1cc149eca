#include "router/tokenizer/hf_tokenizer.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kTestdata[] = RINGLANE_SOURCE_DIR "/router/tokenizer/testdata";

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

// Loads testdata/<name> through the factory; null (and a skip) when the
// build lacks what the fixture needs (qwen2's NFC without ICU).
std::unique_ptr<Tokenizer> LoadFixture(const std::string& name) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      LoadTokenizer(std::string(kTestdata) + "/" + name);
  if (tok.status().code() == absl::StatusCode::kUnimplemented) {
    EXPECT_THAT(tok.status().message(), HasSubstr("NFC")) << tok.status();
    return nullptr;
  }
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// expected.json holds what @huggingface/tokenizers (the reference) produced
// for each fixture; see testdata/README.md.
class ReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tok_ = LoadFixture(GetParam());
    if (tok_ == nullptr && !HasFailure()) GTEST_SKIP() << "built without ICU";
    ASSERT_NE(tok_, nullptr);
    cases_ = ReadJson(std::string(kTestdata) + "/expected.json")["fixtures"][GetParam()]["cases"];
    ASSERT_GE(cases_.size(), 30u);
  }

  std::unique_ptr<Tokenizer> tok_;
  json cases_;
};

TEST_P(ReferenceTest, EncodeMatchesReference) {
  EXPECT_EQ(tok_->format(), "tokenizer.json");
  for (const json& c : cases_) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(::testing::PrintToString(text));
    absl::StatusOr<std::vector<int32_t>> ids = tok_->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(c["ids"].get<std::vector<int32_t>>()));
    ids = tok_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(c["ids_plain"].get<std::vector<int32_t>>()));
  }
}

TEST_P(ReferenceTest, DecodeMatchesReference) {
  for (const json& c : cases_) {
    if (!c.contains("decoded")) continue;
    SCOPED_TRACE(::testing::PrintToString(c["text"].get<std::string>()));
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    absl::StatusOr<std::string> text = tok_->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c["decoded"].get<std::string>());
    text = tok_->Decode(ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c["decoded_all"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceTest,
                         ::testing::Values("byte_level", "gpt2", "qwen2", "sp_bpe", "metaspace"));

TEST(HfTokenizerTest, LookupsAndSpecialTokens) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("byte_level");
  ASSERT_NE(tok, nullptr);
  const std::optional<int32_t> bot = tok->TokenToId("<|begin_of_text|>");
  const std::optional<int32_t> eot = tok->TokenToId("<|end_of_text|>");
  const std::optional<int32_t> tool = tok->TokenToId("<tool_call>");
  ASSERT_TRUE(bot && eot && tool);
  EXPECT_EQ(tok->bos_id(), *bot);
  EXPECT_EQ(tok->eos_id(), *eot);
  EXPECT_THAT(tok->StopIds(), ElementsAre(*eot));
  EXPECT_TRUE(tok->IsSpecial(*bot));
  EXPECT_FALSE(tok->IsSpecial(*tool));
  EXPECT_FALSE(tok->IsSpecial(0));
  EXPECT_EQ(tok->vocab_size(), *tool + 1);
  EXPECT_EQ(tok->IdToToken(*bot), "<|begin_of_text|>");
  EXPECT_EQ(tok->IdToToken(tok->vocab_size()), "");
  // The byte-level alphabet: byte 0x20 is "Ġ", byte 'a' is itself.
  EXPECT_EQ(tok->IdToToken(32), "\xC4\xA0");
  EXPECT_EQ(tok->TokenToId("a"), 97);
  EXPECT_EQ(tok->TokenToId("no such token"), std::nullopt);
  absl::StatusOr<std::string> bytes = tok->TokenBytes(32);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, " ");
  bytes = tok->TokenBytes(*bot);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, "<|begin_of_text|>");
}

TEST(HfTokenizerTest, ConfigSuppliesBosAndEos) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("sp_bpe");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_THAT(tok->StopIds(), ElementsAre(2));
}

TEST(HfTokenizerTest, RejectsInvalidUtf8AndBadIds) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("byte_level");
  ASSERT_NE(tok, nullptr);
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode("ok\xC3(", true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << ids.status();
  EXPECT_THAT(ids.status().message(), HasSubstr("byte 2"));
  absl::StatusOr<std::string> text = tok->Decode({97, tok->vocab_size()});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr("position 1"));
  text = tok->Decode({-1});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
}

TEST(HfTokenizerTest, LongInputsEncodeAndRoundTrip) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("byte_level");
  ASSERT_NE(tok, nullptr);
  // A long whitespace run exercises \s+(?!\S), which needs more backtracking
  // stack than PCRE2's JIT has by default.
  std::string text(200000, ' ');
  text += "x";
  std::string words;
  for (int i = 0; i < 20000; ++i) words += "The quick brown fox, 12345 times; ";
  for (const std::string& t : {text, words}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(t, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    absl::StatusOr<std::string> back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == t);
  }
}

TEST(HfTokenizerTest, ConcurrentEncodesAgree) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("byte_level");
  ASSERT_NE(tok, nullptr);
  const std::string text = "Once upon a time, 12345 emoji 😀 and café. ";
  const absl::StatusOr<std::vector<int32_t>> want = tok->Encode(text, true);
  ASSERT_TRUE(want.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::vector<int32_t>> got = tok->Encode(text, true);
        if (!got.ok() || *got != *want) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// Hand-written tokenizers for behaviour the fixtures do not cover.

// A vocabulary whose merges show where pieces were cut: "b▁" merges first, so
// it appears only when "b" and "▁" share a piece.
std::string MiniTokenizer(const std::string& pre_tokenizer, const std::string& extra = "") {
  return R"({
    "added_tokens": [], "normalizer": null, "post_processor": null, "decoder": null,
    "pre_tokenizer": )" +
         pre_tokenizer + extra + R"(,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "-": 2, "a-": 3, "-b": 4, "--": 5,
              "ab": 6, "▁": 7, "▁a": 8, "▁ab": 9, "1": 10, "11": 11, "b▁": 12},
              "merges": [["b", "▁"], ["a", "-"], ["-", "b"], ["-", "-"], ["a", "b"],
                         ["▁", "a"], ["▁a", "b"], ["1", "1"]]}})";
}

std::vector<int32_t> EncodeWith(const std::string& tokenizer_json, const std::string& text) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok =
      HfTokenizer::FromJson(tokenizer_json, "", "mini");
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return {-1};
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text, true);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{-1};
}

std::string SplitOn(const std::string& behavior, bool invert = false) {
  return R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

TEST(HfTokenizerTest, SplitBehaviors) {
  EXPECT_THAT(EncodeWith(MiniTokenizer("null"), "a-b"), ElementsAre(3, 1));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("Removed")), "a-b"), ElementsAre(0, 1));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("Isolated")), "a--b"), ElementsAre(0, 2, 2, 1));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("MergedWithPrevious")), "a-b"), ElementsAre(3, 1));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("MergedWithPrevious")), "a--b"),
              ElementsAre(3, 2, 1));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("MergedWithNext")), "a-b"), ElementsAre(0, 4));
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("Contiguous")), "a--b"), ElementsAre(0, 5, 1));
  // Inverted, the dashes are the content and "Removed" drops the rest.
  EXPECT_THAT(EncodeWith(MiniTokenizer(SplitOn("Removed", true)), "a--b"), ElementsAre(2, 2));
}

TEST(HfTokenizerTest, MetaspaceSplitsBeforeEachReplacement) {
  const auto metaspace = [](const char* scheme, bool split) {
    return std::string(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": ")") +
           scheme + R"(", "split": )" + (split ? "true" : "false") + "}";
  };
  EXPECT_THAT(EncodeWith(MiniTokenizer(metaspace("never", false)), "ab ab"), ElementsAre(0, 12, 6));
  EXPECT_THAT(EncodeWith(MiniTokenizer(metaspace("never", true)), "ab ab"), ElementsAre(6, 7, 6));
  // "ab" merges before "▁a", and there is no ("▁", "ab") merge.
  EXPECT_THAT(EncodeWith(MiniTokenizer(metaspace("always", true)), "ab ab"),
              ElementsAre(7, 6, 7, 6));
  EXPECT_THAT(EncodeWith(MiniTokenizer(metaspace("first", true)), "b a"), ElementsAre(7, 1, 8));
}

TEST(HfTokenizerTest, DigitsPreTokenizer) {
  EXPECT_THAT(EncodeWith(MiniTokenizer(R"({"type": "Digits", "individual_digits": true})"), "111"),
              ElementsAre(10, 10, 10));
  EXPECT_THAT(EncodeWith(MiniTokenizer(R"({"type": "Digits", "individual_digits": false})"), "111"),
              ElementsAre(11, 10));
}

TEST(HfTokenizerTest, AddedTokenStripAndSingleWord) {
  const std::string json = R"({
    "added_tokens": [
      {"id": 20, "content": "<L>", "lstrip": true, "special": true},
      {"id": 21, "content": "<R>", "rstrip": true, "special": true},
      {"id": 22, "content": "ab", "single_word": true, "special": false, "normalized": false}],
    "normalizer": null, "post_processor": null, "decoder": null,
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, " ": 2, "<": 3, ">": 4, "L": 5, "R": 6},
              "merges": []}})";
  // Whitespace the token strips never reaches the model; WhitespaceSplit
  // drops the rest.
  EXPECT_THAT(EncodeWith(json, "a  <L>  b"), ElementsAre(0, 20, 1));
  EXPECT_THAT(EncodeWith(json, "a<R>  b"), ElementsAre(0, 21, 1));
  // single_word: "ab" is the token only when it stands alone.
  EXPECT_THAT(EncodeWith(json, "ab aab ab"), ElementsAre(22, 0, 0, 1, 22));
}

TEST(HfTokenizerTest, ConfigOverridesTemplate) {
  const std::string json = R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true},
                     {"id": 4, "content": "</s>", "special": true}],
    "normalizer": null, "pre_tokenizer": null, "decoder": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})";
  const auto encode = [&](const std::string& config) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> tok = HfTokenizer::FromJson(json, config, "t");
    EXPECT_TRUE(tok.ok()) << tok.status();
    return tok.ok() ? (*tok)->Encode("ab", true).value() : std::vector<int32_t>{};
  };
  EXPECT_THAT(encode(""), ElementsAre(3, 0, 1));
  EXPECT_THAT(encode(R"({"add_bos_token": false, "bos_token": "<s>"})"), ElementsAre(0, 1));
  EXPECT_THAT(encode(R"({"add_eos_token": true, "eos_token": {"content": "</s>"}})"),
              ElementsAre(3, 0, 1, 4));
}

TEST(HfTokenizerTest, NoDecoderJoinsTokensWithSpaces) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok =
      HfTokenizer::FromJson(MiniTokenizer("null"), "", "mini");
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::string> text = (*tok)->Decode({3, 1, 9});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "a- b ▁ab");
}

TEST(HfTokenizerTest, UnicodeNormalizerOrUnimplemented) {
  const std::string json = R"({
    "added_tokens": [], "normalizer": {"type": "NFKC"}, "pre_tokenizer": null,
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"f": 0, "i": 1, "fi": 2}, "merges": [["f", "i"]]}})";
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok = HfTokenizer::FromJson(json, "", "nfkc");
  if (!tok.ok()) {
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented) << tok.status();
    EXPECT_THAT(tok.status().message(), HasSubstr("NFKC"));
    GTEST_SKIP() << "built without ICU";
  }
  // U+FB01 (the "fi" ligature) becomes "fi" under NFKC.
  EXPECT_THAT((*tok)->Encode("\xEF\xAC\x81", false).value(), ElementsAre(2));
}

struct BadCase {
  const char* name;
  std::string json;
  absl::StatusCode code;
  const char* message;
};

TEST(HfTokenizerTest, LoadErrorsNameTheProblem) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})";
  const std::vector<BadCase> cases = {
      {"not json", "{", absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"no model", "{}", absl::StatusCode::kInvalidArgument, "model"},
      {"unigram", R"({"model": {"type": "Unigram", "vocab": []}})",
       absl::StatusCode::kUnimplemented, "Unigram"},
      {"merge out of vocab",
       R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})",
       absl::StatusCode::kInvalidArgument, "merges[0]"},
      {"bad regex",
       R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"},
         )" +
           model + "}",
       absl::StatusCode::kInvalidArgument, "does not compile"},
      {"bad behavior",
       R"({"pre_tokenizer": {"type": "Split", "pattern": {"String": "a"}, "behavior": "Sideways"},
         )" +
           model + "}",
       absl::StatusCode::kInvalidArgument, "Sideways"},
      {"unknown normalizer", R"({"normalizer": {"type": "BertNormalizer"}, )" + model + "}",
       absl::StatusCode::kUnimplemented, "BertNormalizer"},
      {"unknown pre-tokenizer", R"({"pre_tokenizer": {"type": "BertPreTokenizer"}, )" + model + "}",
       absl::StatusCode::kUnimplemented, "BertPreTokenizer"},
      {"unknown decoder", R"({"decoder": {"type": "WordPiece"}, )" + model + "}",
       absl::StatusCode::kUnimplemented, "WordPiece"},
      {"strip end after fuse",
       R"({"decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"},
           {"type": "Strip", "content": " ", "start": 0, "stop": 1}]}, )" +
           model + "}",
       absl::StatusCode::kUnimplemented, "stop"},
      {"dropout", R"({"model": {"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "dropout"},
      {"template names unknown token",
       R"({"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken":
           {"id": "<s>", "type_id": 0}}], "special_tokens": {}}, )" +
           model + "}",
       absl::StatusCode::kInvalidArgument, "<s>"},
      // Found by tokenizer_load_fuzz: an id inside the table's range that
      // no token has (a gap between the vocabulary and the added tokens).
      {"template id without a token",
       R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true}],
           "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken":
           {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
           "special_tokens": {"<s>": {"id": "<s>", "ids": [2], "tokens": ["<s>"]}}}, )" +
           model + "}",
       absl::StatusCode::kInvalidArgument, "post_processor id 2"},
      {"wrong type", R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "vocab"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> tok =
        HfTokenizer::FromJson(c.json, "", "src.json");
    EXPECT_EQ(tok.status().code(), c.code) << c.name << ": " << tok.status();
    EXPECT_THAT(tok.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(tok.status().message(), HasSubstr("src.json")) << c.name;
  }
}

TEST(HfTokenizerTest, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok =
      HfTokenizer::Load(std::string(kTestdata) + "/no_such/tokenizer.json", "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("no_such/tokenizer.json"));
}

}  // namespace
}  // namespace ringlane::router
