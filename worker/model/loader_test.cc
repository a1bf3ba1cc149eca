#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/dtype.h"
#include "worker/model/hf_config.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"
#include "worker/model/synthetic.h"

namespace ringlane::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const char kStories[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K/stories260K.bin";

std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = ::testing::TempDir() + "/loader_test_" + std::to_string(::getpid()) + "_" +
                    info->test_suite_name() + "_" + info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

float At(const Matrix& m, int64_t r, int64_t c) {
  return LoadAsFloat(m.dtype, m.Row(r), c) * m.ScaleAt(r, c);
}

// ---------------------------------------------------------------------------
// llama2.c

TEST(LoaderTest, LoadsStories260K) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(kStories);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = (*w)->config;
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.intermediate, 172);
  EXPECT_EQ(c.layers, 5);
  EXPECT_EQ(c.heads, 8);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.max_position, 512);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_TRUE(ValidateConfig(c).ok());

  const ModelWeights& m = **w;
  ASSERT_EQ(m.layers.size(), 5u);
  EXPECT_EQ(m.embed.rows, 512);
  EXPECT_EQ(m.embed.cols, 64);
  EXPECT_EQ(m.lm_head.data, m.embed.data);  // tied
  EXPECT_EQ(m.layers[0].attn.wk.rows, 32);
  EXPECT_EQ(m.layers[0].attn.wk.cols, 64);
  EXPECT_EQ(m.layers[4].mlp.w_down.rows, 64);
  EXPECT_EQ(m.layers[4].mlp.w_down.cols, 172);
  EXPECT_EQ(m.layers[4].mlp.w_up.row_stride_bytes, 64 * 4);
  EXPECT_EQ(m.final_norm.size(), 64u);

  // The embedding starts right after the 28-byte header; the final norm sits
  // before the two RoPE tables (2 * 512 * 4 floats) at the end of the file.
  const std::string raw = ReadBytes(kStories);
  float first_embed, last_final_norm, first_wq_l1;
  std::memcpy(&first_embed, raw.data() + 28, 4);
  std::memcpy(&last_final_norm, raw.data() + raw.size() - 2 * 512 * 4 * 4 - 4, 4);
  std::memcpy(&first_wq_l1, raw.data() + 28 + 4 * (512 * 64 + 5 * 64 + 64 * 64), 4);
  EXPECT_EQ(At(m.embed, 0, 0), first_embed);
  EXPECT_EQ(m.final_norm.back(), last_final_norm);
  EXPECT_EQ(At(m.layers[1].attn.wq, 0, 0), first_wq_l1);

  // Trained weights: finite, not all zero, norms of plausible size.
  for (const LayerWeights& l : m.layers) {
    for (const Matrix* mat : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo, &l.mlp.w_gate,
                              &l.mlp.w_up, &l.mlp.w_down}) {
      double sum_sq = 0;
      for (int64_t r = 0; r < mat->rows; ++r) {
        for (int64_t col = 0; col < mat->cols; ++col) {
          float v = At(*mat, r, col);
          ASSERT_TRUE(std::isfinite(v));
          sum_sq += v * v;
        }
      }
      EXPECT_GT(sum_sq, 0.0);
    }
    for (float v : l.attn_norm) ASSERT_TRUE(std::isfinite(v));
  }
  for (float v : m.final_norm) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(std::fabs(v), 1e-3f);
  }
}

TEST(LoaderTest, TruncatedLlama2cIsAnErrorNamingFileAndSizes) {
  const std::string dir = TestDir();
  std::string raw = ReadBytes(kStories);
  ASSERT_EQ(raw.size(), 1056540u);
  const std::string path = dir + "/short.bin";
  WriteBytes(path, raw.substr(0, raw.size() - 100));
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(path);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr(path));
  EXPECT_THAT(w.status().message(), HasSubstr("1056540"));
  EXPECT_THAT(w.status().message(), HasSubstr("1056440"));

  const std::string long_path = dir + "/long.bin";
  WriteBytes(long_path, raw + "xxxx");
  w = LoadModel(long_path);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("1056544"));

  const std::string tiny_path = dir + "/tiny.bin";
  WriteBytes(tiny_path, raw.substr(0, 10));
  w = LoadModel(tiny_path);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(tiny_path));

  // A header claiming an absurd shape must not overflow into a "valid" size.
  std::string huge = raw;
  int32_t big = 0x7fffffff;
  std::memcpy(huge.data(), &big, 4);       // dim
  std::memcpy(huge.data() + 12, &big, 4);  // n_heads
  std::memcpy(huge.data() + 16, &big, 4);  // n_kv_heads
  const std::string huge_path = dir + "/huge.bin";
  WriteBytes(huge_path, huge);
  w = LoadModel(huge_path);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(huge_path));

  EXPECT_EQ(LoadModel(dir + "/nope.bin").status().code(), absl::StatusCode::kNotFound);
}

