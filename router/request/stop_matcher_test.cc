#include "router/request/stop_matcher.h"

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

struct FeedCase {
  std::string name;
  std::vector<std::string> stops;
  std::vector<std::string> increments;
  // What each Feed returns, in order: this pins what is held back and when.
  std::vector<std::string> released;
  int matched_stop;  // -1: none
  std::string finish;
};

// gtest would otherwise print the struct's bytes.
void PrintTo(const FeedCase& c, std::ostream* os) { *os << c.name; }

class StopMatcherFeedTest : public testing::TestWithParam<FeedCase> {};

TEST_P(StopMatcherFeedTest, ReleasesExactlyTheSafeText) {
  const FeedCase& c = GetParam();
  ASSERT_EQ(c.increments.size(), c.released.size());
  auto m = StopMatcher::Create(c.stops);
  ASSERT_TRUE(m.ok()) << m.status();
  int matched = -1;
  for (size_t i = 0; i < c.increments.size(); ++i) {
    StopMatcher::Output out = m->Feed(c.increments[i]);
    EXPECT_EQ(out.text, c.released[i]) << "increment " << i;
    if (out.matched_stop >= 0) {
      EXPECT_EQ(matched, -1) << "reported twice";
      matched = out.matched_stop;
    }
  }
  EXPECT_EQ(matched, c.matched_stop);
  EXPECT_EQ(m->matched_stop(), c.matched_stop);
  EXPECT_EQ(m->stopped(), c.matched_stop >= 0);
  EXPECT_EQ(m->Finish(), c.finish);
  EXPECT_EQ(m->held_bytes(), 0u);
  // Nothing comes out once the choice has ended.
  EXPECT_EQ(m->Feed("more").text, "");
  EXPECT_EQ(m->Finish(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Table, StopMatcherFeedTest,
    testing::Values(
        FeedCase{"NoStops", {}, {"Hello", " world"}, {"Hello", " world"}, -1, ""},
        FeedCase{"NoMatch", {"END"}, {"Hello", " world"}, {"Hello", " world"}, -1, ""},
        FeedCase{"SplitAcrossTwo", {"STOP"}, {"abc ST", "OP def"}, {"abc ", ""}, 0, ""},
        FeedCase{"SplitAcrossThree", {"<|end|>"}, {"x<|", "en", "d|>y"}, {"x", "", ""}, 0, ""},
        FeedCase{"FalseStartReleased", {"STOP"}, {"ST", "ART"}, {"", "START"}, -1, ""},
        FeedCase{"HeldTextFlushedByFinish", {"STOP"}, {"abc STO"}, {"abc "}, -1, "STO"},
        FeedCase{"ShorterPrefixStopWins", {"ab", "abc"}, {"xab"}, {"x"}, 0, ""},
        FeedCase{"ShorterPrefixStopWinsSplit", {"abc", "ab"}, {"xa", "bc"}, {"x", ""}, 1, ""},
        FeedCase{"LongestOfSameEndWins", {"bc", "abc"}, {"zabc"}, {"z"}, 1, ""},
        FeedCase{"EarliestCompletionWins", {"cd", "abcdef"}, {"xabcdef"}, {"xab"}, 0, ""},
        FeedCase{"SelfOverlapOneIncrement", {"aab"}, {"aaab"}, {"a"}, 0, ""},
        FeedCase{"SelfOverlapByteByByte", {"aab"}, {"a", "a", "a", "b"}, {"", "", "a", ""}, 0, ""},
        FeedCase{"SelfOverlapNoMatch", {"aab"}, {"aaa", "c"}, {"a", "aac"}, -1, ""},
        FeedCase{"PeriodicStop", {"abab"}, {"aba", "bab"}, {"", ""}, 0, ""},
        FeedCase{"StopAtVeryStart", {"Hi"}, {"Hi there"}, {""}, 0, ""},
        FeedCase{"StopIsWholeIncrement", {"\n\n"}, {"a", "\n\n", "b"}, {"a", "", ""}, 0, ""},
        FeedCase{"TextAfterStopDropped", {"."}, {"a.b", "c"}, {"a", ""}, 0, ""},
        FeedCase{"DuplicateStopsFirstReports", {"x", "x"}, {"axb"}, {"a"}, 0, ""},
        FeedCase{"MultibyteStop", {"终了"}, {"数据", "终", "了。"}, {"数据", "", ""}, 0, ""},
        FeedCase{"MultibyteInsideWord", {"café"}, {"le caf", "é noir"}, {"le ", ""}, 0, ""},
        // "€" is E2 82 AC and "₂" is E2 82 82: a shared lead byte is held
        // only while the stop can still complete.
        FeedCase{"MultibyteNearMiss", {"€!"}, {"x€", "?₂", "€"}, {"x", "€?₂", ""}, -1, "€"},
        FeedCase{"EmptyIncrements", {"ab"}, {"", "a", "", "b"}, {"", "", "", ""}, 0, ""}),
    [](const testing::TestParamInfo<FeedCase>& info) { return info.param.name; });

// What a stop string means, written the slow way: the first byte at which any
// stop string ends in the full text, the longest one ending there, and the
// text before it.
std::string Reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best_len = 0;
    for (const std::string& s : stops) {
      if (s.size() <= end && s.size() > best_len &&
          text.compare(end - s.size(), s.size(), s) == 0) {
        best_len = s.size();
      }
    }
    if (best_len > 0) return text.substr(0, end - best_len);
  }
  return text;
}

