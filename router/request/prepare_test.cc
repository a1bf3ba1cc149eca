// The input bounds Prepare enforces for both front doors (HTTP and gRPC).
#include "router/request/prepare.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/chat_template.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {
namespace {

namespace v1 = ringlane::v1;
using ::testing::HasSubstr;

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(RINGLANE_SOURCE_DIR "/deploy/models/stories260K/tok512.bin");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    model_.model_id = std::string(1, 'm');
    model_.max_context_tokens = 512;
    model_.vocab_size = 512;
    model_.limits.set_max_top_logprobs(20);
    model_.limits.set_max_abs_penalty(2);
    model_.limits.set_max_abs_logit_bias(100);
  }
  absl::StatusOr<PreparedRequest> Prepare(const v1::GenerateRequest& r,
                                          PrepareOptions options = {}) {
    RequestPreparer p(options, tokenizer_.get(), &template_);
    return p.Prepare(r, model_);
  }
  static v1::GenerateRequest Request() {
    v1::GenerateRequest r;
    r.set_text("Once upon a time");
    r.set_max_tokens(4);
    return r;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate template_{ChatTemplateFamily::kPlain};
  ModelDescription model_;
};

TEST_F(PrepareTest, RequestIdsAreShortAndOfASafeAlphabet) {
  for (const char* good : {"a", "req-7", "A_b.c:d/e@f+g=h~1"}) {
    v1::GenerateRequest r = Request();
    r.set_request_id(good);
    auto p = Prepare(r);
    ASSERT_TRUE(p.ok()) << good << ": " << p.status();
    EXPECT_EQ(p->request_id, good);
  }
  // CR/LF would inject response headers; spaces and quotes break logs.
  for (const std::string& bad :
       {std::string("a\r\nSet-Cookie: x"), std::string("a b"), std::string("a\"b"),
        std::string(129, 'x'), std::string("\xc3\xa9")}) {
    v1::GenerateRequest r = Request();
    r.set_request_id(bad);
    auto p = Prepare(r);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr("request_id")) << p.status();
  }
  EXPECT_TRUE(CheckRequestId("id", std::string(300, 'x'), 300).ok());
}

TEST_F(PrepareTest, SessionIdsStopsAndStopIdsAreBounded) {
  v1::GenerateRequest r = Request();
  r.set_session_id(std::string(257, 's'));
  EXPECT_THAT(Prepare(r).status().message(), HasSubstr("session_id: 257 bytes; at most 256"));
  r.set_session_id(std::string(256, 's'));
  EXPECT_TRUE(Prepare(r).ok());

  r = Request();
  r.add_stop(std::string(1025, 'z'));
  EXPECT_THAT(Prepare(r).status().message(), HasSubstr("stop[0]: 1025 bytes; at most 1024"));
  PrepareOptions wide;
  wide.max_stop_bytes = 4096;
  EXPECT_TRUE(Prepare(r, wide).ok());

  r = Request();
  for (int i = 0; i < 17; ++i) r.add_stop(std::string(1, 's'));
  EXPECT_THAT(Prepare(r).status().message(), HasSubstr("at most 16 stop strings"));

  r = Request();
  for (int i = 0; i < 257; ++i) r.add_stop_token_ids(1);
  EXPECT_THAT(Prepare(r).status().message(), HasSubstr("stop_token_ids: at most 256"));
}

// The gRPC door takes constraints and logit_bias as the gateway does, and
// refuses the same faults with INVALID_ARGUMENT naming the field.
TEST_F(PrepareTest, ConstraintsAndLogitBiasAreCheckedForTheGrpcDoor) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
      R"("properties":{"b":{"type":"integer"},"a":{"type":"string"}}}}}])";
  auto chat = [&](std::string_view tools_json) {
    v1::GenerateRequest r = Request();
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("hi");
    r.mutable_chat()->set_tools(std::string(tools_json));
    return r;
  };
  {
    v1::GenerateRequest r = Request();
    r.mutable_constraint()->set_json_schema(
        R"({"type":"object","properties":{"z":{"type":"integer"}}})");
    auto p = Prepare(r);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(p->grammar, nullptr);
    v1::GenerateRequest t = chat(tools);
    t.mutable_constraint()->set_tool_function("f");
    p = Prepare(t);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(p->grammar, nullptr);
  }
  struct Case {
    v1::GenerateRequest request;
    const char* param;
    const char* message;
  };
  std::vector<Case> cases;
  auto add = [&](v1::GenerateRequest r, const char* param, const char* message) {
    cases.push_back({std::move(r), param, message});
  };
  v1::GenerateRequest r = Request();
  r.mutable_constraint()->set_json_schema("{");
  add(r, "constraint.json_schema", "not valid JSON");
  r.mutable_constraint()->set_json_schema(std::string(200, '[') + std::string(200, ']'));
  add(r, "constraint.json_schema", "nested deeper");
  r.mutable_constraint()->set_json_schema(R"({"type":"string","pattern":"a+"})");
  add(r, "constraint.json_schema.pattern", "");
  r = Request();
  r.mutable_constraint()->set_tool_calls(true);
  add(r, "constraint", "need a chat prompt with tools");
  r = chat(tools);
  r.mutable_constraint()->set_tool_function("g");
  add(r, "constraint.tool_function", "does not declare");
  r = chat(
      R"([{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])");
  add(r, "tools[1].function.name", "declared twice");
  r = chat(R"({"type":"function"})");
  add(r, "tools", "must be an array");
  r = Request();
  r.mutable_constraint()->set_json_object(true);
  r.set_ignore_eos(true);
  add(r, "ignore_eos", "grammar");
  r = Request();
  (*r.mutable_sampling()->mutable_logit_bias())[512] = 1;
  add(r, "sampling.logit_bias[512]", "outside the vocabulary");
  r = Request();
  (*r.mutable_sampling()->mutable_logit_bias())[5] = 100.5;
  add(r, "sampling.logit_bias[5]", "must be in [-100, 100]");
  r = Request();
  (*r.mutable_sampling()->mutable_logit_bias())[5] = std::numeric_limits<float>::quiet_NaN();
  add(r, "sampling.logit_bias[5]", "must be in");
  r = Request();
  for (int i = 0; i <= kMaxLogitBiasTokens; ++i)
    (*r.mutable_sampling()->mutable_logit_bias())[i % 512 + 512 * (i / 512)] = 1;
  add(r, "sampling.logit_bias", "at most 1024");
  for (const Case& c : cases) {
    auto p = Prepare(c.request);
    ASSERT_FALSE(p.ok()) << c.param;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.param;
    EXPECT_EQ(p.status().message().rfind(c.param, 0), 0u) << c.param << ": " << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr(c.message)) << p.status();
  }
}

}  // namespace
}  // namespace ringlane::router
