// Speculative decoding never changes output: on real workers behind a real
// router, every request gives the same token ids, logprobs and top
// alternatives (compared bit for bit) with speculation off, with each
// drafter on (at fixed depth, so that every decode step verifies drafts),
// with the adaptive default, and with five requests at once all
// speculating. Greedy and seeded sampling at temperature 0.8 with top-p and
// penalties; with the router's drafters and with a draft model run by the
// workers (the target itself, and a random model); the golden cases of the
// bundled model and prompts on a
// synthetic FP8 model and GLM-5's family past its DSA window. The router's
// metrics must show that drafts were verified, accepted and (for the random
// drafter) rejected, so the test cannot pass by not speculating.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/lane_runner.h"
#include "tests/support/synthetic_shapes.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using testing::CallOut;
using testing::ChoiceOut;

struct Config {
  const char* name;
  std::vector<std::string> flags;
  bool expect_accepted;
  bool expect_rejected;
  // Rank 0 runs a draft model: the target itself (its greedy continuation,
  // so drafts are often right), or a random model with its vocabulary
  // (nearly always wrong).
  enum class Draft { kNone, kSelf, kRandom, kLayers, kMtp } draft = Draft::kNone;
};

const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {"off", {"--spec_drafters=none"}, false, false},
      {"ngram", {"--spec_drafters=ngram", "--spec_adaptive=false"}, true, false},
      {"suffix", {"--spec_drafters=suffix", "--spec_adaptive=false"}, true, false},
      {"random",
       {"--spec_drafters=random", "--spec_adaptive=false", "--spec_max_drafts=3"},
       false,
       true},
      {"adaptive", {"--spec_drafters=ngram,suffix"}, false, false},
      {"model-self",
       {"--spec_drafters=model", "--spec_adaptive=false"},
       true,
       false,
       Config::Draft::kSelf},
      {"model-random",
       {"--spec_drafters=model", "--spec_adaptive=false", "--spec_max_drafts=3"},
       false,
       true,
       Config::Draft::kRandom},
      {"model-adaptive",
       {"--spec_drafters=model,ngram,suffix"},
       false,
       false,
       Config::Draft::kSelf},
      // The checkpoint's MTP layer (--draft_mtp), on models that have one.
      {"model-mtp",
       {"--spec_drafters=model", "--spec_adaptive=false", "--spec_max_drafts=4"},
       false,
       false,
       Config::Draft::kMtp},
      // The model's own first layer as its drafter (--draft_layers).
      {"model-layers",
       {"--spec_drafters=model", "--spec_adaptive=false", "--spec_max_drafts=4"},
       false,
       true,
       Config::Draft::kLayers},
  };
  return configs;
}

v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens, bool sampled) {
  v1::GenerateRequest r = testing::GreedyRequest(prompt, max_tokens);
  r.set_logprobs(true);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_top_logprobs(3);
  if (sampled) {
    s->set_temperature(0.8f);
    s->set_top_p(0.9f);
    s->set_presence_penalty(0.4f);
    s->set_frequency_penalty(0.3f);
    s->set_seed(1234);
  }
  // Repetition is what drafts feed on; the watchdog would cut it short.
  r.set_loop_watchdog(false);
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSame(const ChoiceOut& want, const ChoiceOut& got, const std::string& what) {
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_TRUE(SameBits(got.logprobs, want.logprobs)) << what << ": logprobs differ";
  EXPECT_EQ(got.top_ids, want.top_ids) << what;
  EXPECT_TRUE(SameBits(got.top_logprobs, want.top_logprobs)) << what << ": top logprobs differ";
  EXPECT_EQ(got.ids.size(), want.ids.size()) << what;
}

struct Model {
  const char* name;
  std::vector<std::string> worker_flags;
  std::vector<v1::GenerateRequest> requests;
  // Golden ids the greedy requests must give (empty: no reference).
  std::vector<std::vector<int32_t>> golden;
  // Whether prompt lookup's drafts are ever right on this model's outputs.
  bool ngram_accepts = true;
  // The model's path, for the worker's --draft_model.
  std::string path;
  // It has an MTP layer (--draft_mtp).
  bool mtp = false;
  int world = 1;
};

// A random model with the vocabulary (512) every model here has, and a
// context no shorter than theirs: the nearly-always-wrong draft model.
const std::string& RandomDraftModel() {
  static const std::string dir = [] {
    worker::SyntheticModelOptions o;
    o.out_dir = ::testing::TempDir() + "/rl_spec_random_draft_" + std::to_string(getpid());
    o.vocab = 512;
    o.max_position = 4096;
    o.seed = 77;
    EXPECT_TRUE(worker::WriteSyntheticModel(o).ok());
    return o.out_dir;
  }();
  return dir;
}

Model Stories() {
  Model m{"stories260K", {}, {}, {}};
  m.path = testing::StoriesModel();
  for (bool sampled : {false, true}) {
    for (const testing::GoldenCase& g : testing::GoldenCases()) {
      m.requests.push_back(Request(g.prompt, static_cast<int>(g.ids.size()), sampled));
      m.golden.push_back(sampled ? std::vector<int32_t>{} : g.ids);
    }
  }
  return m;
}

Model Synthetic() {
  worker::SyntheticModelOptions o =
      testing::Fp8GqaModel(::testing::TempDir() + "/rl_spec_synth_" + std::to_string(getpid()),
                           /*intermediate=*/256, /*vocab=*/512, /*seed=*/5);
  EXPECT_TRUE(worker::WriteSyntheticModel(o).ok());
  Model m{"synthetic-fp8", {"--model=" + o.out_dir}, {}, {}};
  m.path = o.out_dir;
  for (bool sampled : {false, true}) {
    for (int p = 0; p < 3; ++p) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 12 + 9 * p; ++i) prompt.push_back(1 + (i * 37 + p * 101) % 500);
      // Half of it again: something to copy.
      prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + prompt.size() / 2);
      m.requests.push_back(Request(prompt, 120, sampled));
      m.golden.emplace_back();
    }
  }
  return m;
}