// However the text is cut into increments, what reaches the client is the
// reference answer, and never contains a stop string.
TEST(StopMatcherTest, RandomSplitsMatchReference) {
  std::mt19937 rng(42);
  const std::string alphabet = "ab";
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    const int num_stops = 1 + static_cast<int>(rng() % kMaxStopStrings);
    for (int s = 0; s < num_stops; ++s) {
      std::string stop;
      const int len = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < len; ++i) stop.push_back(alphabet[rng() % alphabet.size()]);
      stops.push_back(stop);
    }
    std::string text;
    const int text_len = static_cast<int>(rng() % 16);
    for (int i = 0; i < text_len; ++i) text.push_back(alphabet[rng() % alphabet.size()]);

    auto m = StopMatcher::Create(stops);
    ASSERT_TRUE(m.ok());
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t n = std::min<size_t>(text.size() - pos, rng() % 4);
      out += m->Feed(text.substr(pos, n)).text;
      pos += n;
    }
    out += m->Finish();
    const std::string want = Reference(stops, text);
    ASSERT_EQ(out, want) << "trial " << trial << " text " << text;
    for (const std::string& s : stops) ASSERT_EQ(out.find(s), std::string::npos);
  }
}

TEST(StopMatcherTest, BadInputIsRejected) {
  struct Case {
    const char* name;
    std::vector<std::string> stops;
    int max;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"empty string", {"a", ""}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"only empty", {""}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"five strings",
       {"a", "b", "c", "d", "e"},
       kMaxStopStrings,
       absl::StatusCode::kInvalidArgument},
      {"over custom max", {"a", "b", "c"}, 2, absl::StatusCode::kInvalidArgument},
      {"invalid utf-8", {"\xff"}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"truncated utf-8", {"\xe7\xbb"}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"overlong utf-8", {"\xc0\xaf"}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"surrogate", {"\xed\xa0\x80"}, kMaxStopStrings, absl::StatusCode::kInvalidArgument},
      {"four strings", {"a", "b", "c", "d"}, kMaxStopStrings, absl::StatusCode::kOk},
      {"none", {}, kMaxStopStrings, absl::StatusCode::kOk},
      {"four-byte char", {"\xf0\x9f\x98\x80"}, kMaxStopStrings, absl::StatusCode::kOk},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(StopMatcher::Create(c.stops, c.max).status().code(), c.code) << c.name;
  }
}

TEST(StopTokensTest, EosAndStopIds) {
  const std::vector<int32_t> eos = {2};
  auto t = StopTokens::Create({7, 9}, eos, /*ignore_eos=*/false, 32);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Check(2), StopTokens::Kind::kEos);
  EXPECT_EQ(t->Check(7), StopTokens::Kind::kStopTokenId);
  EXPECT_EQ(t->Check(9), StopTokens::Kind::kStopTokenId);
  EXPECT_EQ(t->Check(3), StopTokens::Kind::kNone);
}

TEST(StopTokensTest, IgnoreEosKeepsExplicitStopIds) {
  const std::vector<int32_t> eos = {2, 5};
  auto t = StopTokens::Create({5}, eos, /*ignore_eos=*/true, 32);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Check(2), StopTokens::Kind::kNone);
  EXPECT_EQ(t->Check(5), StopTokens::Kind::kStopTokenId);
}

TEST(StopTokensTest, StopIdThatIsAlsoEosReportsTheRequestedStop) {
  const std::vector<int32_t> eos = {2};
  auto t = StopTokens::Create({2}, eos, /*ignore_eos=*/false, 32);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Check(2), StopTokens::Kind::kStopTokenId);
}

TEST(StopTokensTest, OutOfVocabularyIdsAreRejected) {
  EXPECT_EQ(StopTokens::Create({32}, {}, false, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StopTokens::Create({-1}, {}, false, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StopTokens::Create({}, {}, false, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StopTokens::Create({31, 0}, {}, false, 32).ok());
}

}  // namespace
}  // namespace ringlane::router
