#include "worker/model/shard.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "worker/testing/models.h"

namespace ringlane::worker {
namespace {

TEST(Shard, SplitsHeadsMlpAndVocabulary) {
  auto full = BundledStories();  // 8 heads, 4 KV heads, intermediate 172, vocab 512, head_dim 8
  auto s = ShardModel(full, 1, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const TpShard& t = (*s)->shard;
  EXPECT_EQ(t.heads, 4);
  EXPECT_EQ(t.head0, 4);
  EXPECT_EQ(t.kv_heads, 2);
  EXPECT_EQ(t.kv_head0, 2);
  EXPECT_EQ(t.intermediate, 86);
  EXPECT_EQ(t.inter0, 86);
  EXPECT_EQ(t.vocab, 256);
  EXPECT_EQ(t.vocab0, 256);
  const LayerWeights& l = (*s)->layers[0];
  EXPECT_EQ(l.attn.wq.rows, 32);
  EXPECT_EQ(l.attn.wq.Row(0), full->layers[0].attn.wq.Row(32));  // a view, not a copy
  EXPECT_EQ(l.attn.wo.cols, 32);
  EXPECT_EQ(l.attn.wo.col_offset, 32);
  EXPECT_EQ(l.mlp.w_down.cols, 86);
  EXPECT_EQ((*s)->lm_head.Row(0), full->lm_head.Row(256));
}

TEST(Shard, ReplicatesKvHeadsBeyondTheirCount) {
  auto s =
      ShardModel(BundledStories(), 5, 8);  // 8 ranks, 4 KV heads: ranks 4 and 5 share KV head 2
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->shard.heads, 1);
  EXPECT_EQ((*s)->shard.kv_heads, 1);
  EXPECT_EQ((*s)->shard.kv_head0, 2);
}

TEST(Shard, UnevenMlpSplitCoversEveryColumn) {
  auto full = BundledStories();
  int covered = 0;
  for (int r = 0; r < 4; ++r) {
    auto s = ShardModel(full, r, 4);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->shard.inter0, covered);
    covered += (*s)->shard.intermediate;
  }
  EXPECT_EQ(covered, 172);
}

TEST(Shard, RefusesSplitsThatDoNotDivide) {
  EXPECT_EQ(ShardModel(BundledStories(), 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardModel(BundledStories(), 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardModel(BundledStories(), 0, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FirstLayers, ViewsTheFirstLayersUnderTheSameHead) {
  auto full = BundledStories();  // 5 layers
  auto d = FirstLayers(full, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->config.layers, 2);
  ASSERT_EQ((*d)->layers.size(), 2u);
  EXPECT_EQ((*d)->layers[1].attn.wq.Row(0), full->layers[1].attn.wq.Row(0));  // a view
  EXPECT_EQ((*d)->lm_head.Row(0), full->lm_head.Row(0));
  EXPECT_EQ((*d)->embed.Row(7), full->embed.Row(7));
  EXPECT_EQ((*d)->final_norm, full->final_norm);
  EXPECT_EQ((*d)->config.vocab, full->config.vocab);
  // The full model is kept alive by the view.
  EXPECT_EQ((*d)->keep_alive, full);
}

TEST(FirstLayers, RefusesNoLayersAllLayersAndShards) {
  auto full = BundledStories();
  for (int n : {0, -1, 5, 6}) {
    EXPECT_EQ(FirstLayers(full, n).status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
  auto shard = ShardModel(full, 0, 2);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(FirstLayers(*shard, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringlane::worker
