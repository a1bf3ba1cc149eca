#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/backend/factory.h"
#include "worker/graph/factory.h"
#include "worker/model/model.h"
#include "worker/model/shard.h"
#include "worker/model/synthetic.h"
#include "worker/testing/models.h"

namespace ringlane::worker {
namespace {

using ::testing::HasSubstr;

// A view of the bundled model that says it is of `model_type`.
std::shared_ptr<const ModelWeights> As(const std::string& model_type) {
  std::shared_ptr<const ModelWeights> base = BundledStories();
  auto m = std::make_shared<ModelWeights>();
  m->config = base->config;
  m->config.model_type = model_type;
  m->shard = base->shard;
  m->embed = base->embed;
  m->layers = base->layers;
  m->final_norm = base->final_norm;
  m->lm_head = base->lm_head;
  m->keep_alive = base;
  return m;
}

// The Llama graph runs every model_type the loader accepts today.
TEST(GraphFactory, LlamaFamilyModelTypesGetTheLlamaGraph) {
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    std::shared_ptr<const ModelWeights> m = As(type);
    absl::StatusOr<std::unique_ptr<ModelGraph>> g = CreateGraph(m);
    ASSERT_TRUE(g.ok()) << type << ": " << g.status();
    EXPECT_EQ((*g)->family(), "llama");
  }
}

// A family with no graph is an error at creation, never an abort or a wrong
// forward pass, and the backend and the pool sizing say so too.
TEST(GraphFactory, UnknownFamilyIsUnimplementedEverywhere) {
  std::shared_ptr<const ModelWeights> m = As("mamba2");
  absl::StatusOr<std::unique_ptr<ModelGraph>> g = CreateGraph(m);
  EXPECT_TRUE(absl::IsUnimplemented(g.status())) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("mamba2"));
  EXPECT_TRUE(absl::IsUnimplemented(CreateCpuBackend(m, {}).status()));
  EXPECT_TRUE(absl::IsUnimplemented(GraphLayerCaches(m->config, m->shard).status()));
  EXPECT_TRUE(absl::IsUnimplemented(
      KvBlockBytes(kCpuBackend, m->config, m->shard, KvPoolSpec{1, 16, DType::kF32}).status()));
  EXPECT_TRUE(absl::IsUnimplemented(LayerCaches(kCpuBackend, m->config, m->shard).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CreateGraph(nullptr).status()));
}

// What the worker advertises before loading (LayerCaches from the config) is
// what the backend it then makes keeps, for a whole model and for a shard.
TEST(GraphFactory, CachesFromTheConfigAreTheBackendsCaches) {
  auto full = BundledStories();
  auto shard = ShardModel(full, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (const auto& m : {full, *shard}) {
    absl::StatusOr<std::vector<LayerCacheSpec>> want =
        LayerCaches(kCpuBackend, m->config, m->shard);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCpuBackend(m, {});
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<LayerCacheSpec> got = (*b)->layer_caches();
    ASSERT_EQ(got.size(), want->size());
    for (size_t l = 0; l < got.size(); ++l) {
      EXPECT_EQ(got[l].kind, (*want)[l].kind) << l;
      EXPECT_EQ(got[l].kv_heads, (*want)[l].kv_heads) << l;
      EXPECT_EQ(got[l].head_dim, (*want)[l].head_dim) << l;
    }
    // And the pool it allocates has the block size the sizing promised.
    const KvPoolSpec spec{3, 16, DType::kBF16};
    ASSERT_TRUE((*b)->AllocateKvPool(spec).ok());
    absl::StatusOr<int64_t> bytes = KvBlockBytes(kCpuBackend, m->config, m->shard, spec);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ((*b)->kv_block_bytes(), *bytes);
  }
}

// A DeepSeek-family type over a config without latent attention (never what
// the loader makes) is refused, not run as a latent graph of zero sizes.
TEST(GraphFactory, DeepseekTypeWithoutLatentAttentionIsInvalid) {
  std::shared_ptr<const ModelWeights> m = As("glm_moe_dsa");
  EXPECT_TRUE(absl::IsInvalidArgument(CreateGraph(m).status())) << CreateGraph(m).status();
  EXPECT_TRUE(absl::IsInvalidArgument(GraphLayerCaches(m->config, m->shard).status()));
}

// The DeepSeek family keeps one latent cache per layer: kv_lora_rank +
// qk_rope_head_dim values per token, the same on every TP rank.
TEST(GraphFactory, DeepseekFamilyKeepsOneLatentPerTokenAndLayer) {
  auto o = SyntheticPreset("deepseek-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_graph_factory_deepseek";
  ASSERT_TRUE(WriteSyntheticModel(*o).ok());
  auto loaded = LoadModel(o->out_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const ModelWeights> full(std::move(*loaded));
  auto shard = ShardModel(full, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const int width = o->kv_lora_rank + o->qk_rope_head_dim;
  for (const auto& m : {full, *shard}) {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCpuBackend(m, {});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->name().find("cpu"), 0u);
    for (const LayerCacheSpec& c : (*b)->layer_caches()) {
      EXPECT_EQ(c.kind, CacheKind::kLatentKv);
      EXPECT_EQ(c.latent_dim, o->kv_lora_rank);
      EXPECT_EQ(c.rope_dim, o->qk_rope_head_dim);
    }
    const KvPoolSpec spec{3, 16, DType::kF32};
    ASSERT_TRUE((*b)->AllocateKvPool(spec).ok());
    EXPECT_EQ((*b)->kv_block_bytes(), int64_t{o->layers} * 16 * width * 4);
    absl::StatusOr<int64_t> bytes = KvBlockBytes(kCpuBackend, m->config, m->shard, spec);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ((*b)->kv_block_bytes(), *bytes);
  }
}

}  // namespace
}  // namespace ringlane::worker
