#include "router/tokenizer/llama2c_tokenizer.h"

#include <cstdint>
#include <cstdio>
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

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kTok512Path[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/tok512.bin";
constexpr char kGoldenPath[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/golden.json";

// Piece ids in tok512.bin that the tests below rely on.
constexpr int32_t kSpaceId = 410;   // " ", the dummy prefix
constexpr int32_t kOnceId = 403;    // " Once"
constexpr int32_t kNewlineId = 13;  // "<0x0A>"
constexpr int32_t kEAcuteId = 485;  // "é"
constexpr int32_t kEuroId = 503;    // "€"

std::vector<int32_t> ByteTokens(const std::string& bytes) {
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(3 + static_cast<unsigned char>(c));
  return ids;
}

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/llama2c_tokenizer_test_", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

void AppendInt32(std::string& out, int32_t v) {
  char b[sizeof(v)];
  std::memcpy(b, &v, sizeof(v));
  out.append(b, sizeof(v));
}

void AppendFloat(std::string& out, float v) {
  char b[sizeof(v)];
  std::memcpy(b, &v, sizeof(v));
  out.append(b, sizeof(v));
}

struct Entry {
  float score;
  std::string piece;
};

// A minimal llama2.c vocabulary: <unk>, <s>, </s> and the 256 byte pieces,
// all scored 0 as tokenizer.py exports them, followed by `extra`.
std::string SerializeVocab(const std::vector<Entry>& extra) {
  std::vector<Entry> entries = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    entries.push_back({0, name});
  }
  entries.insert(entries.end(), extra.begin(), extra.end());
  std::string out;
  AppendInt32(out, 16);
  for (const Entry& e : entries) {
    AppendFloat(out, e.score);
    AppendInt32(out, static_cast<int32_t>(e.piece.size()));
    out += e.piece;
  }
  return out;
}

std::unique_ptr<Llama2cTokenizer> LoadVocab(const std::string& name,
                                            const std::vector<Entry>& extra) {
  absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> tok =
      Llama2cTokenizer::Load(WriteTempFile(name, SerializeVocab(extra)));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Ids of custom pieces appended after the 259 base pieces, in order.
int32_t Extra(int i) { return Llama2cTokenizer::kMinVocabSize + i; }

class Tok512Test : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> tok = Llama2cTokenizer::Load(kTok512Path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }

  std::unique_ptr<Llama2cTokenizer> tok_;
};

TEST_F(Tok512Test, LoadsVocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->max_token_length(), 7);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->piece(0), "<unk>");
  EXPECT_EQ(tok_->piece(1), "\n<s>\n");
  EXPECT_EQ(tok_->piece(2), "\n</s>\n");
  EXPECT_EQ(tok_->piece(3), "<0x00>");
  EXPECT_EQ(tok_->piece(258), "<0xFF>");
  EXPECT_EQ(tok_->piece(259), " t");
  EXPECT_EQ(tok_->piece(kSpaceId), " ");
  EXPECT_EQ(tok_->piece(kOnceId), " Once");
  EXPECT_EQ(tok_->score(260), -1.0f);
  EXPECT_EQ(tok_->score(511), -252.0f);
  EXPECT_EQ(tok_->piece(512), "");
  EXPECT_EQ(tok_->score(-1), 0.0f);
}

nlohmann::json LoadGolden() {
  std::ifstream in(kGoldenPath);
  EXPECT_TRUE(in.good()) << kGoldenPath;
  nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(golden.is_discarded()) << kGoldenPath;
  EXPECT_GE(golden.value("cases", nlohmann::json::array()).size(), 4u);
  return golden;
}

TEST_F(Tok512Test, EncodeMatchesRunCPromptIds) {
  const nlohmann::json golden = LoadGolden();
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    SCOPED_TRACE(prompt);
    EXPECT_THAT(tok_->Encode(prompt, /*add_bos=*/true),
                ElementsAreArray(c["prompt_ids"].get<std::vector<int32_t>>()));
  }
}