TEST(LoaderTest, UntiedLlama2cReadsClassifier) {
  // Flip vocab_size negative and append a classifier of known values.
  std::string raw = ReadBytes(kStories);
  int32_t neg = -512;
  std::memcpy(raw.data() + 20, &neg, 4);
  std::vector<float> wcls(512 * 64);
  for (size_t i = 0; i < wcls.size(); ++i) wcls[i] = 0.001f * static_cast<float>(i % 997);
  raw.append(reinterpret_cast<const char*>(wcls.data()), wcls.size() * 4);
  const std::string path = TestDir() + "/untied.bin";
  WriteBytes(path, raw);
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE((*w)->config.tie_embeddings);
  EXPECT_EQ((*w)->config.vocab, 512);
  EXPECT_NE((*w)->lm_head.data, (*w)->embed.data);
  EXPECT_EQ(At((*w)->lm_head, 3, 5), wcls[3 * 64 + 5]);
}

// ---------------------------------------------------------------------------
// Synthetic Hugging Face directories

// Crosses 128-element block boundaries in both directions, with partial blocks.
SyntheticModelOptions SmallOptions(const std::string& dir, DType dtype) {
  SyntheticModelOptions o;
  o.out_dir = dir;
  o.hidden = 160;
  o.heads = 5;
  o.kv_heads = 1;
  o.intermediate = 300;
  o.layers = 2;
  o.vocab = 260;
  o.max_position = 256;
  o.dtype = dtype;
  o.seed = 42;
  return o;
}

std::vector<std::pair<std::string, const Matrix*>> Matrices(const ModelWeights& m) {
  std::vector<std::pair<std::string, const Matrix*>> out = {{"embed", &m.embed},
                                                            {"lm_head", &m.lm_head}};
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    std::string p = "layer" + std::to_string(i) + ".";
    out.insert(out.end(), {{p + "wq", &l.attn.wq},
                           {p + "wk", &l.attn.wk},
                           {p + "wv", &l.attn.wv},
                           {p + "wo", &l.attn.wo},
                           {p + "gate", &l.mlp.w_gate},
                           {p + "up", &l.mlp.w_up},
                           {p + "down", &l.mlp.w_down}});
  }
  return out;
}

// Largest |x - ref| / tol(ref) over all elements; <= 1 means within tolerance.
double WorstError(const Matrix& x, const Matrix& ref, double rel, double abs_per_scale) {
  EXPECT_EQ(x.rows, ref.rows);
  EXPECT_EQ(x.cols, ref.cols);
  double worst = 0;
  for (int64_t r = 0; r < ref.rows; ++r) {
    for (int64_t c = 0; c < ref.cols; ++c) {
      double want = At(ref, r, c);
      double got = At(x, r, c);
      double tol = std::fabs(want) * rel + x.ScaleAt(r, c) * abs_per_scale + 1e-7;
      worst = std::max(worst, std::fabs(got - want) / tol);
    }
  }
  return worst;
}