// GLM-5's family: latent attention, MoE, and the DSA indexer past a dense
// window of 24 tokens, which every request crosses while drafts are
// verified (a TP2 group, FP8 latent cache).
Model DeepseekDsa() {
  auto o = worker::SyntheticPreset("glm5-tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = ::testing::TempDir() + "/rl_spec_dsa_" + std::to_string(getpid());
  o->index_topk = 8;
  o->mtp_layers = 1;
  EXPECT_TRUE(worker::WriteSyntheticModel(*o).ok());
  // Its random weights never continue a prompt's copied half the way
  // prompt lookup guesses (64 drafts, none right), so ngram shows only
  // rejections here; suffix, adaptive and random show acceptance and
  // rejection, and every configuration's output is compared bit for bit.
  Model m{"glm_moe_dsa",
          {"--model=" + o->out_dir, "--dsa_dense_window=24", "--kv_dtype=fp8"},
          {},
          {},
          /*ngram_accepts=*/false,
          o->out_dir,
          /*mtp=*/true,
          /*world=*/2};
  for (bool sampled : {false, true}) {
    for (int p = 0; p < 3; ++p) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 10 + 7 * p; ++i) prompt.push_back(1 + (i * 41 + p * 97) % 500);
      prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + prompt.size() / 2);
      m.requests.push_back(Request(prompt, 160, sampled));
      m.golden.emplace_back();
    }
  }
  return m;
}

std::vector<ChoiceOut> RunAll(testing::Cluster& c, const std::vector<v1::GenerateRequest>& reqs,
                              bool concurrent) {
  std::vector<ChoiceOut> out(reqs.size());
  auto one = [&](size_t i) {
    CallOut o = testing::Call(*c.stub, reqs[i]);
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    out[i] = o.choices[0];
  };
  if (!concurrent) {
    for (size_t i = 0; i < reqs.size(); ++i) one(i);
    return out;
  }
  // Five at a time, all speculating in the same rounds.
  for (size_t start = 0; start < reqs.size(); start += 5) {
    std::vector<std::thread> threads;
    for (size_t i = start; i < std::min(reqs.size(), start + 5); ++i) threads.emplace_back(one, i);
    for (auto& t : threads) t.join();
  }
  return out;
}

class SpeculativeE2eTest : public ::testing::TestWithParam<Model (*)()> {};

