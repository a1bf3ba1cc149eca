#include "router/tokenizer/sentencepiece_tokenizer.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/tokenizer/llama2c_tokenizer.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kModelPath[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/tok512.model";
constexpr char kBinPath[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/tok512.bin";
constexpr char kGoldenPath[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/golden.json";

// tok512.model is the model tok512.bin was exported from, so both must
// tokenize alike. They differ where SentencePiece normalizes and run.c does
// not: the model keeps remove_extra_whitespaces at its default (true), so
// SentencePiece drops leading/trailing spaces and squeezes runs of spaces,
// while run.c encodes every space.
class Tok512ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> sp =
        SentencePieceTokenizer::Load(kModelPath);
    ASSERT_TRUE(sp.ok()) << sp.status();
    sp_ = std::move(*sp);
    absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> bin = Llama2cTokenizer::Load(kBinPath);
    ASSERT_TRUE(bin.ok()) << bin.status();
    bin_ = std::move(*bin);
  }

  std::vector<int32_t> Encode(const std::string& text, bool bos = true) {
    absl::StatusOr<std::vector<int32_t>> ids = sp_->Encode(text, bos);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  std::unique_ptr<SentencePieceTokenizer> sp_;
  std::unique_ptr<Llama2cTokenizer> bin_;
};

TEST_F(Tok512ModelTest, ReadsModelProto) {
  EXPECT_EQ(sp_->vocab_size(), 512);
  EXPECT_EQ(sp_->format(), "sentencepiece");
  EXPECT_EQ(sp_->unk_id(), 0);
  EXPECT_EQ(sp_->bos_id(), 1);
  EXPECT_EQ(sp_->eos_id(), 2);
  EXPECT_THAT(sp_->StopIds(), ElementsAre(2));
  EXPECT_TRUE(sp_->byte_fallback());
  EXPECT_TRUE(sp_->add_dummy_prefix());
  EXPECT_TRUE(sp_->remove_extra_whitespaces());
  EXPECT_EQ(sp_->IdToToken(0), "<unk>");
  EXPECT_EQ(sp_->IdToToken(1), "<s>");
  EXPECT_EQ(sp_->IdToToken(3), "<0x00>");
  EXPECT_EQ(sp_->IdToToken(403), "\xE2\x96\x81Once");
  EXPECT_EQ(sp_->TokenToId("\xE2\x96\x81Once"), 403);
  EXPECT_EQ(sp_->TokenToId("Once"), std::nullopt);
  EXPECT_EQ(sp_->piece_type(0), SentencePieceTokenizer::PieceType::kUnknown);
  EXPECT_EQ(sp_->piece_type(1), SentencePieceTokenizer::PieceType::kControl);
  EXPECT_EQ(sp_->piece_type(258), SentencePieceTokenizer::PieceType::kByte);
  EXPECT_EQ(sp_->piece_type(403), SentencePieceTokenizer::PieceType::kNormal);
  EXPECT_TRUE(sp_->IsSpecial(1));
  EXPECT_TRUE(sp_->IsSpecial(2));
  EXPECT_FALSE(sp_->IsSpecial(0));
  EXPECT_FALSE(sp_->IsSpecial(403));
  // Every piece but the specials and bytes has the score tok512.bin has.
  for (int32_t id = 259; id < 512; ++id) {
    ASSERT_EQ(sp_->score(id), bin_->score(id)) << id;
  }
}

std::vector<std::string> SameAsRunCTexts() {
  std::vector<std::string> texts = {
      "Once upon a time",
      "Lily and Ben",
      "The cat",
      "x",
      "Hello world! 12345 don't",
      "line1\nline2\n\nline4\r\n",
      "tabs\tand\tmore",
      "café naïve résumé €5",
      "日本語 中文 한국어",
      "emoji 😀👍🏽 family 👨‍👩‍👧",
      "ж中😀",
      "<s> is not a control token in text </s>",
      std::string("nul\0byte", 8),
  };
  std::ifstream in(kGoldenPath);
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, false);
  EXPECT_FALSE(golden.is_discarded());
  for (const nlohmann::json& c : golden["cases"]) {
    texts.push_back(c["prompt"].get<std::string>());
    // The generated stories: long texts full of merges.
    texts.push_back(c["greedy_text"].get<std::string>());
  }
  return texts;
}

TEST_F(Tok512ModelTest, EncodeMatchesLlama2c) {
  for (const std::string& text : SameAsRunCTexts()) {
    SCOPED_TRACE(::testing::PrintToString(text));
    EXPECT_THAT(Encode(text, true), ElementsAreArray(bin_->Encode(text, true)));
    EXPECT_THAT(Encode(text, false), ElementsAreArray(bin_->Encode(text, false)));
  }
}

