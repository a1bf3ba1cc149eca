// Batch invariance: a lane's tokens (and logits, bit for bit) do not depend on
// which lanes share its rounds, how its prompt is chunked, or when it arrives.
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "router/tokenizer/llama2c_tokenizer.h"
#include "tests/support/lane_runner.h"
#include "tests/support/synthetic_shapes.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

using testing::LaneResult;
using testing::LaneSpec;
using testing::SourcePath;

std::vector<int32_t> Encode(const std::string& text) {
  auto tok = router::Llama2cTokenizer::Load(SourcePath("deploy/models/stories260K/tok512.bin"));
  EXPECT_TRUE(tok.ok());
  return (*tok)->Encode(text, true);
}

// Five different prompts, lengths and sampling settings.
std::vector<LaneSpec> FiveLanes(const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<LaneSpec> lanes(5);
  for (int i = 0; i < 5; ++i) {
    lanes[i].prompt = prompts[i];
    lanes[i].max_new_tokens = 24 + 7 * i;
  }
  lanes[3].sampling.temperature = 0.8f;
  lanes[3].sampling.seed = 1234;
  lanes[4].sampling.temperature = 1.0f;
  lanes[4].sampling.top_p = 0.9f;
  lanes[4].sampling.seed = 99;
  return lanes;
}

void ExpectSameAsSolo(worker::Backend* backend, std::vector<LaneSpec> lanes) {
  std::vector<LaneResult> solo;
  for (const LaneSpec& l : lanes) {
    LaneSpec alone = l;
    alone.arrival_round = 0;
    auto r = testing::RunLanes(backend, {alone}, {.keep_logits = true});
    ASSERT_TRUE(r.ok()) << r.status();
    solo.push_back((*r)[0]);
  }
  // Together: staggered arrivals and the planner's chunking under small
  // token budgets (a lone prefill gets the budget, one beside decode rows
  // min_prefill_chunk tokens, less when decode rows fill the budget), with
  // and without pipelined rounds, so prefill chunks of several sizes share
  // rounds with other lanes' decode steps.
  const std::vector<testing::RunOptions> variants = {
      {.planner = {.round_token_budget = 8, .min_prefill_chunk = 1}, .keep_logits = true},
      {.planner = {.round_token_budget = 5, .min_prefill_chunk = 3},
       .pipeline_depth = 2,
       .keep_logits = true},
      {.planner = {.round_token_budget = 16, .min_prefill_chunk = 7},
       .pipeline_depth = 2,
       .keep_logits = true},
  };
  std::set<std::vector<std::vector<int64_t>>> chunkings;
  for (size_t variant = 0; variant < variants.size(); ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    for (size_t i = 0; i < lanes.size(); ++i) {
      lanes[i].arrival_round = static_cast<int>((i * (variant + 1) * 3) % 11);
    }
    auto together = testing::RunLanes(backend, lanes, variants[variant]);
    ASSERT_TRUE(together.ok()) << together.status();
    int mixed = 0;
    std::vector<std::vector<int64_t>> chunks;
    for (size_t i = 0; i < lanes.size(); ++i) {
      SCOPED_TRACE("lane " + std::to_string(i));
      mixed += (*together)[i].mixed_prefill_chunks;
      chunks.push_back((*together)[i].prefill_chunks);
      ASSERT_EQ((*together)[i].tokens, solo[i].tokens);
      ASSERT_EQ((*together)[i].logits.size(), solo[i].logits.size());
      for (size_t t = 0; t < solo[i].logits.size(); ++t) {
        ASSERT_EQ(std::memcmp((*together)[i].logits[t].data(), solo[i].logits[t].data(),
                              solo[i].logits[t].size() * sizeof(float)),
                  0)
            << "logits differ at generated token " << t;
      }
    }
    EXPECT_GT(mixed, 0) << "no prefill chunk shared a round with a decode row";
    chunkings.insert(chunks);
  }
  EXPECT_EQ(chunkings.size(), variants.size()) << "two variants chunked every prompt alike";
}

class StoriesInvariance : public ::testing::TestWithParam<worker::DType> {};

TEST_P(StoriesInvariance, ConcurrentEqualsSolo) {
  auto backend = testing::MakeCpuBackend(SourcePath("deploy/models/stories260K/stories260K.bin"),
                                         {96, 16, GetParam()});
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<std::vector<int32_t>> prompts = {
      Encode("Once upon a time"), Encode("Lily and Ben"), Encode("The cat"), Encode(""),
      Encode("One day, a little bird flew over the big green tree and saw a dog")};
  ExpectSameAsSolo(backend->get(), FiveLanes(prompts));
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, StoriesInvariance,
                         ::testing::Values(worker::DType::kF32, worker::DType::kBF16,
                                           worker::DType::kFP8E4M3),
                         [](const auto& info) {
                           return std::string(worker::DTypeName(info.param));
                         });

// A synthetic model with FP8 block-scaled weights, GQA and dimensions that
// exercise the kernels' tails (K not a multiple of 8) and the panel path
// (prompts longer than the in-register row limit), with an FP8 KV cache.
TEST(SyntheticFp8Invariance, ConcurrentEqualsSolo) {
  worker::SyntheticModelOptions o = testing::Fp8GqaModel(
      ::testing::TempDir() + "/rl_invariance_fp8", /*intermediate=*/300, /*vocab=*/384, /*seed=*/5);
  o.max_position = 512;
  auto backend = testing::MakeSyntheticBackend(o, {128, 16, worker::DType::kFP8E4M3});
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + 9 * i; ++j) p.push_back((j * 37 + i * 101 + 3) % 384);
    prompts.push_back(p);
  }
  ExpectSameAsSolo(backend->get(), FiveLanes(prompts));
}

