// The Hugging Face path end to end: the bundled llama2.c model converted the
// way Hugging Face's Llama conversion script does it (Q and K rows permuted
// from interleaved RoPE pairs to rotate-half), written as config.json plus
// safetensors, loaded through the HF loader and run with rotate-half RoPE,
// must reproduce the reference tokens exactly like the original checkpoint.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/lane_runner.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace ringlane {
namespace {

using testing::SourcePath;

std::vector<float> Rows(const worker::Matrix& m) {
  std::vector<float> out(m.rows * m.cols);
  for (int64_t r = 0; r < m.rows; ++r) std::memcpy(&out[r * m.cols], m.Row(r), m.cols * 4);
  return out;
}

// Within each head, interleaved pairs (2i, 2i + 1) move to (i, i + head_dim/2).
std::vector<float> PermuteForRotateHalf(const worker::Matrix& m, int heads) {
  std::vector<float> in = Rows(m), out(in.size());
  const int64_t hd = m.rows / heads, half = hd / 2;
  for (int h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int p = 0; p < 2; ++p) {
        std::memcpy(&out[(h * hd + p * half + i) * m.cols], &in[(h * hd + 2 * i + p) * m.cols],
                    m.cols * 4);
      }
  return out;
}

TEST(HfLayout, ConvertedStoriesReproducesGolden) {
  auto src = worker::LoadModel(SourcePath("deploy/models/stories260K/stories260K.bin"));
  ASSERT_TRUE(src.ok()) << src.status();
  const worker::ModelWeights& w = **src;
  const worker::ModelConfig& c = w.config;
  ASSERT_EQ(c.rope_layout, worker::RopeLayout::kInterleaved);

  std::vector<std::vector<float>> keep;  // owns the bytes the specs point at
  std::vector<worker::SafetensorsTensorData> tensors;
  auto add = [&](const std::string& name, std::vector<float> v, std::vector<int64_t> shape) {
    keep.push_back(std::move(v));
    const auto& b = keep.back();
    tensors.push_back(
        {name, worker::DType::kF32, shape,
         absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4)});
  };
  auto mat = [&](const std::string& name, const worker::Matrix& m, std::vector<float> v) {
    add(name, std::move(v), {m.rows, m.cols});
  };
  keep.reserve(8 * c.layers + 4);
  mat("model.embed_tokens.weight", w.embed, Rows(w.embed));
  for (int l = 0; l < c.layers; ++l) {
    const worker::LayerWeights& L = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", L.attn_norm, {c.hidden});
    add(p + "post_attention_layernorm.weight", L.ffn_norm, {c.hidden});
    mat(p + "self_attn.q_proj.weight", L.attn.wq, PermuteForRotateHalf(L.attn.wq, c.heads));
    mat(p + "self_attn.k_proj.weight", L.attn.wk, PermuteForRotateHalf(L.attn.wk, c.kv_heads));
    mat(p + "self_attn.v_proj.weight", L.attn.wv, Rows(L.attn.wv));
    mat(p + "self_attn.o_proj.weight", L.attn.wo, Rows(L.attn.wo));
    mat(p + "mlp.gate_proj.weight", L.mlp.w_gate, Rows(L.mlp.w_gate));
    mat(p + "mlp.up_proj.weight", L.mlp.w_up, Rows(L.mlp.w_up));
    mat(p + "mlp.down_proj.weight", L.mlp.w_down, Rows(L.mlp.w_down));
  }
  add("model.norm.weight", w.final_norm, {c.hidden});

  const std::string dir = ::testing::TempDir() + "/rl_hf_stories";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(worker::WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  nlohmann::json cfg = {{"model_type", "llama"},
                        {"hidden_size", c.hidden},
                        {"intermediate_size", c.intermediate},
                        {"num_hidden_layers", c.layers},
                        {"num_attention_heads", c.heads},
                        {"num_key_value_heads", c.kv_heads},
                        {"vocab_size", c.vocab},
                        {"max_position_embeddings", c.max_position},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"tie_word_embeddings", true},
                        {"hidden_act", "silu"},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2}};
  std::ofstream(dir + "/config.json") << cfg.dump(1);

  auto hf = worker::LoadModel(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->config.rope_layout, worker::RopeLayout::kHalf);
  auto backend = testing::MakeCpuBackend(dir, {64, 16, worker::DType::kF32});
  ASSERT_TRUE(backend.ok()) << backend.status();

  std::ifstream f(SourcePath("deploy/models/stories260K/golden.json"));
  nlohmann::json golden = nlohmann::json::parse(f);
  for (const auto& gc : golden["cases"]) {
    SCOPED_TRACE(gc["prompt"].get<std::string>());
    testing::LaneSpec lane;
    lane.prompt = gc["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = gc["greedy_ids"].get<std::vector<int32_t>>();
    lane.max_new_tokens = static_cast<int>(want.size());
    lane.stop_token = 1;
    auto res = testing::RunLanes(backend->get(), {lane});
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ((*res)[0].tokens, want);
  }
}

}  // namespace
}  // namespace ringlane