TEST_F(Tok512ModelTest, DecodeMatchesLlama2c) {
  for (const std::string& text : SameAsRunCTexts()) {
    SCOPED_TRACE(::testing::PrintToString(text));
    const std::vector<int32_t> ids = bin_->Encode(text, true);
    absl::StatusOr<std::string> want = bin_->Decode(ids);
    absl::StatusOr<std::string> got = sp_->Decode(ids);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_EQ(*got, *want);
    EXPECT_EQ(*got, text);
  }
}

TEST_F(Tok512ModelTest, DecodesGoldenOutput) {
  std::ifstream in(kGoldenPath);
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, false);
  for (const nlohmann::json& c : golden["cases"]) {
    std::vector<int32_t> ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (int32_t id : c["greedy_ids"].get<std::vector<int32_t>>()) ids.push_back(id);
    if (c["stopped_on_bos"].get<bool>()) ids.pop_back();
    absl::StatusOr<std::string> text = sp_->Decode(ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c["greedy_text"].get<std::string>());
  }
}

TEST_F(Tok512ModelTest, SpacesAreNormalizedUnlikeRunC) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"  leading", "leading"},
      {"trailing   ", "trailing"},
      {"two  spaces and   three", "two spaces and three"},
      {" ", ""},
  };
  for (const auto& [text, squeezed] : cases) {
    SCOPED_TRACE(::testing::PrintToString(text));
    EXPECT_THAT(Encode(text), ElementsAreArray(bin_->Encode(squeezed, true)));
    EXPECT_THAT(Encode(text), ::testing::Not(ElementsAreArray(bin_->Encode(text, true))));
  }
}

TEST_F(Tok512ModelTest, FirstPieceLosesDummyPrefixWithOrWithoutBos) {
  absl::StatusOr<std::string> text = sp_->Decode({403, 403});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "Once Once");
  text = sp_->Decode({1, 403, 2, 403}, /*skip_special_tokens=*/false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<s>Once</s> Once");
  absl::StatusOr<std::string> bytes = sp_->TokenBytes(403);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, " Once");
  EXPECT_EQ(sp_->Decode({512}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A ModelProto writer for synthetic models.
void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void IntField(uint32_t field, int64_t v, std::string* out) {
  Varint(field << 3, out);
  Varint(static_cast<uint64_t>(v), out);
}
void BytesField(uint32_t field, const std::string& v, std::string* out) {
  Varint((field << 3) | 2, out);
  Varint(v.size(), out);
  out->append(v);
}
void FloatField(uint32_t field, float v, std::string* out) {
  Varint((field << 3) | 5, out);
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}

struct SpPiece {
  std::string piece;
  float score;
  int type;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
};

struct SpSpec {
  int model_type = 2;
  bool byte_fallback = true;
  int64_t bos_id = 1;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = false;
  std::string charsmap;
};

// <unk>, <s>, </s>, (with byte_fallback) the 256 byte pieces, then `extra`.
std::string SerializeModel(const std::vector<SpPiece>& extra, const SpSpec& spec) {
  std::vector<SpPiece> pieces = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}};
  if (spec.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      pieces.push_back({name, 0, 6});
    }
  }
  pieces.insert(pieces.end(), extra.begin(), extra.end());
  std::string out;
  for (const SpPiece& p : pieces) {
    std::string msg;
    BytesField(1, p.piece, &msg);
    FloatField(2, p.score, &msg);
    if (p.type != 1) IntField(3, p.type, &msg);
    BytesField(1, msg, &out);
  }
  std::string trainer;
  IntField(3, spec.model_type, &trainer);
  IntField(35, spec.byte_fallback, &trainer);
  IntField(41, spec.bos_id, &trainer);
  BytesField(2, trainer, &out);
  std::string normalizer;
  BytesField(1, spec.charsmap.empty() ? "identity" : "nmt_nfkc", &normalizer);
  if (!spec.charsmap.empty()) BytesField(2, spec.charsmap, &normalizer);
  IntField(3, spec.add_dummy_prefix, &normalizer);
  IntField(4, spec.remove_extra_whitespaces, &normalizer);
  BytesField(3, normalizer, &out);
  return out;
}

