// ringlane-synth-model: writes a synthetic Llama-shaped checkpoint (Hugging
// Face layout: config.json + safetensors) of any size, for tests and
// benchmarks. Shape and dtype flags override the preset's values when set.
//
//   ringlane-synth-model --preset=1b1 --out=/tmp/synth-1b1-fp8
//   ringlane-synth-model --out=/tmp/tiny-bf16 --dtype=bf16 --layers=4 --shards=2
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "services/flags_util.h"
#include "services/progress.h"
#include "worker/dtype.h"
#include "worker/model/synthetic.h"

ABSL_FLAG(std::string, out, "", "output directory (required)");
ABSL_FLAG(std::string, preset, "tiny",
          "base shape: tiny (hidden 64, 2 layers, f32) or 1b1 (TinyLlama 1.1B shape, fp8)");
ABSL_FLAG(int, hidden, -1, "model dimension (hidden_size); -1 = the preset's");
ABSL_FLAG(int, intermediate, -1, "MLP dimension (intermediate_size); -1 = the preset's");
ABSL_FLAG(int, layers, -1, "number of layers; -1 = the preset's");
ABSL_FLAG(int, heads, -1, "query heads; -1 = the preset's");
ABSL_FLAG(int, kv_heads, -1, "key/value heads, must divide --heads; -1 = the preset's");
ABSL_FLAG(int, head_dim, -1, "head dimension; 0 = hidden / heads; -1 = the preset's");
ABSL_FLAG(int, vocab, -1, "vocabulary size; -1 = the preset's");
ABSL_FLAG(int, max_position, -1, "max_position_embeddings; -1 = the preset's");
ABSL_FLAG(double, rope_theta, 10000.0, "RoPE base");
ABSL_FLAG(std::string, dtype, "",
          "weight dtype: f32, bf16, f16 or fp8 (E4M3, 128x128 blocks); empty = the preset's");
ABSL_FLAG(uint64_t, seed, 1, "weights are a function of the seed alone, whatever the dtype");
ABSL_FLAG(int, shards, 1, "number of safetensors files (> 1 adds model.safetensors.index.json)");
ABSL_FLAG(bool, tie_embeddings, false, "share the embedding with the output layer");
ABSL_FLAG(std::string, family, "",
          "model_type: llama, deepseek_v3, deepseek_v32 or glm_moe_dsa; empty = the preset's");
ABSL_FLAG(int, q_lora_rank, -1,
          "DeepSeek family: query latent rank, 0 = q_proj without one; -1 = the preset's");
ABSL_FLAG(int, experts, -1, "DeepSeek family: routed experts, 0 = all dense; -1 = the preset's");
ABSL_FLAG(int, index_topk, -1, "DSA models: positions the indexer picks; -1 = the preset's");
ABSL_FLAG(std::string, indexer_types, "",
          "DSA models: F (full) or S (shared, GLM-5.2) per layer; empty = every layer full");
ABSL_FLAG(double, yarn_factor, 0.0,
          "DeepSeek family: YaRN RoPE scaling factor (> 1), over max_position / factor");
ABSL_FLAG(int, silent_from, 0,
          "Llama family, > 0: layers from this index on write zero o_proj and down_proj (they "
          "add nothing), so --draft_layers=N with N = this value drafts exactly; for "
          "benchmarks of speculative decoding with a perfect drafter");
ABSL_FLAG(bool, copier, false,
          "Llama family: a model that copies (a hand-built induction circuit in layers 0 and 1, "
          "the rest silent): its greedy continuation of a passage's repeated start repeats the "
          "passage; for the copy/rewrite workload of speculative decoding. Raises --rope_theta "
          "from its default to 1e16; e.g. --preset=1b1 --vocab=512 --copier");
ABSL_FLAG(int, mtp_layers, 0,
          "DeepSeek family: 1 adds a multi-token-prediction layer at index --layers "
          "(num_nextn_predict_layers); 0 = none");

ABSL_FLAG(std::string, layer_types, "",
          "glm5_next: one L (linear attention, KDA) or F (MLA) per layer; empty = the preset's");
