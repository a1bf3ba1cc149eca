#include "tools/bench/runner.h"

#include <string>

#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

TEST(DetectLoopsTest, FlagsARepeatedTokenCycle) {
  RequestSample s;
  // A 3-token cycle, 5 times: the router's default flags at 4 occurrences.
  for (int i = 0; i < 5; ++i) {
    for (const char* t : {" the", " dog", " ran"}) s.token_texts.push_back(t);
  }
  DetectLoops(router::LoopWatchdogOptions(), &s);
  EXPECT_TRUE(s.loop_flagged);
  EXPECT_EQ(s.loop_period, 3);
}

TEST(DetectLoopsTest, WithoutLogprobsWordsStandIn) {
  RequestSample s;
  s.text = "Once upon a time. He said hi and hi and hi and hi and hi and then";
  DetectLoops(router::LoopWatchdogOptions(), &s);
  EXPECT_TRUE(s.loop_flagged);
  EXPECT_EQ(s.loop_period, 2);  // "hi and"
}

TEST(DetectLoopsTest, OrdinaryTextIsLeftAlone) {
  RequestSample s;
  s.text =
      "Lily went to the park with her mom. She saw a big red ball and wanted to play. "
      "Her mom said yes, and Lily was happy. They played all day.";
  DetectLoops(router::LoopWatchdogOptions(), &s);
  EXPECT_FALSE(s.loop_flagged);
  // The same text said twice is not a loop either (the default needs four).
  s.text += " " + s.text;
  DetectLoops(router::LoopWatchdogOptions(), &s);
  EXPECT_FALSE(s.loop_flagged);
}

TEST(CopyPromptTextTest, TheDocumentThenItsFirstWordsAgain) {
  const std::string doc = "  Lily saw a big dog.\nIt ran  away. ";
  // 8 words; a quarter is 2, cut where the second ends.
  EXPECT_EQ(CopyPromptText(doc, 0.25), "Lily saw a big dog.\nIt ran  away.\nLily saw");
  EXPECT_EQ(CopyPromptText(doc, 0.5), "Lily saw a big dog.\nIt ran  away.\nLily saw a big");
  // Rounded to the nearest word: 0.3 * 8 = 2.4 words.
  EXPECT_EQ(CopyPromptText(doc, 0.3), CopyPromptText(doc, 0.25));
  EXPECT_EQ(CopyPromptText(doc, 0), "Lily saw a big dog.\nIt ran  away.\n");
  EXPECT_EQ(CopyPromptText(doc, 1),
            "Lily saw a big dog.\nIt ran  away.\nLily saw a big dog.\nIt ran  away.");
  EXPECT_EQ(CopyPromptText("", 0.5), "\n");
}

TEST(RunWorkloadTest, BadLoopOptionsFailUpFront) {
  Workload w;
  w.name = "x";
  RunOptions o;
  o.server.base_url = "http://127.0.0.1:1/v1";
  o.loop.flag_repeats = 1;
  EXPECT_EQ(RunWorkload(w, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.loop = {};
  o.server.base_url = "https://example.com/v1";
  EXPECT_EQ(RunWorkload(w, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringlane::bench
