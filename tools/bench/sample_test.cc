#include "tools/bench/sample.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A completions chunk carrying `tokens` (one logprob entry each), or plain
// text without logprobs when `with_logprobs` is false.
std::string CompletionChunk(const std::vector<std::string>& tokens, bool with_logprobs = true) {
  std::string text, list, lps;
  for (const std::string& t : tokens) {
    text += t;
    absl::StrAppend(&list, list.empty() ? "" : ",", "\"", t, "\"");
    absl::StrAppend(&lps, lps.empty() ? "" : ",", "-0.5");
  }
  std::string lp = with_logprobs ? absl::StrCat(R"(,"logprobs":{"tokens":[)", list,
                                                R"(],"token_logprobs":[)", lps, "]}")
                                 : "";
  return absl::StrCat(R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":")",
                      text, "\"", lp, R"(,"finish_reason":null}]})");
}

std::string Usage(int prompt, int completion, int cached = -1) {
  std::string details =
      cached >= 0 ? absl::StrCat(R"(,"prompt_tokens_details":{"cached_tokens":)", cached, "}") : "";
  return absl::StrCat(R"({"choices":[],"usage":{"prompt_tokens":)", prompt,
                      R"(,"completion_tokens":)", completion, R"(,"total_tokens":)",
                      prompt + completion, details, "}}");
}

TEST(StreamAccumulatorTest, TimesAndCountsAKnownSchedule) {
  // First chunk at 100 ms with one token, then every 50 ms: 2, 1, 2 tokens.
  RequestSample s;
  StreamAccumulator acc(Endpoint::kCompletions, &s);
  acc.OnEvent(CompletionChunk({" a"}), 100);
  acc.OnEvent(CompletionChunk({" b", " c"}), 150);
  acc.OnEvent(CompletionChunk({" d"}), 200);
  acc.OnEvent(
      R"({"choices":[{"index":0,"text":" e f","logprobs":{"tokens":[" e"," f"]},"finish_reason":"length"}]})",
      250);
  acc.OnEvent(Usage(12, 6, 4), 251);
  acc.OnEvent("[DONE]", 252);
  acc.Finish(260);

  EXPECT_TRUE(s.ok()) << s.error;
  EXPECT_TRUE(s.streamed);
  EXPECT_TRUE(s.done_marker);
  EXPECT_EQ(s.finish_reason, "length");
  EXPECT_EQ(s.text, " a b c d e f");
  EXPECT_EQ(s.ttft_ms, 100);
  EXPECT_EQ(s.e2e_ms, 260);
  ASSERT_EQ(s.chunks.size(), 4u);
  EXPECT_EQ(s.logprob_tokens, 6);
  EXPECT_EQ(s.usage_completion_tokens, 6);
  EXPECT_EQ(s.usage_prompt_tokens, 12);
  EXPECT_EQ(s.usage_cached_tokens, 4);
  EXPECT_EQ(s.output_tokens, 6);
  EXPECT_EQ(s.check, TokenCheck::kVerified);
  // A chunk's gap over the tokens it carries, once per token.
  EXPECT_THAT(s.itl_ms, ElementsAre(25, 25, 50, 25, 25));
  EXPECT_DOUBLE_EQ(s.tpot_ms, (260.0 - 100) / 5);
  EXPECT_THAT(s.token_texts, ElementsAre(" a", " b", " c", " d", " e", " f"));
}

TEST(StreamAccumulatorTest, WrongUsageIsAMismatch) {
  RequestSample s;
  StreamAccumulator acc(Endpoint::kCompletions, &s);
  acc.OnEvent(CompletionChunk({" a"}), 10);
  acc.OnEvent(CompletionChunk({" b", " c"}), 20);
  acc.OnEvent(Usage(5, 7), 21);  // three tokens streamed, seven claimed
  acc.OnEvent("[DONE]", 22);
  acc.Finish(22);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.check, TokenCheck::kMismatch);
  // The stream's own count is used for the timing, not the claim.
  EXPECT_EQ(s.output_tokens, 3);
  EXPECT_DOUBLE_EQ(s.tpot_ms, (22.0 - 10) / 2);
}