// The DeepSeek family: absorbed latent attention over the latent cache, MoE
// routing (groups, correction bias, shared experts) beside dense layers, in
// each weight and KV dtype; the FP8 case has weights past their 128-wide
// blocks, queries without a latent (q_proj) and YaRN RoPE.
struct DeepseekCase {
  std::string name;
  std::string preset;
  worker::DType weights;
  worker::DType kv;
  // DSA past the dense window: 0 keeps it far away; else the lanes cross it
  // while they prefill and decode, with this indexer sharing.
  int dense_window = 0;
  std::string indexer_types;
  // glm5_next: the KDA gate's lower bound (0: the softplus gate).
  float linear_lower_bound = 0.0f;
  int hc_mult = 1;      // glm5_next: hyper-connections' residual streams
  int index_kpool = 1;  // glm5_next: the pooled indexer
  // glm5_next: the KDA chunk (0: every position through the recurrence);
  // the planner cuts prefill at its multiples.
  int kda_chunk = 0;
};

class DeepseekInvariance : public ::testing::TestWithParam<DeepseekCase> {};

TEST_P(DeepseekInvariance, ConcurrentEqualsSolo) {
  const DeepseekCase& c = GetParam();
  auto o = worker::SyntheticPreset(c.preset);
  ASSERT_TRUE(o.ok()) << o.status();
  o->out_dir = ::testing::TempDir() + "/rl_invariance_" + c.name;
  o->dtype = c.weights;
  o->max_position = 512;
  if (c.weights == worker::DType::kFP8E4M3) {
    o->hidden = 160;
    o->q_lora_rank = 0;
    o->yarn_factor = 4.0f;
  }
  o->index_topk = 6;
  o->indexer_types = c.indexer_types;
  o->linear_lower_bound = c.linear_lower_bound;
  o->hc_mult = c.hc_mult;
  o->index_kpool = c.index_kpool;
  // State slots for glm5_next's recurrent layers; other models have none.
  auto backend = testing::MakeSyntheticBackend(*o, {128, 16, c.kv, 8}, {.threads = 2},
                                               [&](worker::ModelConfig& config) {
                                                 if (c.dense_window > 0)
                                                   config.indexer.dense_window = c.dense_window;
                                                 config.linear.chunk = c.kda_chunk;
                                               });
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 4 + 9 * i; ++j) p.push_back((j * 37 + i * 101 + 3) % o->vocab);
    prompts.push_back(p);
  }
  ExpectSameAsSolo(backend->get(), FiveLanes(prompts));
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeepseekInvariance,
    ::testing::Values(
        DeepseekCase{"deepseek_v3_f32", "deepseek-tiny", worker::DType::kF32, worker::DType::kF32},
        DeepseekCase{"glm_moe_dsa_bf16", "glm5-tiny", worker::DType::kBF16, worker::DType::kBF16},
        DeepseekCase{"deepseek_v3_fp8", "deepseek-tiny", worker::DType::kFP8E4M3,
                     worker::DType::kFP8E4M3},
        DeepseekCase{"glm_moe_dsa_sparse_shared", "glm5-tiny", worker::DType::kBF16,
                     worker::DType::kBF16, 12, "FSF"},
        DeepseekCase{"glm_moe_dsa_sparse_fp8_kv", "glm5-tiny", worker::DType::kBF16,
                     worker::DType::kFP8E4M3, 20},
        // GLM-5.3-Flash's hybrid: three KDA layers (a recurrent state per
        // lane, chunk by chunk and token by token) and a NoPE MLA layer
        // with the indexer past its window; both gates.
        DeepseekCase{"glm5_next_bf16", "glm5-next-tiny", worker::DType::kBF16, worker::DType::kBF16,
                     12},
        DeepseekCase{"glm5_next_lower_bound_fp8_kv", "glm5-next-tiny", worker::DType::kBF16,
                     worker::DType::kFP8E4M3, 0, "", -5.0f},
        // Four residual streams (manifold-constrained hyper-connections).
        DeepseekCase{"glm5_next_hyper_connections", "glm5-next-tiny", worker::DType::kBF16,
                     worker::DType::kBF16, 12, "", 0.0f, 4},
        // The pooled indexer (pools of 2 positions, their gate scores in the
        // FP8 latent rows) past its window.
        DeepseekCase{"glm5_next_pooled_indexer_fp8_kv", "glm5-next-tiny", worker::DType::kBF16,
                     worker::DType::kFP8E4M3, 12, "", 0.0f, 1, 2},
        // The chunked KDA form: chunks of 4 (budgets of 5, 8 and 16 cut
        // prompts anywhere; the planner cuts them at chunk ends), and
        // chunks of 8 (more than a budget of 5: one chunk a round).
        DeepseekCase{"glm5_next_chunked", "glm5-next-tiny", worker::DType::kBF16,
                     worker::DType::kBF16, 12, "", 0.0f, 1, 1, 4},
        DeepseekCase{"glm5_next_chunked_hyper_lower_bound", "glm5-next-tiny", worker::DType::kBF16,
                     worker::DType::kBF16, 0, "", -5.0f, 4, 1, 8}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ringlane