// golden.json's greedy_text is run.c's stdout: decode(prev, next) for every
// token after the leading BOS, prompt tokens first, so with no stop the whole
// id sequence decodes to it, the BOS stripping the first piece's space.
TEST_F(Tok512Test, DecodeMatchesRunCStdout) {
  const nlohmann::json golden = LoadGolden();
  for (const nlohmann::json& c : golden["cases"]) {
    SCOPED_TRACE(c["prompt"].get<std::string>());
    std::vector<int32_t> ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    ids.insert(ids.end(), greedy.begin(), greedy.end());
    if (c["stopped_on_bos"].get<bool>()) {
      ASSERT_EQ(ids.back(), 1);
      ids.pop_back();
    }
    absl::StatusOr<std::string> text = tok_->Decode(ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c["greedy_text"].get<std::string>());
  }
}

TEST_F(Tok512Test, EmptyTextEncodesToBosOnly) {
  EXPECT_THAT(tok_->Encode("", /*add_bos=*/true), ElementsAre(1));
  EXPECT_THAT(tok_->Encode("", /*add_bos=*/false), ElementsAre());
  EXPECT_THAT(tok_->Encode("", /*add_bos=*/true, /*add_eos=*/true), ElementsAre(1, 2));
}

TEST_F(Tok512Test, AddEosAppendsEosAfterMerging) {
  EXPECT_THAT(tok_->Encode("The cat", /*add_bos=*/true, /*add_eos=*/true),
              ElementsAre(1, 291, 280, 294, 2));
  EXPECT_THAT(tok_->Encode("The cat", /*add_bos=*/false), ElementsAre(291, 280, 294));
}

TEST_F(Tok512Test, CodepointsInVocabEncodeAsOnePiece) {
  EXPECT_THAT(tok_->Encode("é€", /*add_bos=*/false), ElementsAre(kSpaceId, kEAcuteId, kEuroId));
}