TEST(LoaderTest, SyntheticRoundTripsForEachDtype) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteSyntheticModel(SmallOptions(dir + "/f32", DType::kF32)).ok());
  absl::StatusOr<std::unique_ptr<ModelWeights>> ref = LoadModel(dir + "/f32");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const ModelConfig& rc = (*ref)->config;
  EXPECT_EQ(rc.hidden, 160);
  EXPECT_EQ(rc.head_dim, 32);
  EXPECT_EQ(rc.kv_heads, 1);
  EXPECT_EQ(rc.rope_layout, RopeLayout::kHalf);
  EXPECT_EQ(rc.weight_dtype, DType::kF32);
  EXPECT_FALSE(rc.tie_embeddings);
  EXPECT_EQ((*ref)->layers[1].attn.wk.rows, 32);
  EXPECT_EQ((*ref)->layers[1].mlp.w_down.cols, 300);

  // Weights look like what a forward pass expects: unit-ish embedding, linear
  // layers scaled by 1/sqrt(fan_in), norms near 1.
  double sum_sq = 0;
  const Matrix& down = (*ref)->layers[0].mlp.w_down;
  for (int64_t r = 0; r < down.rows; ++r) {
    for (int64_t c = 0; c < down.cols; ++c) sum_sq += std::pow(At(down, r, c), 2);
  }
  EXPECT_NEAR(std::sqrt(sum_sq / (down.rows * down.cols)) * std::sqrt(300.0), 1.0, 0.05);
  for (float v : (*ref)->layers[0].attn_norm) EXPECT_NEAR(v, 1.0f, 0.4f);

  struct Case {
    DType dtype;
    double rel;            // relative rounding of the format
    double abs_per_scale;  // absolute floor (FP8 subnormals), times the block scale
  };
  for (const Case& k : {Case{DType::kBF16, 1.0 / 256, 0}, Case{DType::kF16, 1.0 / 2048, 1e-7},
                        Case{DType::kFP8E4M3, 1.0 / 16, 1.0 / 1024}}) {
    SCOPED_TRACE(std::string(DTypeName(k.dtype)));
    const std::string sub = dir + "/" + std::string(DTypeName(k.dtype));
    ASSERT_TRUE(WriteSyntheticModel(SmallOptions(sub, k.dtype)).ok());
    absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(sub);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config.weight_dtype, k.dtype);
    auto got = Matrices(**w);
    auto want = Matrices(**ref);
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(got[i].first);
      const Matrix& m = *got[i].second;
      EXPECT_EQ(m.row_stride_bytes, m.cols * static_cast<int64_t>(DTypeSize(m.dtype)));
      if (k.dtype == DType::kFP8E4M3 && got[i].first == "embed") {
        EXPECT_EQ(m.dtype, DType::kBF16);  // DeepSeek keeps the embedding in BF16
        EXPECT_LE(WorstError(m, *want[i].second, 1.0 / 256, 0), 1.0);
        continue;
      }
      EXPECT_EQ(m.dtype, k.dtype);
      if (k.dtype == DType::kFP8E4M3) {
        ASSERT_NE(m.scale, nullptr);
        EXPECT_EQ(m.scale_cols, (m.cols + 127) / 128);
      }
      EXPECT_LE(WorstError(m, *want[i].second, k.rel, k.abs_per_scale), 1.0);
    }
    EXPECT_EQ((*w)->layers[1].ffn_norm, (*ref)->layers[1].ffn_norm);
    EXPECT_EQ((*w)->final_norm, (*ref)->final_norm);
  }
}

TEST(LoaderTest, FP8ConfigAndTiedEmbeddings) {
  const std::string dir = TestDir();
  SyntheticModelOptions o = SmallOptions(dir, DType::kFP8E4M3);
  o.tie_embeddings = true;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  nlohmann::json cfg = nlohmann::json::parse(ReadBytes(dir + "/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(cfg["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("lm_head.weight"), nullptr);
  const SafetensorsTensor* s = f->Find("model.layers.0.mlp.down_proj.weight_scale_inv");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->shape, (std::vector<int64_t>{2, 3}));  // [160, 300] in 128x128 blocks
  EXPECT_EQ(s->dtype, DType::kF32);

  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->config.tie_embeddings);
  EXPECT_EQ((*w)->lm_head.data, (*w)->embed.data);
}

TEST(LoaderTest, SameSeedSameWeightsDifferentSeedDifferent) {
  const std::string dir = TestDir();
  SyntheticModelOptions o = SmallOptions(dir + "/a", DType::kBF16);
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = dir + "/b";
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = dir + "/c";
  o.seed = 43;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  EXPECT_EQ(ReadBytes(dir + "/a/model.safetensors"), ReadBytes(dir + "/b/model.safetensors"));
  EXPECT_NE(ReadBytes(dir + "/a/model.safetensors"), ReadBytes(dir + "/c/model.safetensors"));
}

