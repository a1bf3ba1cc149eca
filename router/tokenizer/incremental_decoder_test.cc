#include "router/tokenizer/incremental_decoder.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/tokenizer/tokenizer.h"
#include "router/tokenizer/utf8.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;

constexpr char kModelDir[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K";
constexpr char kTestdata[] = RINGLANE_SOURCE_DIR "/router/tokenizer/testdata";

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Feeds `ids` one at a time; returns the pieces Add and Flush produced.
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                bool skip_special_tokens = true) {
  IncrementalDecoder decoder(tok, skip_special_tokens);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = decoder.Add(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    pieces.push_back(piece.ok() ? *piece : "<error>");
  }
  pieces.push_back(decoder.Flush());
  return pieces;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string all;
  for (const std::string& p : pieces) all += p;
  return all;
}

class EveryFormatTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryFormatTest, StreamEqualsDecodeAndNeverSplitsACharacter) {
  std::unique_ptr<Tokenizer> tok = Load(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = {
      "Once upon a time, there was a cat.",
      "ж中😀 family 👨‍👩‍👧 café",
      "日本語のテキスト、中文测试",
      "  leading and trailing  ",
      "\n\nnew\nlines\t",
      "é",
  };
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (bool skip : {true, false}) {
      const std::vector<std::string> pieces = Stream(*tok, *ids, skip);
      for (const std::string& p : pieces) {
        EXPECT_EQ(utf8::FirstInvalid(p), p.size()) << ::testing::PrintToString(p);
      }
      absl::StatusOr<std::string> whole = tok->Decode(*ids, skip);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_EQ(Join(pieces), *whole) << "skip_special_tokens=" << skip;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryFormatTest,
                         ::testing::Values(std::string(kModelDir) + "/tok512.bin",
                                           std::string(kModelDir) + "/tok512.model",
                                           std::string(kTestdata) + "/byte_level",
                                           std::string(kTestdata) + "/gpt2",
                                           std::string(kTestdata) + "/sp_bpe",
                                           std::string(kTestdata) + "/metaspace"));

TEST(IncrementalDecoderTest, HoldsBackBytesOfACharacter) {
  std::unique_ptr<Tokenizer> tok = Load(std::string(kModelDir) + "/tok512.bin");
  ASSERT_NE(tok, nullptr);
  // tok512 has no piece for U+1F600, so it is four byte tokens (3 + byte).
  IncrementalDecoder decoder(*tok);
  EXPECT_EQ(decoder.Add(1).value(), "");
  EXPECT_EQ(decoder.Add(3 + 0xF0).value(), "");
  EXPECT_EQ(decoder.pending_bytes(), 1u);
  EXPECT_EQ(decoder.Add(3 + 0x9F).value(), "");
  EXPECT_EQ(decoder.Add(3 + 0x98).value(), "");
  EXPECT_EQ(decoder.pending_bytes(), 3u);
  EXPECT_EQ(decoder.Add(3 + 0x80).value(), "😀");
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  EXPECT_EQ(decoder.Add(403).value(), " Once");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, ByteLevelTokensSplittingACharacter) {
  std::unique_ptr<Tokenizer> tok = Load(std::string(kTestdata) + "/byte_level");
  ASSERT_NE(tok, nullptr);
  // Ids 0..255 are the single bytes; "é" is C3 A9.
  EXPECT_THAT(Stream(*tok, {0xC3, 0xA9, 'x'}), ElementsAre("", "é", "x", ""));
}

TEST(IncrementalDecoderTest, IllFormedBytesBecomeReplacementCharacters) {
  std::unique_ptr<Tokenizer> tok = Load(std::string(kModelDir) + "/tok512.bin");
  ASSERT_NE(tok, nullptr);
  const std::string fffd = "\xEF\xBF\xBD";
  // E4 B8 starts a three-byte character; 'a' (0x61) shows it will not end.
  EXPECT_THAT(Stream(*tok, {3 + 0xE4, 3 + 0xB8, 3 + 'a'}), ElementsAre("", "", fffd + "a", ""));
  // A stray continuation byte is ill-formed at once.
  EXPECT_THAT(Stream(*tok, {3 + 0x80, 3 + 'b'}), ElementsAre(fffd, "b", ""));
  // A sequence cut short by the end of generation.
  EXPECT_THAT(Stream(*tok, {3 + 'c', 3 + 0xF0, 3 + 0x9F}), ElementsAre("c", "", "", fffd));
}

TEST(IncrementalDecoderTest, FirstTokenRulesAndSpecialTokens) {
  std::unique_ptr<Tokenizer> sp = Load(std::string(kModelDir) + "/tok512.model");
  ASSERT_NE(sp, nullptr);
  // The dummy-prefix space goes from the first piece only.
  EXPECT_THAT(Stream(*sp, {403, 403}), ElementsAre("Once", " Once", ""));
  EXPECT_THAT(Stream(*sp, {1, 403, 2}, /*skip_special_tokens=*/false),
              ElementsAre("<s>", "Once", "</s>", ""));

  std::unique_ptr<Tokenizer> bl = Load(std::string(kTestdata) + "/byte_level");
  ASSERT_NE(bl, nullptr);
  const int32_t eot = bl->TokenToId("<|eot_id|>").value();
  EXPECT_THAT(Stream(*bl, {'h', eot, 'i'}), ElementsAre("h", "", "i", ""));
  EXPECT_THAT(Stream(*bl, {'h', eot, 'i'}, false), ElementsAre("h", "<|eot_id|>", "i", ""));
}

TEST(IncrementalDecoderTest, BadIdLeavesStateAlone) {
  std::unique_ptr<Tokenizer> tok = Load(std::string(kModelDir) + "/tok512.model");
  ASSERT_NE(tok, nullptr);
  IncrementalDecoder decoder(*tok);
  EXPECT_EQ(decoder.Add(3 + 0xC3).value(), "");
  absl::StatusOr<std::string> bad = decoder.Add(9999);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(decoder.pending_bytes(), 1u);
  EXPECT_EQ(decoder.Add(3 + 0xA9).value(), "é");
  // Flush starts a new sequence: its first piece loses its space again.
  EXPECT_EQ(decoder.Flush(), "");
  EXPECT_EQ(decoder.Add(403).value(), "Once");
}

}  // namespace
}  // namespace ringlane::router
