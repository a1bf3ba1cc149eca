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
  EXPECT_THAT(ShippedWorkloadNames(), ElementsAre("decode", "prefill", "sweep", "resend", "soak"));
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