TEST(LoaderTest, ShardedModelWithIndexLoads) {
  const std::string dir = TestDir();
  SyntheticModelOptions o = SmallOptions(dir + "/one", DType::kFP8E4M3);
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = dir + "/three";
  o.shards = 3;
  std::vector<double> fractions;
  ASSERT_TRUE(WriteSyntheticModel(o, [&](double f) { fractions.push_back(f); }).ok());
  ASSERT_FALSE(fractions.empty());
  EXPECT_TRUE(std::is_sorted(fractions.begin(), fractions.end()));
  EXPECT_DOUBLE_EQ(fractions.back(), 1.0);
  EXPECT_TRUE(fs::exists(dir + "/three/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir + "/three/model-00003-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/three/model.safetensors"));

  absl::StatusOr<std::unique_ptr<ModelWeights>> one = LoadModel(dir + "/one");
  absl::StatusOr<std::unique_ptr<ModelWeights>> three = LoadModel(dir + "/three");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ((*three)->files.size(), 3u);
  auto a = Matrices(**one);
  auto b = Matrices(**three);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_EQ(WorstError(*b[i].second, *a[i].second, 0, 0), 0.0);
  }
}

TEST(LoaderTest, MissingTensorIsAnErrorNamingIt) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteSyntheticModel(SmallOptions(dir, DType::kF32)).ok());
  const std::string path = dir + "/model.safetensors";
  const std::string dropped = "model.layers.1.mlp.up_proj.weight";
  {
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<SafetensorsTensorData> keep;
    for (const SafetensorsTensor& t : f->tensors()) {
      if (t.name == dropped) continue;
      keep.push_back({t.name, t.dtype, t.shape, absl::MakeConstSpan(t.data, t.size_bytes)});
    }
    ASSERT_TRUE(WriteSafetensors(path, keep).ok());  // replaces the file; our mapping stays
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr(dropped));
}

TEST(LoaderTest, ShapeMismatchNamesTensorShapesAndFile) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteSyntheticModel(SmallOptions(dir, DType::kBF16)).ok());
  nlohmann::json cfg = nlohmann::json::parse(ReadBytes(dir + "/config.json"));
  cfg["intermediate_size"] = 301;
  WriteBytes(dir + "/config.json", cfg.dump());
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("[300, 160]"));
  EXPECT_THAT(w.status().message(), HasSubstr("[301, 160]"));
  EXPECT_THAT(w.status().message(), HasSubstr(dir + "/model.safetensors"));
}

TEST(LoaderTest, MissingWeightsOrConfig) {
  const std::string dir = TestDir();
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("config.json"));
  ASSERT_TRUE(WriteSyntheticModel(SmallOptions(dir, DType::kF32)).ok());
  fs::remove(dir + "/model.safetensors");
  w = LoadModel(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("model.safetensors"));
}

// ---------------------------------------------------------------------------
// config.json

nlohmann::json BaseConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": [7, 8]})");
}

TEST(HfConfigTest, ParsesLlamaStyleConfig) {
  nlohmann::json j = BaseConfig();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"activation_scheme", "dynamic"},
                              {"weight_block_size", {128, 128}}};
  absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "/m/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& c = hf->config;
  EXPECT_EQ(c.hidden, 256);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_FALSE(c.head_dim_explicit);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.eos_id, 7);  // first of the list
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.rope_layout, RopeLayout::kHalf);
  EXPECT_TRUE(hf->fp8_block_scaled);

  // Defaults: kv heads = heads; explicit head_dim may differ from hidden/heads.
  j = BaseConfig();
  j.erase("num_key_value_heads");
  j["head_dim"] = 64;
  j["model_type"] = "qwen2";
  j["attention_bias"] = false;
  hf = ParseHfConfig(j.dump(), "/m/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->config.kv_heads, 8);
  EXPECT_EQ(hf->config.head_dim, 64);
  EXPECT_TRUE(hf->config.head_dim_explicit);
  EXPECT_TRUE(ValidateConfig(hf->config).ok());
}

struct ConfigCase {
  const char* name;
  std::function<void(nlohmann::json&)> mutate;
  const char* field;
};

