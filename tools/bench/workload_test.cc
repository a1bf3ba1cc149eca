#include "tools/bench/workload.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The bundled model's context: every shipped workload must fit it.
constexpr int kContext = 512;

TEST(ShippedWorkloadsTest, AllParseAndFitTheBundledModel) {
  EXPECT_THAT(ShippedWorkloadNames(),
              ElementsAre("decode", "prefill", "sweep", "resend", "soak", "copy", "agentic"));
  for (const std::string& name : ShippedWorkloadNames()) {
    absl::StatusOr<Workload> w = LoadWorkload(name);
    ASSERT_TRUE(w.ok()) << name << ": " << w.status();
    EXPECT_EQ(w->name, name);
    EXPECT_FALSE(w->description.empty());
    for (const Stage& s : w->stages) {
      int tokens = s.prompt_tokens.Largest() + s.output_tokens;
      if (s.mode == StageMode::kConversation) {
        // The last turn resends everything: the document, every question
        // with its "Question k: ...?\nAnswer:" frame (about 8 tokens),
        // every earlier answer.
        tokens += s.turns * (s.turn_tokens.Largest() + 8) + (s.turns - 1) * s.output_tokens;
      }
      if (s.mode == StageMode::kCopy) {
        // The document's call: the seed, then the document.
        EXPECT_LT(s.prompt_tokens.Largest() + s.document_tokens.Largest() + 1, kContext);
        // The recorded prompt: the document, a newline, its first part again
        // (re-tokenizing the document's text gives no more tokens than it
        // had, give or take one at the joint).
        const int doc = s.document_tokens.Largest();
        tokens = doc + 1 + static_cast<int>(doc * s.copy_prefix_fraction) + 2 + s.output_tokens;
      }
      EXPECT_LT(tokens + 1, kContext) << name << "/" << s.name;  // + BOS
    }
  }
}

TEST(ShippedWorkloadsTest, Shapes) {
  absl::StatusOr<Workload> sweep = LoadWorkload("sweep");
  ASSERT_TRUE(sweep.ok());
  EXPECT_THAT(sweep->stages[0].concurrency, ElementsAre(1, 2, 5, 8));
  EXPECT_EQ(sweep->stages[0].RequestsAt(5), 15);
  absl::StatusOr<Workload> resend = LoadWorkload("resend");
  ASSERT_TRUE(resend.ok());
  EXPECT_EQ(resend->stages[0].mode, StageMode::kResend);
  absl::StatusOr<Workload> soak = LoadWorkload("soak");
  ASSERT_TRUE(soak.ok());
  EXPECT_EQ(soak->stages[0].mode, StageMode::kConversation);
  EXPECT_GT(soak->stages[0].duration_s, 0);
  EXPECT_TRUE(soak->loop_watchdog);
  // The speculative-decoding workloads: greedy, exact lengths, one stream
  // and five.
  for (const char* name : {"copy", "agentic"}) {
    absl::StatusOr<Workload> w = LoadWorkload(name);
    ASSERT_TRUE(w.ok()) << name;
    EXPECT_EQ(w->temperature, 0);
    EXPECT_TRUE(w->ignore_eos);
    EXPECT_FALSE(w->loop_watchdog);
    ASSERT_EQ(w->stages.size(), 1u);
    EXPECT_THAT(w->stages[0].concurrency, ElementsAre(1, 5));
  }
  absl::StatusOr<Workload> copy = LoadWorkload("copy");
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->stages[0].mode, StageMode::kCopy);
  EXPECT_EQ(copy->stages[0].document_tokens.Largest(), 160);
  EXPECT_EQ(copy->stages[0].copy_prefix_fraction, 0.25);
  absl::StatusOr<Workload> agentic = LoadWorkload("agentic");
  ASSERT_TRUE(agentic.ok());
  EXPECT_EQ(agentic->stages[0].mode, StageMode::kAgentic);
  EXPECT_EQ(agentic->stages[0].distinct_prompts, 5);
  // Both levels have a first pass and eleven repeat passes.
  EXPECT_EQ(agentic->stages[0].RequestsAt(1), 60);
  EXPECT_EQ(agentic->stages[0].RequestsAt(5), 60);
}