std::unique_ptr<SentencePieceTokenizer> Build(const std::vector<SpPiece>& extra,
                                              const SpSpec& spec = {}) {
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tok =
      SentencePieceTokenizer::FromSerialized(SerializeModel(extra, spec), "synthetic");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

constexpr int32_t kFirst = 3 + 256;  // Id of the first extra piece with bytes.

TEST(SentencePieceTest, MergesHighestScoreFirst) {
  // "▁a"+"bc" wins over "▁ab" because "bc" outscores "ab" and merges first.
  auto tok = Build({{"▁", -5, 1},
                    {"a", -5, 1},
                    {"b", -5, 1},
                    {"c", -5, 1},
                    {"ab", -2, 1},
                    {"bc", -1, 1},
                    {"▁a", -3, 1},
                    {"▁ab", -0.5, 1}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc", false).value(), ElementsAre(kFirst + 6, kFirst + 5));
  EXPECT_THAT(tok->Encode("ab", false).value(), ElementsAre(kFirst + 7));
}

TEST(SentencePieceTest, UserDefinedPiecesStayWhole) {
  auto tok = Build({{"▁", 0, 1}, {"a", 0, 1}, {"<tool>", 0, 4}, {"a<", -1, 1}, {"▁a", -1, 1}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a<tool>a", true).value(),
              ElementsAre(1, kFirst + 4, kFirst + 2, kFirst + 1));
}

TEST(SentencePieceTest, UnusedPiecesAreSplitBack) {
  SpSpec spec;
  spec.add_dummy_prefix = false;
  auto tok = Build({{"a", 0, 1}, {"b", 0, 1}, {"c", 0, 1}, {"ab", -1, 5}, {"abc", -2, 1}}, spec);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc", false).value(), ElementsAre(kFirst + 4));
  EXPECT_THAT(tok->Encode("ab", false).value(), ElementsAre(kFirst, kFirst + 1));
}

TEST(SentencePieceTest, UnknownCharactersUseBytesOrOneUnk) {
  const std::vector<SpPiece> pieces = {{"▁", 0, 1}, {"a", 0, 1}};
  auto with_bytes = Build(pieces);
  ASSERT_NE(with_bytes, nullptr);
  EXPECT_THAT(with_bytes->Encode("é", false).value(), ElementsAre(kFirst, 3 + 0xC3, 3 + 0xA9));
  SpSpec no_bytes;
  no_bytes.byte_fallback = false;
  auto without = Build(pieces, no_bytes);
  ASSERT_NE(without, nullptr);
  EXPECT_THAT(without->Encode("aéèa", false).value(), ElementsAre(3, 4, 0, 4));
  absl::StatusOr<std::string> text = without->Decode({3, 4, 0});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "a<unk>");
}

TEST(SentencePieceTest, NormalizerOptions) {
  SpSpec spec;
  spec.add_dummy_prefix = false;
  spec.bos_id = -1;  // Sent as a ten-byte varint.
  auto tok = Build({{"▁", 0, 1}, {"a", 0, 1}}, spec);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_THAT(tok->Encode("a  a", true).value(),
              ElementsAre(kFirst + 1, kFirst, kFirst, kFirst + 1));
  absl::StatusOr<std::string> text = tok->Decode({kFirst, kFirst + 1});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, " a");  // No dummy prefix to drop.
}

void ExpectLoadError(const std::string& bytes, absl::StatusCode code, const std::string& what) {
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tok =
      SentencePieceTokenizer::FromSerialized(bytes, "bad.model");
  EXPECT_EQ(tok.status().code(), code) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr(what));
  EXPECT_THAT(tok.status().message(), HasSubstr("bad.model"));
}

TEST(SentencePieceTest, LoadErrors) {
  const std::vector<SpPiece> pieces = {{"▁", 0, 1}};
  SpSpec unigram;
  unigram.model_type = 1;
  ExpectLoadError(SerializeModel(pieces, unigram), absl::StatusCode::kUnimplemented, "UNIGRAM");
  SpSpec nfkc;
  nfkc.charsmap = "\x01\x02\x03";
  ExpectLoadError(SerializeModel(pieces, nfkc), absl::StatusCode::kUnimplemented, "nmt_nfkc");
  const std::string good = SerializeModel(pieces, {});
  ExpectLoadError(good.substr(0, good.size() - 3), absl::StatusCode::kInvalidArgument,
                  "past the end");
  ExpectLoadError("", absl::StatusCode::kInvalidArgument, "no pieces");
  ExpectLoadError("\x0A\xFF", absl::StatusCode::kInvalidArgument, "truncated varint");
  ExpectLoadError("\x0D\x00\x00\x00\x00", absl::StatusCode::kInvalidArgument, "wire type");
  SpSpec bad_bos;
  bad_bos.bos_id = 100000;
  ExpectLoadError(SerializeModel(pieces, bad_bos), absl::StatusCode::kInvalidArgument, "bos_id");
}

TEST(SentencePieceTest, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tok =
      SentencePieceTokenizer::Load("/nonexistent/tokenizer.model");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
}

}  // namespace
}  // namespace ringlane::router
