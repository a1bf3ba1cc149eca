// The copier (SyntheticModelOptions::copier) run by the real backend: its
// greedy continuation of a passage's repeated start repeats the passage, in
// F32 and in FP8, and an ordinary model of the same shape does not. The
// speculative-decoding benchmarks rely on this to measure a copy/rewrite
// workload on a memory-bound model.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/factory.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/model/synthetic.h"
#include "worker/round.h"

namespace ringlane::worker {
namespace {

using ::testing::HasSubstr;

constexpr int kBlock = 16;

SyntheticModelOptions SmallCopier(const std::string& name) {
  SyntheticModelOptions o;
  o.out_dir = absl::StrCat(::testing::TempDir(), "/synthetic_copier_test_", ::getpid(), "_", name);
  std::filesystem::remove_all(o.out_dir);
  o.hidden = 1024;
  o.intermediate = 64;
  o.layers = 3;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.vocab = 256;
  o.max_position = 512;
  o.rope_theta = 1e16f;
  o.copier = true;
  return o;
}

// Greedy tokens after `prompt`, one decode step at a time.
std::vector<int32_t> Greedy(const SyntheticModelOptions& o, const std::vector<int32_t>& prompt,
                            int n) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModel(o.out_dir);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return {};
  std::shared_ptr<const ModelWeights> model(std::move(*w));
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(model, BackendOptions{}, nullptr);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return {};
  const int blocks = static_cast<int>((prompt.size() + n) / kBlock + 1);
  EXPECT_TRUE((*b)->AllocateKvPool(KvPoolSpec{blocks, kBlock, DType::kF32}).ok());
  std::vector<int32_t> block_ids(blocks);
  for (int i = 0; i < blocks; ++i) block_ids[i] = i;
  std::vector<int32_t> out;
  SeqStep step{.start_position = 0, .tokens = prompt, .block_ids = block_ids};
  for (int i = 0; i < n; ++i) {
    step.logit_offsets = {static_cast<int32_t>(step.tokens.size()) - 1};
    RoundInput in;
    in.seqs.push_back(step);
    absl::StatusOr<RoundOutput> r = (*b)->Step(in);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    const std::vector<float>& logits = r->logits[0];
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    step.start_position += static_cast<int64_t>(step.tokens.size());
    step.tokens = {next};
  }
  return out;
}

// BOS, a passage of `length` tokens of a `words`-token vocabulary, a
// newline, and the passage's first `repeat` tokens again.
std::vector<int32_t> CopyPrompt(int length, int words, int repeat, uint32_t seed,
                                std::vector<int32_t>* passage) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> word(3, 3 + words - 1);
  passage->clear();
  for (int i = 0; i < length; ++i) passage->push_back(word(gen));
  std::vector<int32_t> prompt{1};
  prompt.insert(prompt.end(), passage->begin(), passage->end());
  prompt.push_back(13);
  prompt.insert(prompt.end(), passage->begin(), passage->begin() + repeat);
  return prompt;
}

int Copied(const std::vector<int32_t>& passage, int repeat, const std::vector<int32_t>& out) {
  int same = 0;
  for (size_t i = 0; i < out.size(); ++i) same += out[i] == passage[repeat + i];
  return same;
}

TEST(SyntheticCopier, ContinuesARepeatedPassageInF32AndFp8) {
  for (DType dtype : {DType::kF32, DType::kFP8E4M3}) {
    SyntheticModelOptions o = SmallCopier(absl::StrCat("d", static_cast<int>(dtype)));
    o.dtype = dtype;
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    std::vector<int32_t> passage;
    // 150 words of 120: single tokens recur, pairs of them rarely.
    const std::vector<int32_t> prompt = CopyPrompt(150, 120, 40, 7, &passage);
    const std::vector<int32_t> out = Greedy(o, prompt, 100);
    ASSERT_EQ(out.size(), 100u);
    // Two-token matches are unique but for a chance repeat of a pair.
    EXPECT_GE(Copied(passage, 40, out), 97) << "dtype " << static_cast<int>(dtype);
  }
}

TEST(SyntheticCopier, AnOrdinaryModelOfTheShapeDoesNotCopy) {
  SyntheticModelOptions o = SmallCopier("plain");
  o.copier = false;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  std::vector<int32_t> passage;
  const std::vector<int32_t> prompt = CopyPrompt(150, 120, 40, 7, &passage);
  EXPECT_LT(Copied(passage, 40, Greedy(o, prompt, 100)), 20);
}

TEST(SyntheticCopier, RefusesShapesTheCircuitDoesNotFit) {
  struct Case {
    const char* name;
    void (*change)(SyntheticModelOptions*);
  };
  const Case cases[] = {
      {"head_dim", [](SyntheticModelOptions* o) { o->head_dim = 32; }},
      {"one query head per KV head", [](SyntheticModelOptions* o) { o->kv_heads = 4; }},
      {"vocab too wide", [](SyntheticModelOptions* o) { o->vocab = 700; }},
      {"rope_theta", [](SyntheticModelOptions* o) { o->rope_theta = 10000.0f; }},
      {"one layer", [](SyntheticModelOptions* o) { o->layers = 1; }},
      {"tied", [](SyntheticModelOptions* o) { o->tie_embeddings = true; }},
      {"family", [](SyntheticModelOptions* o) { o->family = "deepseek_v3"; }},
  };
  for (const Case& c : cases) {
    SyntheticModelOptions o = SmallCopier("refused");
    c.change(&o);
    absl::Status s = WriteSyntheticModel(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    if (!s.ok()) {
      EXPECT_THAT(s.message(), HasSubstr("copier")) << c.name;
    }
  }
}

}  // namespace
}  // namespace ringlane::worker
