// The DeepSeek family's config.json keys (deepseek_v3, deepseek_v32,
// glm_moe_dsa) as transformers writes them, the bad-input table of what the
// engine refuses and why, and tied checkpoints that store only lm_head.weight.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/backend/factory.h"
#include "worker/model/hf_config.h"
#include "worker/model/model.h"
#include "worker/model/rope.h"
#include "worker/model/shard.h"
#include "worker/model/synthetic.h"

namespace ringlane::worker {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

// GLM-5's published shape (transformers' GlmMoeDsaConfig defaults), written
// the way its config.json is: rope_parameters, mlp_layer_types.
Json Glm5Config() {
  Json j;
  j["model_type"] = "glm_moe_dsa";
  j["vocab_size"] = 154880;
  j["hidden_size"] = 6144;
  j["intermediate_size"] = 12288;
  j["moe_intermediate_size"] = 2048;
  j["num_hidden_layers"] = 78;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 64;
  j["n_shared_experts"] = 1;
  j["n_routed_experts"] = 256;
  j["routed_scaling_factor"] = 2.5;
  j["kv_lora_rank"] = 512;
  j["q_lora_rank"] = 2048;
  j["qk_rope_head_dim"] = 64;
  j["qk_nope_head_dim"] = 192;
  j["v_head_dim"] = 256;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 8;
  j["norm_topk_prob"] = true;
  j["max_position_embeddings"] = 202752;
  j["rms_norm_eps"] = 1e-5;
  j["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  Json types = Json::array();
  for (int l = 0; l < 78; ++l) types.push_back(l < 3 ? "dense" : "sparse");
  j["mlp_layer_types"] = types;
  j["index_topk"] = 2048;
  j["index_head_dim"] = 128;
  j["index_n_heads"] = 32;
  j["quantization_config"] = {
      {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  return j;
}

// DeepSeek-V3's published config.json (the keys that shape the model).
Json DeepseekV3Config() {
  Json j;
  j["model_type"] = "deepseek_v3";
  j["vocab_size"] = 129280;
  j["hidden_size"] = 7168;
  j["intermediate_size"] = 18432;
  j["moe_intermediate_size"] = 2048;
  j["num_hidden_layers"] = 61;
  j["num_attention_heads"] = 128;
  j["num_key_value_heads"] = 128;
  j["n_shared_experts"] = 1;
  j["n_routed_experts"] = 256;
  j["routed_scaling_factor"] = 2.5;
  j["kv_lora_rank"] = 512;
  j["q_lora_rank"] = 1536;
  j["qk_rope_head_dim"] = 64;
  j["qk_nope_head_dim"] = 128;
  j["v_head_dim"] = 128;
  j["n_group"] = 8;
  j["topk_group"] = 4;
  j["num_experts_per_tok"] = 8;
  j["first_k_dense_replace"] = 3;
  j["moe_layer_freq"] = 1;
  j["norm_topk_prob"] = true;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["max_position_embeddings"] = 163840;
  j["rms_norm_eps"] = 1e-6;
  j["rope_theta"] = 10000;
  j["rope_scaling"] = {{"beta_fast", 32},       {"beta_slow", 1},
                       {"factor", 40},          {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                       {"type", "yarn"}};
  return j;
}

TEST(DeepseekConfigTest, ParsesGlm5) {
  absl::StatusOr<HfConfig> hf = ParseHfConfig(Glm5Config().dump(), "glm5/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& c = hf->config;
  EXPECT_TRUE(IsMla(c));
  EXPECT_TRUE(hf->fp8_block_scaled);
  EXPECT_EQ(c.mla.q_lora_rank, 2048);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 192);
  EXPECT_EQ(c.mla.v_head_dim, 256);
  EXPECT_EQ(c.head_dim, 64);  // the rope part
  EXPECT_EQ(c.kv_heads, 64);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_EQ(c.moe.n_routed, 256);
  EXPECT_EQ(c.moe.experts_per_token, 8);
  EXPECT_EQ(c.moe.expert_intermediate, 2048);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 2.5f);
  EXPECT_TRUE(c.moe.sigmoid_scoring);
  EXPECT_TRUE(c.moe.correction_bias);
  ASSERT_EQ(c.moe.sparse_layer.size(), 78u);
  EXPECT_FALSE(c.moe.sparse_layer[2]);
  EXPECT_TRUE(c.moe.sparse_layer[3]);
  EXPECT_EQ(c.indexer.topk, 2048);
  EXPECT_EQ(c.indexer.heads, 32);
  EXPECT_EQ(c.indexer.head_dim, 128);
  EXPECT_TRUE(c.indexer.rope_interleave);
  EXPECT_EQ(c.mtp_layers, 0);  // the test config names none
  Json with_mtp = Glm5Config();
  with_mtp["num_nextn_predict_layers"] = 1;
  hf = ParseHfConfig(with_mtp.dump(), "glm5/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->config.mtp_layers, 1);
  EXPECT_TRUE(hf->config.mtp_sparse);  // GLM's list names the main layers; MTP is MoE
}

// The MTP layer loads beside the model (its own indexer, MoE part, fusion
// and head), and MtpDrafter views it as a one-layer drafter; without one,
// the drafter is refused.
TEST(DeepseekConfigTest, MtpLayerLoadsAndMakesADrafter) {
  auto o = SyntheticPreset("glm5-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_mtp_load";
  o->mtp_layers = 1;
  ASSERT_TRUE(WriteSyntheticModel(*o).ok());
  auto w = LoadModel(o->out_dir);
  ASSERT_TRUE(w.ok()) << w.status();
  std::shared_ptr<const ModelWeights> full(std::move(*w));
  ASSERT_NE(full->mtp, nullptr);
  EXPECT_EQ(full->mtp->eh_proj.cols, 2 * full->config.hidden);
  EXPECT_TRUE(full->mtp->layer.sparse);
  EXPECT_GT(full->mtp->layer.indexer.wk.rows, 0);
  auto d = MtpDrafter(full);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->config.layers, 1);
  EXPECT_TRUE((*d)->config.mtp_drafter);
  EXPECT_EQ((*d)->lm_head.data, full->mtp->head.data);
  // A drafter round without hidden states is refused, not run.
  auto b = CreateBackend(*d, BackendOptions{}, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->AllocateKvPool({4, 16, DType::kF32}).ok());
  RoundInput in;
  in.seqs.push_back(SeqStep{.start_position = 0, .tokens = {1, 2}, .block_ids = {0}});
  auto r = (*b)->Step(in);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("hidden"));

  o->out_dir = ::testing::TempDir() + "/rl_mtp_none";
  o->mtp_layers = 0;
  ASSERT_TRUE(WriteSyntheticModel(*o).ok());
  auto none = LoadModel(o->out_dir);
  ASSERT_TRUE(none.ok());
  std::shared_ptr<const ModelWeights> plain(std::move(*none));
  EXPECT_EQ(plain->mtp, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(MtpDrafter(plain).status()));
}

TEST(DeepseekConfigTest, ParsesDeepseekV3WithYarn) {
  absl::StatusOr<HfConfig> hf = ParseHfConfig(DeepseekV3Config().dump(), "v3/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& c = hf->config;
  EXPECT_EQ(c.indexer.topk, 0);  // no DSA in V3
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_FALSE(c.moe.sparse_layer[2]);
  EXPECT_TRUE(c.moe.sparse_layer[3]);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.original_max_position, 4096);
  EXPECT_NEAR(YarnSoftmaxMscale(c.rope_scaling), 0.1 * std::log(40.0) + 1.0, 1e-6);
  // YaRN keeps the fastest rotating pairs and interpolates the slowest.
  const std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[31], std::pow(10000.0, -62.0 / 64) / 40, 1e-12);

  Json v32 = DeepseekV3Config();
  v32["model_type"] = "deepseek_v32";
  hf = ParseHfConfig(v32.dump(), "v32/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->config.indexer.heads, 64);
  EXPECT_FALSE(hf->config.indexer.rope_interleave);
}

// What the engine refuses: each row changes one key; the error names it.
TEST(DeepseekConfigTest, BadConfigsNameTheField) {
  struct Row {
    const char* key;
    Json value;
    absl::StatusCode code;
    const char* says;
  };
  const Json yarn_off = {{"type", "yarn"},
                         {"factor", 40},
                         {"mscale", 0.707},
                         {"mscale_all_dim", 1.0},
                         {"original_max_position_embeddings", 4096}};
  const std::vector<Row> rows = {
      {"kv_lora_rank", nullptr, absl::StatusCode::kInvalidArgument, "kv_lora_rank"},
      {"qk_rope_head_dim", 63, absl::StatusCode::kInvalidArgument, "qk_rope_head_dim"},
      {"v_head_dim", 0, absl::StatusCode::kInvalidArgument, "v_head_dim"},
      {"q_lora_rank", -1, absl::StatusCode::kInvalidArgument, "q_lora_rank"},
      {"num_experts_per_tok", 0, absl::StatusCode::kInvalidArgument, "num_experts_per_tok"},
      {"num_experts_per_tok", 300, absl::StatusCode::kInvalidArgument, "num_experts_per_tok"},
      {"n_group", 7, absl::StatusCode::kInvalidArgument, "n_group"},
      {"topk_group", 9, absl::StatusCode::kInvalidArgument, "topk_group"},
      {"routed_scaling_factor", -1, absl::StatusCode::kInvalidArgument, "routed_scaling_factor"},
      {"scoring_func", "tanh", absl::StatusCode::kUnimplemented, "scoring_func"},
      {"topk_method", "group_limited_greedy", absl::StatusCode::kUnimplemented, "topk_method"},
      {"moe_layer_freq", 2, absl::StatusCode::kUnimplemented, "moe_layer_freq"},
      {"rope_scaling", yarn_off, absl::StatusCode::kUnimplemented, "mscale"},
      {"mlp_layer_types", Json::array({"dense"}), absl::StatusCode::kInvalidArgument,
       "mlp_layer_types"},
      {"first_k_dense_replace", -1, absl::StatusCode::kInvalidArgument, "first_k_dense_replace"},
      {"moe_intermediate_size", nullptr, absl::StatusCode::kInvalidArgument,
       "moe_intermediate_size"},
      {"num_nextn_predict_layers", -1, absl::StatusCode::kInvalidArgument,
       "num_nextn_predict_layers"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(r.key) + " = " + r.value.dump());
    Json j = DeepseekV3Config();
    j[r.key] = r.value;
    absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "bad/config.json");
    ASSERT_FALSE(hf.ok());
    EXPECT_EQ(hf.status().code(), r.code) << hf.status();
    EXPECT_THAT(std::string(hf.status().message()), HasSubstr(r.says));
  }
  Json glm = Glm5Config();
  glm["index_head_dim"] = 32;  // below the rope part it rotates
  absl::StatusOr<HfConfig> hf = ParseHfConfig(glm.dump(), "bad/config.json");
  EXPECT_TRUE(absl::IsInvalidArgument(hf.status())) << hf.status();
  EXPECT_THAT(std::string(hf.status().message()), HasSubstr("index_head_dim"));
}

// A GLM-5.3-Flash-shaped glm5_next config: 45 layers, three KDA layers in
// four, NoPE MLA with the indexer, the gate's lower bound.
Json Glm5NextConfig() {
  Json j = Glm5Config();
  j["model_type"] = "glm5_next";
  j["num_hidden_layers"] = 45;
  j["qk_rope_head_dim"] = 0;
  Json mlp = Json::array(), layers = Json::array();
  for (int l = 0; l < 45; ++l) {
    mlp.push_back(l < 1 ? "dense" : "sparse");
    layers.push_back(l % 4 == 3 ? "full_attention" : "linear_attention");
  }
  j["mlp_layer_types"] = mlp;
  j["layer_types"] = layers;
  j["linear_num_heads"] = 32;
  j["linear_head_dim"] = 128;
  j["linear_conv_kernel_dim"] = 4;
  j["linear_lower_bound"] = -5.0;
  return j;
}

TEST(DeepseekConfigTest, Glm5NextPooledIndexerIsRead) {
  Json j = Glm5NextConfig();
  j["index_topk"] = 2048;
  j["index_kpool"] = 4;
  j["index_kpool_always_select_tail"] = true;
  j["index_kpool_compress"] = true;
  absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "glm5_next/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const IndexerConfig& x = hf->config.indexer;
  EXPECT_TRUE(x.Pooled());
  EXPECT_EQ(x.kpool, 4);
  // 512 pools and a tail of up to 3: GLM-5.3-Flash's 2051 positions.
  EXPECT_EQ(x.SelectionWidth(), 2051);
  EXPECT_EQ(x.CachedDim(), 2 * x.head_dim);
  for (const char* key : {"index_kpool_always_select_tail", "index_kpool_compress"}) {
    Json off = j;
    off[key] = false;
    hf = ParseHfConfig(off.dump(), "glm5_next/config.json");
    ASSERT_FALSE(hf.ok()) << key;
    EXPECT_EQ(hf.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(hf.status().message()), ::testing::HasSubstr(key));
  }
  j["index_kpool"] = false;
  hf = ParseHfConfig(j.dump(), "glm5_next/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_FALSE(hf->config.indexer.Pooled());
}

TEST(DeepseekConfigTest, Glm5NextHyperConnectionsAreRead) {
  Json j = Glm5NextConfig();
  j["hc_mult"] = 4;
  j["hc_sinkhorn_iters"] = 7;
  j["hc_eps"] = 1e-5;
  absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "glm5_next/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const HyperConfig& h = hf->config.hyper;
  EXPECT_TRUE(h.enabled());
  EXPECT_EQ(h.mult, 4);
  EXPECT_EQ(h.sinkhorn_iters, 7);
  EXPECT_EQ(h.eps, 1e-5f);
  EXPECT_EQ(h.mix_dim(), 24);
  j.erase("hc_sinkhorn_iters");
  j.erase("hc_eps");
  hf = ParseHfConfig(j.dump(), "glm5_next/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->config.hyper.sinkhorn_iters, 20);
  EXPECT_EQ(hf->config.hyper.eps, 1e-6f);
}

TEST(DeepseekConfigTest, Glm5NextLayersAndStateAreRead) {
  absl::StatusOr<HfConfig> hf = ParseHfConfig(Glm5NextConfig().dump(), "glm5_next/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& c = hf->config;
  EXPECT_TRUE(IsDeepseekFamily(c.model_type));
  EXPECT_EQ(c.mla.qk_rope_head_dim, 0);
  EXPECT_EQ(c.linear.heads, 32);
  EXPECT_EQ(c.linear.head_dim, 128);
  EXPECT_TRUE(c.linear.has_lower_bound);
  EXPECT_EQ(c.linear.lower_bound, -5.0f);
  EXPECT_EQ(c.moe.swiglu_limit, 0.0f);
  EXPECT_FALSE(c.hyper.enabled());
  int linear = 0;
  for (int l = 0; l < c.layers; ++l) linear += c.linear.Linear(l);
  EXPECT_EQ(linear, 34);
  EXPECT_FALSE(c.linear.Linear(3));
  // Per lane and KDA layer: 3 x 4096 channels x 3 convolution inputs and 32
  // matrices of 128 x 128, in float32: 2.2 MB, whatever the context.
  EXPECT_EQ(c.linear.StateFloats(), 3 * 4096 * 3 + 32 * 128 * 128);
  // The KV pool holds only the 11 MLA layers' latent rows.
  absl::StatusOr<int64_t> block = KvBlockBytes(
      kCpuBackend, c, TpShard{0, 1, 0, c.heads, 0, c.kv_heads, 0, c.intermediate, 0, c.vocab},
      {1, 64, DType::kF32});
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(*block, (512 + 128) * 4 * 64 * 11);
}

TEST(DeepseekConfigTest, BadGlm5NextConfigsNameTheField) {
  struct Row {
    const char* key;
    Json value;
    absl::StatusCode code;
    const char* says;
  };
  const std::vector<Row> rows = {
      {"layer_types", nullptr, absl::StatusCode::kInvalidArgument, "layer_types"},
      {"layer_types", Json::array({"linear_attention"}), absl::StatusCode::kInvalidArgument,
       "layer_types"},
      {"linear_num_heads", nullptr, absl::StatusCode::kInvalidArgument, "linear_num_heads"},
      {"linear_head_dim", 0, absl::StatusCode::kInvalidArgument, "linear_head_dim"},
      {"linear_conv_kernel_dim", 0, absl::StatusCode::kInvalidArgument, "linear_conv_kernel_dim"},
      {"linear_lower_bound", 2.0, absl::StatusCode::kInvalidArgument, "linear_lower_bound"},
      {"hc_mult", 0, absl::StatusCode::kInvalidArgument, "hc_mult"},
      {"hc_mult", 17, absl::StatusCode::kInvalidArgument, "hc_mult"},
      {"hc_sinkhorn_iters", 0, absl::StatusCode::kInvalidArgument, "hc_sinkhorn_iters"},
      {"hc_eps", -1e-6, absl::StatusCode::kInvalidArgument, "hc_eps"},
      {"index_kpool", true, absl::StatusCode::kInvalidArgument, "index_kpool"},
      {"index_kpool", 3, absl::StatusCode::kInvalidArgument, "index_kpool"},
      {"index_kpool", 128, absl::StatusCode::kInvalidArgument, "index_kpool"},
      {"swiglu_limit", -7.0, absl::StatusCode::kInvalidArgument, "swiglu_limit"},
      {"indexer_types", Json::array({"full"}), absl::StatusCode::kUnimplemented, "indexer_types"},
      {"qk_rope_head_dim", -2, absl::StatusCode::kInvalidArgument, "qk_rope_head_dim"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(r.key) + " = " + r.value.dump());
    Json j = Glm5NextConfig();
    j[r.key] = r.value;
    absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "bad/config.json");
    ASSERT_FALSE(hf.ok());
    EXPECT_EQ(hf.status().code(), r.code) << hf.status();
    EXPECT_THAT(std::string(hf.status().message()), HasSubstr(r.says));
  }
  // Another family keeps refusing NoPE.
  Json glm = Glm5Config();
  glm["qk_rope_head_dim"] = 0;
  EXPECT_FALSE(ParseHfConfig(glm.dump(), "bad/config.json").ok());
}

// KV bytes per token and layer of the published shapes, from the configs
// alone: DeepSeek-V3's FP8 latent is fp8_ds_mla's 656 bytes (512 E4M3 + 4
// float scales + 64 BF16), GLM-5 adds its indexer key (128 E4M3 + a scale);
// every TP rank keeps the same row (the latent is not split by heads).
TEST(DeepseekConfigTest, LatentKvBytesPerTokenOfThePublishedShapes) {
  struct Row {
    Json config;
    DType kv;
    int64_t bytes_per_token_layer;
  };
  for (const Row& r : {Row{DeepseekV3Config(), DType::kFP8E4M3, 656},
                       Row{Glm5Config(), DType::kFP8E4M3, 656 + 132},
                       Row{DeepseekV3Config(), DType::kBF16, (512 + 64) * 2},
                       Row{Glm5Config(), DType::kF32, (512 + 64 + 128) * 4}}) {
    absl::StatusOr<HfConfig> hf = ParseHfConfig(r.config.dump(), "config.json");
    ASSERT_TRUE(hf.ok()) << hf.status();
    const ModelConfig& c = hf->config;
    SCOPED_TRACE(c.model_type + " " + std::string(DTypeName(r.kv)));
    for (int world : {1, 4}) {
      TpShard shard{
          0, world,          0, c.heads / world, 0, c.kv_heads / world, 0, c.intermediate / world,
          0, c.vocab / world};
      absl::StatusOr<int64_t> block = KvBlockBytes(kCpuBackend, c, shard, {1, 64, r.kv});
      ASSERT_TRUE(block.ok()) << block.status();
      EXPECT_EQ(*block, r.bytes_per_token_layer * 64 * c.layers) << "TP" << world;
    }
  }
}

// Renames one tensor in a single-file safetensors checkpoint (the header is
// JSON; data offsets are relative to its end, so only the header changes).
void RenameTensor(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  Json header = Json::parse(bytes.substr(8, n));
  Json renamed;
  for (auto& [k, v] : header.items()) renamed[k == from ? to : k] = v;
  std::string text = renamed.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << text << bytes.substr(8 + n);
}

// transformers saves a tied model with lm_head.weight alone; it loads, and
// as the same matrix the embedding name would have given.
TEST(DeepseekConfigTest, TiedCheckpointStoringOnlyLmHeadLoads) {
  for (const char* preset : {"tiny", "deepseek-tiny"}) {
    SCOPED_TRACE(preset);
    auto o = SyntheticPreset(preset);
    ASSERT_TRUE(o.ok());
    o->out_dir = ::testing::TempDir() + "/rl_tied_lm_head_" + preset;
    o->tie_embeddings = true;
    ASSERT_TRUE(WriteSyntheticModel(*o).ok());
    std::string embedding;  // copied out: the rename rewrites the mapped file
    {
      auto embed_named = LoadModel(o->out_dir);
      ASSERT_TRUE(embed_named.ok()) << embed_named.status();
      const Matrix& a = (*embed_named)->embed;
      embedding.assign(static_cast<const char*>(a.data), a.rows * a.row_stride_bytes);
    }
    RenameTensor(o->out_dir + "/model.safetensors", "model.embed_tokens.weight", "lm_head.weight");
    auto head_named = LoadModel(o->out_dir);
    ASSERT_TRUE(head_named.ok()) << head_named.status();
    const Matrix& b = (*head_named)->lm_head;
    ASSERT_EQ(static_cast<size_t>(b.rows * b.row_stride_bytes), embedding.size());
    EXPECT_EQ(std::memcmp(embedding.data(), b.data, embedding.size()), 0);
    EXPECT_EQ((*head_named)->embed.data, b.data);
  }
}

}  // namespace
}  // namespace ringlane::worker