TEST_P(SpeculativeE2eTest, SameTokensAndLogprobsWithEveryDrafterSoloAndConcurrent) {
  const Model m = GetParam()();
  std::vector<ChoiceOut> reference;
  for (const Config& cfg : Configs()) {
    if (cfg.draft == Config::Draft::kMtp && !m.mtp) continue;
    SCOPED_TRACE(absl::StrCat(m.name, ", speculation ", cfg.name));
    testing::ClusterOptions co;
    co.world = m.world;
    co.worker_flags = m.worker_flags;
    if (cfg.draft == Config::Draft::kSelf) co.worker_flags.push_back("--draft_model=" + m.path);
    if (cfg.draft == Config::Draft::kLayers) co.worker_flags.push_back("--draft_layers=1");
    if (cfg.draft == Config::Draft::kMtp) co.worker_flags.push_back("--draft_mtp");
    if (cfg.draft == Config::Draft::kRandom) {
      co.worker_flags.push_back("--draft_model=" + RandomDraftModel());
    }
    co.router_flags = cfg.flags;
    auto c = testing::StartCluster(co);
    ASSERT_NE(c, nullptr);
    const std::vector<ChoiceOut> solo = RunAll(*c, m.requests, false);
    if (reference.empty()) {
      reference = solo;
      for (size_t i = 0; i < m.golden.size(); ++i) {
        if (!m.golden[i].empty()) {
          EXPECT_EQ(solo[i].ids, m.golden[i]) << "golden case " << i;
        }
      }
    }
    const std::vector<ChoiceOut> together = RunAll(*c, m.requests, true);
    for (size_t i = 0; i < m.requests.size(); ++i) {
      ExpectSame(reference[i], solo[i], absl::StrCat("request ", i, " solo"));
      ExpectSame(reference[i], together[i], absl::StrCat("request ", i, " five at once"));
    }
    auto metrics = testing::GetOnce(c->http(), "/metrics");
    ASSERT_TRUE(metrics.ok());
    const double drafted = testing::Metric(metrics->body, "ringlane_spec_drafted_tokens_total");
    const double accepted = testing::Metric(metrics->body, "ringlane_spec_accepted_tokens_total");
    const double rejected = testing::Metric(metrics->body, "ringlane_spec_rejected_tokens_total");
    std::printf("%s, %s: drafted %.0f, accepted %.0f, rejected %.0f\n", m.name, cfg.name, drafted,
                accepted, rejected);
    if (std::string(cfg.name) == "off") {
      EXPECT_EQ(drafted, 0);
    } else if (std::string(cfg.name).find("adaptive") == std::string::npos) {
      EXPECT_GT(drafted, 0);
      EXPECT_EQ(drafted, accepted + rejected);
    }
    // The concurrent pass resends the solo prompts: their last blocks came
    // back as copies of the partly filled ones (token-granular hits), and the
    // comparisons above hold for them too.
    EXPECT_GT(testing::Metric(metrics->body, "ringlane_kv_block_copies_total"), 0);
    if (cfg.expect_accepted && (m.ngram_accepts || std::string(cfg.name) != "ngram")) {
      EXPECT_GT(accepted, 0);
    }
    if (cfg.expect_rejected) {
      EXPECT_GT(rejected, 0);
    }
    if (cfg.draft == Config::Draft::kMtp) {
      // Random weights: the MTP layer's guesses are rarely right, but it
      // must have proposed and been verified.
      EXPECT_GT(drafted, 0);
    }
  }
}

// A prefix the draft model never saw. Each greedy golden prompt goes first
// with speculation off for the request (its lane never feeds the draft
// model), then again with it on, reusing the first pass's blocks. The target
// as its own draft model proposes exactly the greedy continuation wherever
// its entries of those blocks are the target's, so not one draft may be
// rejected; before the resend's first row carried the prefix tokens, the
// draft read the entries the blocks held before.
TEST(SpeculativeE2ePrefixTest, AResendOfAPromptTheDraftModelNeverSawKeepsEveryGreedyDraft) {
  const Model m = Stories();
  testing::ClusterOptions co;
  co.worker_flags = {"--draft_model=" + m.path, "--metrics_port=0"};
  co.router_flags = {"--spec_drafters=model", "--spec_adaptive=false", "--spec_max_drafts=4"};
  auto c = testing::StartCluster(co);
  ASSERT_NE(c, nullptr);
  for (size_t i = 0; i < m.requests.size(); ++i) {
    if (m.golden[i].empty()) continue;  // the sampled half: drafts may differ
    v1::GenerateRequest off = m.requests[i];
    off.set_speculative(false);
    CallOut first = testing::Call(*c->stub, off);
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    CallOut again = testing::Call(*c->stub, m.requests[i]);
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    ExpectSame(first.choices[0], again.choices[0], absl::StrCat("golden case ", i));
  }
  auto metrics = testing::GetOnce(c->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  const double drafted = testing::Metric(metrics->body, "ringlane_spec_drafted_tokens_total");
  const double rejected = testing::Metric(metrics->body, "ringlane_spec_rejected_tokens_total");
  std::printf("resends with a self draft model: drafted %.0f, rejected %.0f\n", drafted, rejected);
  EXPECT_GT(drafted, 0);
  EXPECT_EQ(rejected, 0);
  const double cached = testing::Metric(metrics->body, "ringlane_cached_prompt_tokens_total");
  EXPECT_GT(cached, 0);
  // The resends' cached tokens the draft model lacked were fed to it, and
  // the worker counts them (not more than were cached).
  const double refed = c->workers->RankMetric("ringlane_worker_draft_prefix_tokens_total");
  std::printf("cached prompt tokens %.0f, fed again to the draft model %.0f\n", cached, refed);
  EXPECT_GT(refed, 0);
  EXPECT_LE(refed, cached);
}

std::string ModelName(const ::testing::TestParamInfo<Model (*)()>& info) {
  static const char* const kNames[] = {"stories", "synthetic", "deepseek_dsa"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeE2eTest,
                         ::testing::Values(&Stories, &Synthetic, &DeepseekDsa), ModelName);

}  // namespace
}  // namespace ringlane