TEST(ParseWorkloadTest, CopyAndAgenticFields) {
  absl::StatusOr<Workload> w = ParseWorkload(R"({"name": "x", "stages": [
    {"name": "c", "mode": "copy", "prompt_tokens": 4, "document_tokens": [20, 40],
     "output_tokens": 8, "requests": 2},
    {"name": "a", "mode": "agentic", "prompt_tokens": 8, "distinct_prompts": 3,
     "concurrency": [1, 2], "requests_per_stream": 4}]})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->stages[0].document_tokens.values, ElementsAre(20, 40));
  EXPECT_EQ(w->stages[0].copy_prefix_fraction, 0.25);  // the default
  EXPECT_FALSE(w->stages[0].document_from_words);      // the default: the model's text
  EXPECT_EQ(w->stages[1].distinct_prompts, 3);
  EXPECT_STREQ(StageModeName(w->stages[0].mode), "copy");
  EXPECT_STREQ(StageModeName(w->stages[1].mode), "agentic");
  // Scaling reaches the documents too.
  EXPECT_THAT(ScaleLengths(*w, 2).stages[0].document_tokens.values, ElementsAre(40, 80));
}

TEST(ParseWorkloadTest, FullForm) {
  absl::StatusOr<Workload> w = ParseWorkload(R"({
    "name": "mine", "endpoint": "chat", "temperature": 0.5, "ignore_eos": false,
    "stages": [{"name": "a", "concurrency": [1, 4], "prompt_tokens": {"uniform": [10, 20]},
                "output_tokens": 8, "requests_per_stream": 2, "duration_s": 5, "warmup": 2}]})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->endpoint, Endpoint::kChat);
  EXPECT_EQ(w->temperature, 0.5);
  EXPECT_FALSE(w->ignore_eos);
  const Stage& s = w->stages[0];
  EXPECT_EQ(s.prompt_tokens.min, 10);
  EXPECT_EQ(s.prompt_tokens.max, 20);
  EXPECT_EQ(s.RequestsAt(4), 8);
  EXPECT_EQ(s.warmup, 2);
  for (double u : {0.0, 0.5, 0.999999}) {
    const int x = s.prompt_tokens.Pick(0, u);
    EXPECT_GE(x, 10);
    EXPECT_LE(x, 20);
  }
}

TEST(ParseWorkloadTest, LengthsCycle) {
  LengthDist d;
  d.values = {16, 64, 256};
  EXPECT_EQ(d.Pick(0, 0.9), 16);
  EXPECT_EQ(d.Pick(4, 0.9), 64);
  EXPECT_EQ(d.Scaled(2).values, (std::vector<int>{32, 128, 512}));
}

TEST(ParseWorkloadTest, RejectsMistakesByName) {
  struct Case {
    const char* json;
    const char* error;
  };
  const Case cases[] = {
      {"not json", "not valid JSON"},
      {R"({"name": "x", "stages": []})", "stages"},
      {R"({"name": "x", "stage": [], "stages": [{}]})", "unknown field \"stage\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "concurency": 2}]})",
       "unknown field \"concurency\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8}]})",
       "requests, requests_per_stream or duration_s"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 0, "requests": 1}]})",
       "lengths are integers >= 1"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "concurrency": [0]}]})",
       "concurrency"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "mode": "burst"}]})",
       "mode"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "turns": 3}]})",
       "only for mode \"conversation\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "mode": "copy"}]})",
       "document_tokens: required"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "duration_s": 5,
          "mode": "copy", "document_tokens": 32}]})",
       "needs requests or requests_per_stream"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "mode": "copy", "document_tokens": 32, "copy_prefix_fraction": 1.5}]})",
       "copy_prefix_fraction: a fraction"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "document_tokens": 32}]})",
       "document_tokens: only for mode \"copy\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "mode": "copy", "document_tokens": 32, "document": "book"}]})",
       "document: \"model\" or \"words\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "document": "words"}]})",
       "document: only for mode \"copy\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 1,
          "distinct_prompts": 2}]})",
       "distinct_prompts: only for mode \"agentic\""},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "requests": 4,
          "mode": "agentic", "distinct_prompts": 4}]})",
       "leave no repeats"},
      {R"({"name": "x", "stages": [{"name": "a", "prompt_tokens": 8, "mode": "agentic",
          "concurrency": [1, 4], "requests_per_stream": 2, "distinct_prompts": 4}]})",
       "at concurrency 1, 2 requests"},
      {R"({"name": "x", "endpoint": "embeddings", "stages": [{"name": "a",
          "prompt_tokens": 8, "requests": 1}]})",
       "endpoint"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Workload> w = ParseWorkload(c.json);
    ASSERT_FALSE(w.ok()) << c.json;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(w.status().message()), HasSubstr(c.error)) << c.json;
  }
}

TEST(LoadWorkloadTest, UnknownNameIsNotFound) {
  absl::StatusOr<Workload> w = LoadWorkload("/nonexistent/nope.json");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("decode, prefill"));
}

}  // namespace
}  // namespace ringlane::bench
