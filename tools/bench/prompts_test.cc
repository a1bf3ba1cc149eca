#include "tools/bench/prompts.h"

#include <string>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

// A stand-in tokenizer: a BOS, one token per word, two for words longer
// than five letters.
absl::StatusOr<int64_t> FakeCount(const std::string& text) {
  int64_t n = 1;
  for (absl::string_view w : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    n += w.size() > 5 ? 2 : 1;
  }
  return n;
}

TEST(PromptBuilderTest, WordsAreSeeded) {
  PromptBuilder b;
  EXPECT_EQ(b.Words(20, 7), b.Words(20, 7));
  EXPECT_NE(b.Words(20, 7), b.Words(20, 8));
  const std::vector<std::string> words = absl::StrSplit(b.Words(20, 7), ' ');
  EXPECT_EQ(words.size(), 20u);
}

TEST(PromptBuilderTest, WithoutATokenizerLengthsAreWords) {
  PromptBuilder b;
  absl::StatusOr<Prompt> p = b.Make(30, 1, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->exact);
  EXPECT_EQ(p->tokens, 30);
}

TEST(PromptBuilderTest, CalibratedLengthsAreExact) {
  PromptBuilder b;
  CountTokensFn count = FakeCount;
  ASSERT_TRUE(b.Calibrate(count).ok());
  // Only the one-token words are kept.
  for (const std::string& w : b.words()) EXPECT_LE(w.size(), 5u) << w;
  for (int tokens : {2, 16, 64, 400}) {
    absl::StatusOr<Prompt> p = b.Make(tokens, tokens * 31, &count);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->exact);
    EXPECT_EQ(p->tokens, tokens);
    EXPECT_EQ(*FakeCount(p->text), tokens);
  }
}

TEST(PromptBuilderTest, TokenizerErrorsAreReturned) {
  PromptBuilder b;
  CountTokensFn broken = [](const std::string&) -> absl::StatusOr<int64_t> {
    return absl::UnavailableError("down");
  };
  EXPECT_EQ(b.Calibrate(broken).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(b.calibrated());
}

}  // namespace
}  // namespace ringlane::bench