TEST_F(Tok512Test, ByteFallbackRoundTrips) {
  // None of these codepoints is a piece in tok512 (é and € are, so they
  // would not exercise the fallback).
  const std::string text = "ж中😀";
  std::vector<int32_t> expected = {1, kSpaceId};
  const std::vector<int32_t> bytes = ByteTokens(text);
  expected.insert(expected.end(), bytes.begin(), bytes.end());
  const std::vector<int32_t> ids = tok_->Encode(text, /*add_bos=*/true);
  EXPECT_THAT(ids, ElementsAreArray(expected));
  absl::StatusOr<std::string> decoded = tok_->Decode(ids);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

TEST_F(Tok512Test, StrayContinuationBytesFallBackToBytes) {
  const std::string text = "a\x80\xBF z\xC3";  // invalid UTF-8 on purpose
  const std::vector<int32_t> ids = tok_->Encode(text, /*add_bos=*/true);
  absl::StatusOr<std::string> decoded = tok_->Decode(ids);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

TEST_F(Tok512Test, DecodeInvertsEncodeAfterBos) {
  const std::vector<std::string> texts = {
      "Once upon a time",         " leading space", "two  spaces\nand\ttabs", "café ü 😀!", "x",
      std::string("nul\0byte", 8)};
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::string> decoded = tok_->Decode(tok_->Encode(text, /*add_bos=*/true));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST_F(Tok512Test, DecodePieceStripsSpaceOnlyAfterBos) {
  EXPECT_EQ(tok_->DecodePiece(1, kOnceId), "Once");
  EXPECT_EQ(tok_->DecodePiece(kOnceId, kOnceId), " Once");
  EXPECT_EQ(tok_->DecodePiece(2, kOnceId), " Once");
  EXPECT_EQ(tok_->DecodePiece(-1, kOnceId), " Once");
  EXPECT_EQ(tok_->DecodePiece(1, kSpaceId), "");
}

TEST_F(Tok512Test, DecodePieceTurnsBytePiecesIntoRawBytes) {
  EXPECT_EQ(tok_->DecodePiece(1, kNewlineId), "\n");
  EXPECT_EQ(tok_->DecodePiece(kOnceId, 3), std::string(1, '\0'));
  EXPECT_EQ(tok_->DecodePiece(kOnceId, 258), "\xFF");
  // Special pieces decode literally; Decode() is what skips BOS/EOS.
  EXPECT_EQ(tok_->DecodePiece(kOnceId, 0), "<unk>");
  EXPECT_EQ(tok_->DecodePiece(kOnceId, 1), "\n<s>\n");
  EXPECT_EQ(tok_->DecodePiece(kOnceId, 512), "");
}

TEST_F(Tok512Test, DecodeSkipsBosAndEosButTracksThemAsPrevious) {
  absl::StatusOr<std::string> text = tok_->Decode({kOnceId, 1, kOnceId, 2, kOnceId});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, " OnceOnce Once");
}

TEST_F(Tok512Test, DecodeRejectsOutOfRangeIds) {
  for (int32_t bad : {512, -1}) {
    absl::StatusOr<std::string> text = tok_->Decode({1, kOnceId, bad});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(text.status().message(), HasSubstr("position 2")) << bad;
  }
}

TEST_F(Tok512Test, StopsOnBosOnly) {
  EXPECT_TRUE(tok_->IsStop(1));
  EXPECT_FALSE(tok_->IsStop(2));
  EXPECT_FALSE(tok_->IsStop(0));
  EXPECT_FALSE(tok_->IsStop(kOnceId));
}

// The merge rules, on vocabularies built so that a wrong choice shows.

TEST(Llama2cTokenizerMergeTest, TiesGoToLeftmostPair) {
  // "ab" and "ba" score the same; run.c takes the first pair it sees.
  auto tok = LoadVocab("ties", {{0, " "}, {0, "a"}, {0, "b"}, {-1, "ab"}, {-1, "ba"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("aba", false), ElementsAre(Extra(0), Extra(3), Extra(1)));
}

TEST(Llama2cTokenizerMergeTest, HigherScoreWinsAnywhere) {
  auto tok = LoadVocab("higher", {{0, " "}, {0, "a"}, {0, "b"}, {-2, "ab"}, {-1, "ba"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("aba", false), ElementsAre(Extra(0), Extra(1), Extra(4)));
}

TEST(Llama2cTokenizerMergeTest, MergedTokensKeepMerging) {
  // "bc" first, then "a"+"bc", then " "+"abc"; "ab" never gets a turn.
  auto tok = LoadVocab(
      "chain",
      {{0, " "}, {0, "a"}, {0, "b"}, {0, "c"}, {-5, "ab"}, {-1, "bc"}, {-3, "abc"}, {-4, " abc"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc", false), ElementsAre(Extra(7)));
  EXPECT_THAT(tok->Encode("abcabc", false), ElementsAre(Extra(7), Extra(6)));
}

TEST(Llama2cTokenizerMergeTest, MergesAtOrBelowMinusOneE10AreIgnored) {
  auto tok = LoadVocab("threshold", {{0, " "}, {0, "a"}, {0, "b"}, {-1e10f, "ab"}, {-1e9f, "ba"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("ab", false), ElementsAre(Extra(0), Extra(1), Extra(2)));
  EXPECT_THAT(tok->Encode("ba", false), ElementsAre(Extra(0), Extra(4)));
}

TEST(Llama2cTokenizerMergeTest, MergeLoopIncludesBos) {
  // run.c merges over the whole token array, BOS included.
  auto tok = LoadVocab("bos_merge", {{0, " "}, {0, "a"}, {-1, "\n<s>\n "}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a", true), ElementsAre(Extra(2), Extra(1)));
  EXPECT_THAT(tok->Encode("a", true, true), ElementsAre(Extra(2), Extra(1), 2));
}

TEST(Llama2cTokenizerMergeTest, CodepointUnitsCapAtFourBytes) {
  // run.c groups a byte with the continuation bytes after it, at most four
  // in all, regardless of the lead byte: "\xC3\xA9\xA9\xA9" then "\xA9".
  auto tok = LoadVocab("units", {{0, " "}, {0, "\xC3\xA9"}, {0, "\xA9"}});
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> expected = {Extra(0)};
  const std::vector<int32_t> bytes = ByteTokens("\xC3\xA9\xA9\xA9");
  expected.insert(expected.end(), bytes.begin(), bytes.end());
  expected.push_back(Extra(2));
  EXPECT_THAT(tok->Encode("\xC3\xA9\xA9\xA9\xA9", false), ElementsAreArray(expected));
  EXPECT_THAT(tok->Encode("\xC3\xA9", false), ElementsAre(Extra(0), Extra(1)));
}

TEST(Llama2cTokenizerMergeTest, MissingSpacePieceUsesByteForDummyPrefix) {
  auto tok = LoadVocab("no_space", {{0, "a"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a", true), ElementsAre(1, 3 + ' ', Extra(0)));
}

// Load failures.

void ExpectInvalidFile(const std::string& name, const std::string& contents,
                       const std::string& what) {
  const std::string path = WriteTempFile(name, contents);
  absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> tok = Llama2cTokenizer::Load(path);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr(path));
  EXPECT_THAT(tok.status().message(), HasSubstr(what));
}

TEST(Llama2cTokenizerLoadTest, MissingFileIsNotFound) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/llama2c_tokenizer_test_missing");
  std::remove(path.c_str());
  absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> tok = Llama2cTokenizer::Load(path);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr(path));
}

TEST(Llama2cTokenizerLoadTest, EmptyFileIsInvalid) { ExpectInvalidFile("empty", "", "empty"); }

TEST(Llama2cTokenizerLoadTest, ShortHeaderIsInvalid) {
  ExpectInvalidFile("short_header", "\x07\x00", "max_token_length");
}

TEST(Llama2cTokenizerLoadTest, TruncatedRecordHeaderIsInvalid) {
  std::string contents;
  AppendInt32(contents, 7);
  AppendFloat(contents, 0);
  contents += "\x01\x00";  // half of the length field
  ExpectInvalidFile("truncated_header", contents, "record 0 at byte offset 4 is truncated");
}

TEST(Llama2cTokenizerLoadTest, TruncatedPieceIsInvalid) {
  std::string contents = SerializeVocab({});
  AppendFloat(contents, -1);
  AppendInt32(contents, 10);
  contents += "abc";
  ExpectInvalidFile("truncated_piece", contents, "record 259");
}

TEST(Llama2cTokenizerLoadTest, NegativeLengthIsInvalid) {
  std::string contents;
  AppendInt32(contents, 7);
  AppendFloat(contents, 0);
  AppendInt32(contents, -5);
  contents += "<unk>";
  ExpectInvalidFile("negative_len", contents, "negative piece length -5");
}

TEST(Llama2cTokenizerLoadTest, HugeLengthIsInvalid) {
  std::string contents;
  AppendInt32(contents, 7);
  AppendFloat(contents, 0);
  AppendInt32(contents, 0x7fffffff);
  contents += "<unk>";
  ExpectInvalidFile("huge_len", contents, "piece length 2147483647");
}

TEST(Llama2cTokenizerLoadTest, TooFewRecordsIsInvalid) {
  std::string contents;
  AppendInt32(contents, 7);
  ExpectInvalidFile("no_records", contents, "0 vocabulary records");
  AppendFloat(contents, 0);
  AppendInt32(contents, 5);
  contents += "<unk>";
  ExpectInvalidFile("one_record", contents, "1 vocabulary records");
}

}  // namespace
}  // namespace ringlane::router
