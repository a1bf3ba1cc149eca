#include "tools/bench/client.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringlane::bench {
namespace {

using json = nlohmann::json;

json Body(const ServerOptions& server, const RequestSpec& spec) {
  absl::StatusOr<std::string> b = BuildRequestBody(server, spec);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? json::parse(*b) : json();
}

RequestSpec Spec() {
  RequestSpec spec;
  spec.prompt = "Once upon";
  spec.max_tokens = 32;
  spec.ignore_eos = true;
  spec.loop_watchdog = false;
  return spec;
}

TEST(BuildRequestBodyTest, RinglaneGetsItsExtensions) {
  ServerOptions server;
  server.kind = ServerKind::kRinglane;
  server.model = "stories260K";
  server.request_logprobs = true;
  const json b = Body(server, Spec());
  EXPECT_EQ(b["model"], "stories260K");
  EXPECT_EQ(b["prompt"], "Once upon");
  EXPECT_EQ(b["max_tokens"], 32);
  EXPECT_EQ(b["temperature"], 0.0);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["logprobs"], 1);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["loop_watchdog"], false);
}

TEST(BuildRequestBodyTest, RinglaneDefaultsAreNotSent) {
  ServerOptions server;
  server.kind = ServerKind::kRinglane;
  RequestSpec spec = Spec();
  spec.ignore_eos = false;
  spec.loop_watchdog = true;
  const json b = Body(server, spec);
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_FALSE(b.contains("loop_watchdog"));
  EXPECT_FALSE(b.contains("logprobs"));
}

TEST(BuildRequestBodyTest, GenericGetsStandardFieldsOnly) {
  ServerOptions server;
  server.kind = ServerKind::kGeneric;
  const json b = Body(server, Spec());
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_FALSE(b.contains("loop_watchdog"));
  EXPECT_FALSE(b.contains("logprobs"));
  // Another server's own knobs come through --extra_body, last.
  server.extra_body = R"({"ignore_eos": true, "temperature": 0.7})";
  const json e = Body(server, Spec());
  EXPECT_EQ(e["ignore_eos"], true);
  EXPECT_EQ(e["temperature"], 0.7);
  server.extra_body = "[1]";
  EXPECT_EQ(BuildRequestBody(server, Spec()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BuildRequestBodyTest, Chat) {
  ServerOptions server;
  server.request_logprobs = true;
  RequestSpec spec = Spec();
  spec.endpoint = Endpoint::kChat;
  spec.messages = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "More"}};
  const json b = Body(server, spec);
  EXPECT_FALSE(b.contains("prompt"));
  ASSERT_EQ(b["messages"].size(), 3u);
  EXPECT_EQ(b["messages"][1]["role"], "assistant");
  EXPECT_EQ(b["logprobs"], true);
}

}  // namespace
}  // namespace ringlane::bench