TEST(StreamAccumulatorTest, WithoutLogprobsChunksAreNotTokens) {
  RequestSample s;
  StreamAccumulator acc(Endpoint::kCompletions, &s);
  acc.OnEvent(CompletionChunk({" a", " b"}, false), 10);
  acc.OnEvent(CompletionChunk({" c"}, false), 30);
  acc.OnEvent(Usage(5, 3), 31);
  acc.OnEvent("[DONE]", 31);
  acc.Finish(31);
  EXPECT_EQ(s.check, TokenCheck::kUnverified);
  EXPECT_EQ(s.logprob_tokens, -1);
  EXPECT_EQ(s.output_tokens, 3);           // usage, taken on trust
  EXPECT_THAT(s.itl_ms, ElementsAre(20));  // one per chunk
}

TEST(StreamAccumulatorTest, NoUsageFallsBackAndSaysSo) {
  RequestSample s;
  StreamAccumulator acc(Endpoint::kCompletions, &s);
  acc.OnEvent(CompletionChunk({" a"}, false), 10);
  acc.OnEvent(CompletionChunk({" b"}, false), 20);
  acc.OnEvent("[DONE]", 20);
  acc.Finish(20);
  EXPECT_EQ(s.check, TokenCheck::kNoUsage);
  EXPECT_EQ(s.output_tokens, 2);
}

TEST(StreamAccumulatorTest, ChatSkipsTheRoleChunk) {
  RequestSample s;
  StreamAccumulator acc(Endpoint::kChat, &s);
  acc.OnEvent(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 5);
  acc.OnEvent(
      R"({"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-1,"top_logprobs":[]}]}}]})",
      40);
  acc.OnEvent(
      R"({"choices":[{"index":0,"delta":{"content":" there"},"logprobs":{"content":[{"token":" the","logprob":-1},{"token":"re","logprob":-1}]},"finish_reason":"stop"}]})",
      60);
  acc.OnEvent(Usage(9, 3), 61);
  acc.OnEvent("[DONE]", 61);
  acc.Finish(62);
  EXPECT_EQ(s.ttft_ms, 40);  // not the role-only chunk at 5 ms
  EXPECT_EQ(s.text, "Hi there");
  EXPECT_EQ(s.check, TokenCheck::kVerified);
  EXPECT_THAT(s.itl_ms, ElementsAre(10, 10));
  EXPECT_THAT(s.token_texts, ElementsAre("Hi", " the", "re"));
}

TEST(StreamAccumulatorTest, ErrorsAndCutStreams) {
  RequestSample err;
  StreamAccumulator a(Endpoint::kCompletions, &err);
  a.OnEvent(CompletionChunk({" a"}), 10);
  a.OnEvent(R"({"error":{"message":"worker group lost","type":"server_error"}})", 20);
  a.Finish(20);
  EXPECT_THAT(err.error, HasSubstr("worker group lost"));

  RequestSample cut;
  StreamAccumulator b(Endpoint::kCompletions, &cut);
  b.OnEvent(CompletionChunk({" a"}), 10);
  b.Finish(30);
  EXPECT_THAT(cut.error, HasSubstr("ended before"));
}

TEST(StreamAccumulatorTest, WholeBodyIsOneChunk) {
  RequestSample s;
  StreamAccumulator acc(Endpoint::kChat, &s);
  acc.OnWholeBody(
      R"({"choices":[{"index":0,"message":{"role":"assistant","content":"All at once"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":3}})",
      80);
  acc.Finish(80);
  EXPECT_TRUE(s.ok()) << s.error;
  EXPECT_FALSE(s.streamed);
  EXPECT_EQ(s.ttft_ms, 80);
  EXPECT_EQ(s.text, "All at once");
  EXPECT_EQ(s.output_tokens, 3);
  EXPECT_TRUE(s.itl_ms.empty());
}

}  // namespace
}  // namespace ringlane::bench
