#include "services/log.h"

#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

std::string* captured = nullptr;
void CaptureLine(std::string_view line) { captured->append(line); }

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    captured = &out_;
    SetLogSinkForTesting(&CaptureLine);
    SetMinLogSeverity(Severity::kInfo);
    SetLogComponent("");
  }
  void TearDown() override {
    SetLogSinkForTesting(nullptr);
    SetMinLogSeverity(Severity::kInfo);
    SetLogComponent("");
    captured = nullptr;
  }
  std::string out_;
};

TEST_F(LogTest, LineHasSeverityComponentSiteAndMessage) {
  SetLogComponent("worker/r1");
  RL_LOG(WARNING) << "kv pool " << 42 << " blocks";
  ASSERT_FALSE(out_.empty());
  EXPECT_EQ(out_[0], 'W') << out_;
  EXPECT_TRUE(absl::StrContains(out_, " worker/r1 log_test.cc:")) << out_;
  EXPECT_TRUE(absl::EndsWith(out_, "] kv pool 42 blocks\n")) << out_;
}

TEST_F(LogTest, BelowMinimumIsDroppedAndNotFormatted) {
  int evaluated = 0;
  auto side_effect = [&evaluated] { return ++evaluated; };
  RL_LOG(DEBUG) << side_effect();
  EXPECT_TRUE(out_.empty());
  EXPECT_EQ(evaluated, 0);

  SetMinLogSeverity(Severity::kDebug);
  RL_LOG(DEBUG) << side_effect();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(out_[0], 'D');

  out_.clear();
  SetMinLogSeverity(Severity::kError);
  RL_LOG(WARNING) << "dropped";
  Log(Severity::kInfo, "dropped too");
  EXPECT_TRUE(out_.empty());
  Log(Severity::kError, "kept");
  EXPECT_TRUE(absl::EndsWith(out_, "] kept\n")) << out_;
}

TEST_F(LogTest, ParseSeverity) {
  EXPECT_EQ(*ParseSeverity("debug"), Severity::kDebug);
  EXPECT_EQ(*ParseSeverity("INFO"), Severity::kInfo);
  EXPECT_EQ(*ParseSeverity("warn"), Severity::kWarning);
  EXPECT_EQ(*ParseSeverity("Warning"), Severity::kWarning);
  EXPECT_EQ(*ParseSeverity("error"), Severity::kError);
  EXPECT_EQ(ParseSeverity("verbose").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LogTest, ConcurrentLinesDoNotInterleave) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) RL_LOG(INFO) << "thread " << t << " line " << i << " end";
    });
  }
  for (std::thread& t : threads) t.join();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out_, '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_TRUE(absl::EndsWith(line, " end")) << line;
    EXPECT_EQ(line[0], 'I') << line;
  }
  EXPECT_EQ(lines, 800);
}

TEST(LogDeathTest, FatalAborts) { EXPECT_DEATH(RL_LOG(FATAL) << "boom", "boom"); }

}  // namespace
}  // namespace ringlane::services