TEST(HfConfigTest, UnsupportedOrInvalidConfigsNameFileAndField) {
  const std::vector<ConfigCase> cases = {
      {"mixtral", [](auto& j) { j["model_type"] = "mixtral"; }, "model_type"},
      {"moe_local", [](auto& j) { j["num_local_experts"] = 8; }, "num_local_experts"},
      {"moe_routed", [](auto& j) { j["n_routed_experts"] = 64; }, "n_routed_experts"},
      {"gelu", [](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"kv_not_dividing", [](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
      {"attention_bias", [](auto& j) { j["attention_bias"] = true; }, "attention_bias"},
      {"qwen2_default_bias", [](auto& j) { j["model_type"] = "qwen2"; }, "attention_bias"},
      {"yarn",
       [](auto& j) {
         j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
       },
       "rope_scaling"},
      {"fp8_block_64",
       [](auto& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
       },
       "weight_block_size"},
      {"gptq",
       [](auto& j) {
         j["quantization_config"] = {{"quant_method", "gptq"}};
       },
       "quant_method"},
      {"zero_layers", [](auto& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers"},
      {"no_vocab", [](auto& j) { j.erase("vocab_size"); }, "vocab_size"},
      {"string_hidden", [](auto& j) { j["hidden_size"] = "256"; }, "hidden_size"},
      {"odd_head_dim", [](auto& j) { j["head_dim"] = 31; }, "head_dim"},
      {"hidden_not_heads_multiple", [](auto& j) { j["hidden_size"] = 250; }, "hidden_size"},
      {"eos_outside_vocab", [](auto& j) { j["eos_token_id"] = 5000; }, "eos_token_id"},
      {"mistral_window",
       [](auto& j) {
         j["model_type"] = "mistral";
         j["sliding_window"] = 1024;
       },
       "sliding_window"},
  };
  for (const ConfigCase& c : cases) {
    SCOPED_TRACE(c.name);
    nlohmann::json j = BaseConfig();
    c.mutate(j);
    absl::StatusOr<HfConfig> hf = ParseHfConfig(j.dump(), "/models/x/config.json");
    ASSERT_FALSE(hf.ok());
    EXPECT_TRUE(hf.status().code() == absl::StatusCode::kInvalidArgument ||
                hf.status().code() == absl::StatusCode::kUnimplemented)
        << hf.status();
    EXPECT_THAT(hf.status().message(), HasSubstr("/models/x/config.json"));
    EXPECT_THAT(hf.status().message(), HasSubstr(c.field));
  }
  absl::StatusOr<HfConfig> hf = ParseHfConfig("{\"model_type\": ", "/models/x/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hf.status().message(), HasSubstr("/models/x/config.json"));
}

TEST(HfConfigTest, LoadModelRefusesUnsupportedConfig) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteSyntheticModel(SmallOptions(dir, DType::kF32)).ok());
  nlohmann::json cfg = nlohmann::json::parse(ReadBytes(dir + "/config.json"));
  cfg["model_type"] = "mixtral";
  WriteBytes(dir + "/config.json", cfg.dump());
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(w.status().message(), HasSubstr(dir + "/config.json"));
  EXPECT_THAT(w.status().message(), HasSubstr("model_type"));
}

TEST(ValidateConfigTest, NamesTheField) {
  ModelConfig c;
  c.hidden = 64;
  c.intermediate = 128;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 4;
  c.head_dim = 8;
  c.vocab = 100;
  c.max_position = 64;
  ASSERT_TRUE(ValidateConfig(c).ok());
  auto expect_field = [](ModelConfig bad, const char* field) {
    absl::Status s = ValidateConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  ModelConfig bad = c;
  bad.kv_heads = 3;
  expect_field(bad, "kv_heads");
  bad = c;
  bad.vocab = 0;
  expect_field(bad, "vocab");
  bad = c;
  bad.head_dim = 16;
  expect_field(bad, "hidden");
  bad.head_dim_explicit = true;
  EXPECT_TRUE(ValidateConfig(bad).ok());
  bad = c;
  bad.rms_eps = 0;
  expect_field(bad, "rms_eps");
  bad = c;
  bad.eos_id = 100;
  expect_field(bad, "eos_id");
}

TEST(SyntheticTest, RejectsBadOptionsAndPresets) {
  SyntheticModelOptions o;
  o.out_dir = TestDir();
  o.kv_heads = 3;
  absl::Status s = WriteSyntheticModel(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kv_heads"));
  o.kv_heads = 4;
  o.shards = 0;
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("shards"));
  EXPECT_FALSE(SyntheticPreset("7b").ok());
  absl::StatusOr<SyntheticModelOptions> p = SyntheticPreset("1b1");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->hidden, 2048);
  EXPECT_EQ(p->dtype, DType::kFP8E4M3);
}

// The MTP layer sits at index num_hidden_layers, shaped as DeepSeek-V3 and
// GLM-5 publish it, and leaves the main model's tensors and loading alone.
TEST(SyntheticTest, MtpLayerFollowsThePublishedLayout) {
  const std::string dir = TestDir();
  struct Case {
    const char* preset;
    DType dtype;
  };
  for (const Case& k : {Case{"deepseek-tiny", DType::kFP8E4M3}, Case{"glm5-tiny", DType::kBF16}}) {
    SCOPED_TRACE(k.preset);
    absl::StatusOr<SyntheticModelOptions> o = SyntheticPreset(k.preset);
    ASSERT_TRUE(o.ok());
    o->dtype = k.dtype;
    o->out_dir = dir + "/" + k.preset + "-plain";
    ASSERT_TRUE(WriteSyntheticModel(*o).ok());
    o->out_dir = dir + "/" + k.preset + "-mtp";
    o->mtp_layers = 1;
    ASSERT_TRUE(WriteSyntheticModel(*o).ok());
    const int L = o->layers;
    const std::string p = "model.layers." + std::to_string(L) + ".";

    nlohmann::json plain_cfg =
        nlohmann::json::parse(ReadBytes(dir + "/" + k.preset + "-plain/config.json"));
    EXPECT_FALSE(plain_cfg.contains("num_nextn_predict_layers"));
    nlohmann::json cfg = nlohmann::json::parse(ReadBytes(o->out_dir + "/config.json"));
    EXPECT_EQ(cfg["num_nextn_predict_layers"], 1);
    EXPECT_EQ(cfg["num_hidden_layers"], L);

    absl::StatusOr<SafetensorsFile> plain =
        SafetensorsFile::Open(dir + "/" + k.preset + "-plain/model.safetensors");
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(o->out_dir + "/model.safetensors");
    ASSERT_TRUE(plain.ok() && f.ok());
    for (const SafetensorsTensor& t : plain->tensors()) {
      EXPECT_EQ(t.name.rfind(p, 0), std::string::npos) << t.name;
      const SafetensorsTensor* same = f->Find(t.name);
      ASSERT_NE(same, nullptr) << t.name;
      ASSERT_EQ(same->size_bytes, t.size_bytes) << t.name;
      EXPECT_EQ(std::memcmp(same->data, t.data, t.size_bytes), 0) << t.name;
    }
    auto expect = [&](const std::string& name, std::vector<int64_t> shape, DType dtype) {
      const SafetensorsTensor* t = f->Find(p + name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, shape) << name;
      EXPECT_EQ(t->dtype, dtype) << name;
    };
    const int64_t H = o->hidden;
    expect("enorm.weight", {H}, DType::kF32);
    expect("hnorm.weight", {H}, DType::kF32);
    expect("eh_proj.weight", {H, 2 * H}, k.dtype);
    expect("shared_head.norm.weight", {H}, DType::kF32);
    expect("shared_head.head.weight", {o->vocab, H}, k.dtype);
    expect("input_layernorm.weight", {H}, DType::kF32);
    expect("self_attn.kv_b_proj.weight",
           {int64_t{o->heads} * (o->qk_nope_head_dim + o->v_head_dim), o->kv_lora_rank}, k.dtype);
    // Past first_k_dense (and past GLM's mlp_layer_types list): MoE.
    expect("mlp.gate.weight", {o->n_routed_experts, H}, DType::kF32);
    EXPECT_EQ(f->Find(p + "mlp.gate_proj.weight"), nullptr);
    EXPECT_EQ(f->Find(p + "embed_tokens.weight"), nullptr);
    if (k.dtype == DType::kFP8E4M3) expect("eh_proj.weight_scale_inv", {1, 1}, DType::kF32);
    if (o->family == "glm_moe_dsa") {
      expect("self_attn.indexer.wk.weight", {o->index_head_dim, H}, k.dtype);
    } else {
      EXPECT_EQ(f->Find(p + "self_attn.indexer.wk.weight"), nullptr);
    }

    absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(o->out_dir);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config.layers, L);
  }
}

TEST(SyntheticTest, MtpLayersRejectedOutsideTheDeepseekFamily) {
  absl::StatusOr<SyntheticModelOptions> o = SyntheticPreset("deepseek-tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = TestDir();
  o->mtp_layers = 2;
  absl::Status s = WriteSyntheticModel(*o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("mtp_layers"));
  o = SyntheticPreset("tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = TestDir();
  o->mtp_layers = 1;
  s = WriteSyntheticModel(*o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("mtp_layers"));
}

}  // namespace
}  // namespace ringlane::worker
