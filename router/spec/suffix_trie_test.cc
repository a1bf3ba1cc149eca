// The cut suffix trie: what Add indexes, Remove and the sliding window
// undo exactly (no node leaks), and which continuation a context gets.
#include "router/spec/suffix_trie.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;

TEST(SuffixTrieTest, MostFrequentContinuationOfTheLongestMatch) {
  SuffixTrie t(8);
  // "1 2 3" is followed by 4 twice and by 5 once; "9 2 3" by 7.
  t.Add({1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 9, 2, 3, 7});
  const std::vector<int32_t> ctx = {8, 1, 2, 3};
  SuffixTrie::Match m = t.LongestMatch(ctx, 6);
  EXPECT_EQ(m.length, 3);
  EXPECT_THAT(t.Continue(m, 2), ElementsAre(4, 0));
  // A shorter pattern pools every "2 3": 4 (twice), 5, 7.
  m = t.LongestMatch(ctx, 2);
  EXPECT_EQ(m.length, 2);
  EXPECT_THAT(t.Continue(m, 1), ElementsAre(4));
  // 4 follows "2 3" on 2 of its 4 paths: a 0.6 floor stops it.
  EXPECT_TRUE(t.Continue(m, 1, 0.6).empty());
  const std::vector<int32_t> unseen = {42};
  EXPECT_EQ(t.LongestMatch(unseen, 4).length, 0);
}

TEST(SuffixTrieTest, RemoveUndoesAdd) {
  SuffixTrie t(6);
  const std::vector<int32_t> a = {1, 2, 3, 1, 2, 4, 1, 2, 3};
  const std::vector<int32_t> b = {5, 1, 2, 9};
  t.Add(a);
  const int64_t after_a = t.nodes();
  t.Add(b);
  t.Remove(a);
  t.Remove(b);
  EXPECT_EQ(t.nodes(), 0);
  t.Add(a);
  EXPECT_EQ(t.nodes(), after_a);  // freed nodes are reused
}

TEST(SuffixTrieTest, AppendEqualsAddAndTheWindowSlidesWithoutLeaks) {
  std::mt19937 rng(7);
  std::vector<int32_t> seq(500);
  for (int32_t& x : seq) x = static_cast<int32_t>(rng() % 6);
  SuffixTrie streamed(5), whole(5);
  for (int32_t x : seq) streamed.Append(x);
  whole.Add(seq);
  EXPECT_EQ(streamed.nodes(), whole.nodes());
  const std::vector<int32_t> ctx(seq.end() - 3, seq.end());
  EXPECT_EQ(streamed.Continue(streamed.LongestMatch(ctx, 4), 3),
            whole.Continue(whole.LongestMatch(ctx, 4), 3));

  // A window of 20 over the same sequence holds what Add of its last 20
  // tokens does, whatever came before.
  SuffixTrie window(5);
  const size_t w = 20;
  for (size_t i = 0; i < seq.size(); ++i) {
    window.Append(seq[i]);
    if (i + 1 > w) {
      window.DropFront(absl::MakeConstSpan(seq).subspan(i - w));
    }
  }
  SuffixTrie last(5);
  last.Add(absl::MakeConstSpan(seq).subspan(seq.size() - w));
  EXPECT_EQ(window.nodes(), last.nodes());
}

}  // namespace
}  // namespace ringlane::router