ABSL_FLAG(int, linear_heads, -1, "glm5_next: KDA heads; -1 = the preset's");
ABSL_FLAG(int, linear_head_dim, -1, "glm5_next: KDA head size; -1 = the preset's");
ABSL_FLAG(int, linear_conv_kernel, -1, "glm5_next: KDA convolution taps; -1 = the preset's");
ABSL_FLAG(double, linear_lower_bound, 0.0,
          "glm5_next: < 0 writes linear_lower_bound (the bounded sigmoid gate); 0 = the softplus "
          "gate");

ABSL_FLAG(int, index_kpool, 1,
          "glm5_next: > 1 writes the pooled indexer (index_kpool and its compress gate and ape "
          "tensors); it must divide the indexer's topk");
ABSL_FLAG(int, hc_mult, 1,
          "glm5_next: > 1 writes manifold-constrained hyper-connections of that many residual "
          "streams (hc_mult and the hc_* tensors)");
ABSL_FLAG(int, hc_sinkhorn_iters, 20, "glm5_next with --hc_mult > 1: hc_sinkhorn_iters");
ABSL_FLAG(bool, hc_head, false,
          "glm5_next with --hc_mult > 1: also write DeepSeek-V4's model.hc_head_* (learned head "
          "weights); without, the head takes the streams' mean, as GLM-5.3-Flash's does");
ABSL_FLAG(double, swiglu_limit, 0.0,
          "glm5_next: > 0 writes swiglu_limit (the MoE experts' clamped SwiGLU); 0 = none");

namespace {

namespace rw = ringlane::worker;
using ringlane::services::ExitWithUsageError;

void RequirePositive(const char* name, int v) {
  if (v <= 0) ExitWithUsageError(absl::StrCat("--", name, " must be positive, got ", v));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a synthetic Llama- or DeepSeek-shaped model directory.\n"
      "  ringlane-synth-model --preset=1b1 --out=/tmp/synth-1b1-fp8");
  absl::ParseCommandLine(argc, argv);

  absl::StatusOr<rw::SyntheticModelOptions> preset =
      rw::SyntheticPreset(absl::GetFlag(FLAGS_preset));
  if (!preset.ok()) ExitWithUsageError(absl::StrCat("--preset: ", preset.status().message()));
  rw::SyntheticModelOptions o = *preset;

