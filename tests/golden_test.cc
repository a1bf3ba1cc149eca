// The bundled stories260K model through the engine must reproduce, token for
// token, the greedy outputs of the llama2.c reference implementation.
#include <fstream>
#include <memory>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/tokenizer/llama2c_tokenizer.h"
#include "tests/support/lane_runner.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"

namespace ringlane {
namespace {

using testing::SourcePath;

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::string greedy_text;
};

std::vector<GoldenCase> LoadGolden() {
  std::ifstream f(SourcePath("deploy/models/stories260K/golden.json"));
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<GoldenCase> cases;
  for (const auto& c : j["cases"]) {
    cases.push_back({c["prompt"], c["prompt_ids"].get<std::vector<int32_t>>(),
                     c["greedy_ids"].get<std::vector<int32_t>>(), c["greedy_text"]});
  }
  return cases;
}

struct Variant {
  const char* name;
  int threads;
  bool scalar;
  bool allow_avx512;
};

class GoldenTest : public ::testing::TestWithParam<Variant> {};

TEST_P(GoldenTest, EveryCaseReproducesTheReferenceTokens) {
  auto tok = router::Llama2cTokenizer::Load(SourcePath("deploy/models/stories260K/tok512.bin"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  worker::CpuBackendOptions opt;
  opt.threads = GetParam().threads;
  opt.force_scalar = GetParam().scalar;
  opt.allow_avx512 = GetParam().allow_avx512;
  auto backend = testing::MakeCpuBackend(SourcePath("deploy/models/stories260K/stories260K.bin"),
                                         {64, 16, worker::DType::kF32}, opt);
  ASSERT_TRUE(backend.ok()) << backend.status();

  std::vector<GoldenCase> cases = LoadGolden();
  ASSERT_EQ(cases.size(), 4u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE("prompt: \"" + c.prompt + "\"");
    std::vector<int32_t> ids = (*tok)->Encode(c.prompt, /*add_bos=*/true);
    ASSERT_EQ(ids, c.prompt_ids);
    testing::LaneSpec lane;
    lane.prompt = ids;
    lane.max_new_tokens = static_cast<int>(c.greedy_ids.size());
    lane.stop_token = 1;  // llama2.c models stop on BOS
    auto res = testing::RunLanes(backend->get(), {lane});
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ((*res)[0].tokens, c.greedy_ids);
    std::vector<int32_t> all = ids;
    all.insert(all.end(), (*res)[0].tokens.begin(), (*res)[0].tokens.end());
    if (!all.empty() && all.back() == 1) all.pop_back();
    auto text = (*tok)->Decode(all);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, c.greedy_text);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GoldenTest,
                         ::testing::Values(Variant{"best_1thread", 1, false, true},
                                           Variant{"best_2threads", 2, false, true},
                                           Variant{"avx2_2threads", 2, false, false},
                                           Variant{"scalar", 1, true, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ringlane