  o.out_dir = absl::GetFlag(FLAGS_out);
  if (o.out_dir.empty()) ExitWithUsageError("--out is required");
  // Shape flags default to -1, "keep the preset's value".
  auto take_int = [](const absl::Flag<int>& flag, const char* name, int* field) {
    int v = absl::GetFlag(flag);
    if (v == -1) return;
    RequirePositive(name, v);
    *field = v;
  };
  take_int(FLAGS_hidden, "hidden", &o.hidden);
  take_int(FLAGS_intermediate, "intermediate", &o.intermediate);
  take_int(FLAGS_layers, "layers", &o.layers);
  take_int(FLAGS_heads, "heads", &o.heads);
  take_int(FLAGS_kv_heads, "kv_heads", &o.kv_heads);
  take_int(FLAGS_vocab, "vocab", &o.vocab);
  take_int(FLAGS_max_position, "max_position", &o.max_position);
  o.shards = absl::GetFlag(FLAGS_shards);
  RequirePositive("shards", o.shards);
  if (absl::GetFlag(FLAGS_head_dim) != -1) {
    o.head_dim = absl::GetFlag(FLAGS_head_dim);
    if (o.head_dim < 0 || o.head_dim % 2 != 0) {
      ExitWithUsageError(
          absl::StrCat("--head_dim must be 0 or a positive even number, got ", o.head_dim));
    }
  }
  o.copier = absl::GetFlag(FLAGS_copier);
  // The copier matches content on slow rotary pairs, which 10000 lacks.
  const double theta = o.copier && absl::GetFlag(FLAGS_rope_theta) == 10000.0
                           ? 1e16
                           : absl::GetFlag(FLAGS_rope_theta);
  if (!(theta > 0 && theta < 1e30)) ExitWithUsageError("--rope_theta must be positive");
  o.rope_theta = static_cast<float>(theta);
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    absl::StatusOr<rw::DType> d = rw::ParseDTypeFlag(absl::GetFlag(FLAGS_dtype));
    if (!d.ok()) ExitWithUsageError(absl::StrCat("--dtype: ", d.status().message()));
    o.dtype = *d;
  }
  o.seed = absl::GetFlag(FLAGS_seed);
  o.tie_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  if (!absl::GetFlag(FLAGS_family).empty()) o.family = absl::GetFlag(FLAGS_family);
  // Zero is meaningful for these two, so only -1 keeps the preset's.
  for (auto [flag, field] : {std::pair{&FLAGS_q_lora_rank, &o.q_lora_rank},
                             std::pair{&FLAGS_experts, &o.n_routed_experts}}) {
    const int v = absl::GetFlag(*flag);
    if (v < -1) ExitWithUsageError(absl::StrCat("--q_lora_rank and --experts take -1 or more"));
    if (v >= 0) *field = v;
  }
  o.yarn_factor = static_cast<float>(absl::GetFlag(FLAGS_yarn_factor));
  take_int(FLAGS_index_topk, "index_topk", &o.index_topk);
  o.indexer_types = absl::GetFlag(FLAGS_indexer_types);
  if (!absl::GetFlag(FLAGS_layer_types).empty()) o.layer_types = absl::GetFlag(FLAGS_layer_types);
  take_int(FLAGS_linear_heads, "linear_heads", &o.linear_heads);
  take_int(FLAGS_linear_head_dim, "linear_head_dim", &o.linear_head_dim);
  take_int(FLAGS_linear_conv_kernel, "linear_conv_kernel", &o.linear_conv_kernel);
  o.linear_lower_bound = static_cast<float>(absl::GetFlag(FLAGS_linear_lower_bound));
  if (!(o.linear_lower_bound <= 0.0f)) ExitWithUsageError("--linear_lower_bound must be <= 0");
  o.index_kpool = absl::GetFlag(FLAGS_index_kpool);
  if (o.index_kpool < 1) ExitWithUsageError("--index_kpool must be at least 1");
  o.hc_mult = absl::GetFlag(FLAGS_hc_mult);
  o.hc_sinkhorn_iters = absl::GetFlag(FLAGS_hc_sinkhorn_iters);
  o.hc_head = absl::GetFlag(FLAGS_hc_head);
  if (o.hc_mult < 1 || o.hc_mult > 16) ExitWithUsageError("--hc_mult must be in [1, 16]");
  if (o.hc_sinkhorn_iters < 1) ExitWithUsageError("--hc_sinkhorn_iters must be at least 1");
  o.swiglu_limit = static_cast<float>(absl::GetFlag(FLAGS_swiglu_limit));
  if (!(o.swiglu_limit >= 0.0f)) ExitWithUsageError("--swiglu_limit must be >= 0");
  o.mtp_layers = absl::GetFlag(FLAGS_mtp_layers);
  o.silent_from = absl::GetFlag(FLAGS_silent_from);
  if (o.silent_from < 0) ExitWithUsageError("--silent_from must be >= 0");
  if (o.kv_heads > o.heads || o.heads % o.kv_heads != 0) {
    ExitWithUsageError(
        absl::StrCat("--kv_heads (", o.kv_heads, ") must divide --heads (", o.heads, ")"));
  }
  if (o.head_dim == 0 && o.hidden % o.heads != 0) {
    ExitWithUsageError(absl::StrCat("--heads (", o.heads, ") must divide --hidden (", o.hidden,
                                    ") unless --head_dim is given"));
  }

  constexpr int64_t kSteps = 1000;
  ringlane::services::ProgressOptions popts;
  popts.unit = ringlane::services::ProgressUnit::kCount;
  ringlane::services::ProgressBar bar(
      absl::StrCat("writing ", o.out_dir, " (", std::string(rw::DTypeName(o.dtype)), ")"), kSteps,
      popts);
  absl::Status s = rw::WriteSyntheticModel(
      o, [&](double fraction) { bar.Update(static_cast<int64_t>(fraction * kSteps)); });
  if (!s.ok()) {
    std::fprintf(stderr, "\nringlane-synth-model: error: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  bar.Finish();
  std::printf("%s\n", o.out_dir.c_str());
  return 0;
}
