#include "router/api/openai_api.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/errors.h"

namespace ringlane::router::openai {
namespace {

namespace v1 = ringlane::v1;
using nlohmann::json;
using ::testing::HasSubstr;

TEST(OpenAiParseTest, CompletionFieldsMapOntoGenerateRequest) {
  auto p = ParseRequest(Endpoint::kCompletions, R"({
    "model": "m", "prompt": "Once", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": -1, "min_p": 0.1, "seed": 42, "stop": ["a", "b"], "n": 2, "logprobs": 3,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "user": "u", "ignore_eos": true,
    "loop_watchdog": false, "speculative": false, "speculative.n_max": 3, "stream": true, "stream_options": {"include_usage": true},
    "prompt_cache_key": "s1", "tools": null})",
                        "");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->prompts.size(), 1u);
  const v1::GenerateRequest& r = p->prompts[0];
  EXPECT_EQ(r.text(), "Once");
  EXPECT_EQ(r.model(), "m");
  EXPECT_EQ(r.max_tokens(), 7);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 0);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.1f);
  EXPECT_EQ(r.sampling().seed(), 42u);
  EXPECT_EQ(r.sampling().top_logprobs(), 3);
  EXPECT_TRUE(r.logprobs());
  EXPECT_THAT(std::vector<std::string>(r.stop().begin(), r.stop().end()),
              ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(r.n(), 2);
  EXPECT_TRUE(r.ignore_eos());
  EXPECT_TRUE(r.has_loop_watchdog());
  EXPECT_FALSE(r.loop_watchdog());
  EXPECT_TRUE(r.has_speculative());
  EXPECT_FALSE(r.speculative());
  EXPECT_EQ(r.max_drafts(), 3);
  EXPECT_EQ(r.session_id(), "s1");
  EXPECT_TRUE(p->stream);
  EXPECT_TRUE(p->include_usage);
  EXPECT_EQ(p->user, "u");
}

TEST(OpenAiParseTest, PromptForms) {
  auto ids = ParseRequest(Endpoint::kCompletions, R"({"model":"m","prompt":[1,2,3]})", "");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompts[0].token_ids().ids_size(), 3);
  EXPECT_EQ(ids->prompts[0].max_tokens(), kCompletionsDefaultMaxTokens);
  auto many = ParseRequest(Endpoint::kCompletions, R"({"model":"m","prompt":["a",[5,6]]})", "sess");
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->prompts.size(), 2u);
  EXPECT_EQ(many->prompts[0].text(), "a");
  EXPECT_EQ(many->prompts[1].token_ids().ids_size(), 2);
  EXPECT_EQ(many->prompts[1].session_id(), "sess");  // the X-Session-Id header
  auto chat = ParseRequest(Endpoint::kChatCompletions, R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
      "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2})",
                           "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  const v1::ChatMessages& m = chat->prompts[0].chat();
  ASSERT_EQ(m.messages_size(), 2);
  EXPECT_EQ(m.messages(0).role(), "system");
  EXPECT_EQ(m.messages(1).content(), "hi there");
  EXPECT_EQ(chat->prompts[0].max_tokens(), 5);
  EXPECT_FALSE(chat->prompts[0].has_max_tokens() && chat->prompts[0].max_tokens() == 16);
  EXPECT_EQ(chat->top_logprobs, 2);
}

TEST(OpenAiParseTest, BadRequestsNameTheField) {
  struct Case {
    Endpoint endpoint;
    const char* body;
    const char* param;
    const char* message;
  };
  const Endpoint C = Endpoint::kCompletions, H = Endpoint::kChatCompletions;
  const std::vector<Case> cases = {
      {C, "{", "body", "not valid JSON"},
      {C, "[1]", "body", "expected a JSON object"},
      {C, R"({"prompt":"x"})", "model", "required"},
      {C, R"({"model":"m"})", "prompt", "required"},
      {C, R"({"model":"m","prompt":7})", "prompt", "expected a string"},
      {C, R"({"model":"m","prompt":[]})", "prompt", "empty"},
      {C, R"({"model":"m","prompt":[1,"a"]})", "prompt[1]", "expected an integer"},
      {C, R"({"model":"m","prompt":[1,-1]})", "prompt[1]", "must be in"},
      {C, R"({"model":"m","prompt":"x","max_tokens":"9"})", "max_tokens", "expected an integer"},
      {C, R"({"model":"m","prompt":"x","max_tokens":-4})", "max_tokens", ">= 1"},
      {C, R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens", ">= 1"},
      {C, R"({"model":"m","prompt":"x","temperature":"hot"})", "temperature", "a number"},
      {C, R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", "stop", "at most 4"},
      {C, R"({"model":"m","prompt":"x","stop":[1]})", "stop[0]", "a string"},
      {C, R"({"model":"m","prompt":"x","n":0})", "n", "must be in"},
      {C, R"({"model":"m","prompt":"x","speculative":"no"})", "speculative", "a boolean"},
      {C, R"({"model":"m","prompt":"x","speculative.n_max":65})", "speculative.n_max",
       "must be in"},
      {C, R"({"model":"m","prompt":"x","speculative.n_max":-1})", "speculative.n_max",
       "must be in"},
      {C, R"({"model":"m","prompt":"x","logprobs":6})", "logprobs", "must be in [0, 5]"},
      {C, R"({"model":"m","prompt":"x","logprobs":1,"echo":true})", "echo", "prompt's logprobs"},
      {C, R"({"model":"m","prompt":"x","tools":[{"type":"function"}]})", "tools", "not supported"},
      {C, R"({"model":"m","prompt":"x","response_format":{"type":"json_object"}})",
       "response_format", "not supported"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"1":5}})", "logit_bias", "not supported"},
      {C, R"({"model":"m","prompt":"x","frobnicate":1})", "frobnicate", "unknown field"},
      {C, R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})", "stream_options",
       "only allowed when stream"},
      {C, R"({"model":"m","messages":[{"role":"user","content":"x"}]})", "messages",
       "not supported"},
      {H, R"({"model":"m","prompt":"x"})", "prompt", "not supported"},
      {H, R"({"model":"m","messages":[]})", "messages", "empty"},
      {H, R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role", "required"},
      {H, R"({"model":"m","messages":[{"role":"user","content":7}]})", "messages[0].content",
       "expected"},
      {H,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0]", "only"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       "top_logprobs", "requires logprobs"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":2})", "logprobs",
       "a boolean"},
      // Conversions are range-checked first (out of float or int64 range
      // is undefined behaviour to convert).
      {C, R"({"model":"m","prompt":"x","temperature":1e300})", "temperature", "out of range"},
      {C, R"({"model":"m","prompt":"x","max_tokens":1e300})", "max_tokens", "an integer"},
      {C, R"({"model":"m","prompt":"x","n":65})", "n", "at most 64"},
      {C, R"({"model":"m","prompt":["a","b","c","d","e","f","g","h","i"],"n":8})", "prompt",
       "72 choices"},
  };
  for (const Case& c : cases) {
    auto p = ParseRequest(c.endpoint, c.body, "");
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    const ApiError e = ErrorFromStatus(p.status());
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(c.message)) << c.body;
  }
}

TEST(OpenAiParseTest, DeepNestingIsRefusedBeforeParsing) {
  // 150,000 levels used to overflow the stack in nlohmann's recursive copy.
  const std::string deep = std::string(150000, '[') + std::string(150000, ']');
  const std::string body = absl::StrCat(R"({"model":"m","prompt":"x","logprobs":)", deep, "}");
  auto p = ParseRequest(Endpoint::kCompletions, body, "");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("nested deeper than 64"));
  EXPECT_FALSE(ParseTokenizeRequest(absl::StrCat(R"({"prompt":)", deep, "}")).ok());
  EXPECT_FALSE(ParseDetokenizeRequest(absl::StrCat(R"({"tokens":)", deep, "}")).ok());

  // Brackets inside strings (escaped quotes too) are text, not nesting.
  const std::string text = std::string(1000, '[') + "\\\"" + std::string(1000, '{');
  EXPECT_TRUE(CheckJsonDepth(absl::StrCat(R"({"a":")", text, R"("})"), 4).ok());
  EXPECT_TRUE(CheckJsonDepth("[[[[]]]]", 4).ok());
  EXPECT_FALSE(CheckJsonDepth("[[[[[]]]]]", 4).ok());
  RequestLimits limits;
  limits.max_json_depth = 3;
  EXPECT_FALSE(
      ParseRequest(Endpoint::kCompletions, R"({"model":"m","prompt":[[[1]]]})", "", limits).ok());
}

TEST(OpenAiParseTest, LogprobCountsAreBoundByTheWorkersLimit) {
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                           R"("logprobs":true,"top_logprobs":)";
  RequestLimits limits;
  limits.max_top_logprobs = 20;  // as the workers advertise it in GetInfo
  struct Case {
    Endpoint endpoint;
    std::string body;
    int max_top_logprobs;
    const char* param;
    const char* message;
  };
  const Endpoint C = Endpoint::kCompletions, H = Endpoint::kChatCompletions;
  const std::vector<Case> cases = {
      {H, chat + "21}", 20, "top_logprobs", "must be in [0, 20], got 21"},
      {H, chat + "-1}", 20, "top_logprobs", "must be in [0, 20], got -1"},
      {H, chat + "4}", 3, "top_logprobs", "must be in [0, 3], got 4"},
      // Before a group connected the bound is unknown: the sign still is.
      {H, chat + "-1}", -1, "top_logprobs", "must be >= 0, got -1"},
      {H, chat + R"("2"})", 20, "top_logprobs", "expected an integer"},
      // Completions: OpenAI's own bound of 5, or the workers' when lower.
      {C, R"({"model":"m","prompt":"x","logprobs":6})", 20, "logprobs", "must be in [0, 5]"},
      {C, R"({"model":"m","prompt":"x","logprobs":4})", 3, "logprobs", "must be in [0, 3]"},
  };
  for (const Case& c : cases) {
    RequestLimits l;
    l.max_top_logprobs = c.max_top_logprobs;
    auto p = ParseRequest(c.endpoint, c.body, "", l);
    ASSERT_FALSE(p.ok()) << c.body;
    const ApiError e = ErrorFromStatus(p.status());
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(c.message)) << c.body;
  }
  auto ok = ParseRequest(Endpoint::kChatCompletions, chat + "20}", "", limits);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->prompts[0].sampling().top_logprobs(), 20);
  // Unknown bound: left to Router::Prepare, which refuses before any group.
  ok = ParseRequest(Endpoint::kChatCompletions, chat + "21}", "");
  ASSERT_TRUE(ok.ok()) << ok.status();
}

TEST(OpenAiParseTest, LongFreeStringsAreRefused) {
  const std::string big(300, 'u');
  auto p = ParseRequest(Endpoint::kCompletions,
                        absl::StrCat(R"({"model":"m","prompt":"x","user":")", big, R"("})"), "");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("user: longer than 256"));
  p = ParseRequest(Endpoint::kCompletions, absl::StrCat(R"({"model":")", big, R"(","prompt":"x"})"),
                   "");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("model: longer than 256"));
}

TEST(OpenAiParseTest, DefaultValuesOfUnsupportedFieldsAreAccepted) {
  auto p = ParseRequest(
      Endpoint::kChatCompletions,
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"logit_bias":{},
          "response_format":{"type":"text"},"parallel_tool_calls":false,"tool_choice":"none"})",
      "");
  EXPECT_TRUE(p.ok()) << p.status();
}

TEST(OpenAiErrorTest, StatusesMapToOpenAiErrors) {
  EXPECT_EQ(ErrorFromStatus(UnknownModelError("x", "y")).status, 404);
  EXPECT_EQ(ErrorFromStatus(UnknownModelError("x", "y")).code, "model_not_found");
  // The kind travels with the status, not in its text.
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("model: unknown model 'x'")).status, 400);
  EXPECT_EQ(ErrorFromStatus(absl::ResourceExhaustedError("full")).status, 429);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("no group")).status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::UnauthenticatedError("no key")).status, 401);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("boom")).status, 500);
  const json j = json::parse(ErrorJson(ErrorFromStatus(FieldError("n", "bad"))));
  EXPECT_EQ(j["error"]["message"], "n: bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(ErrorFromStatus(UnknownModelError("x", "y")).param, "model");
  // The param travels with the status too: text that looks like a field
  // names none, and a field survives a message that does not start with it.
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("n: bad")).param, "");
  EXPECT_EQ(ErrorFromStatus(WithParam(absl::InvalidArgumentError("too long"), "stop")).param,
            "stop");
}

TEST(OpenAiParseTest, TokenizeAndDetokenizeBodies) {
  auto t = ParseTokenizeRequest(R"({"model":"m","prompt":"hi","add_special_tokens":false})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->text(), "hi");
  EXPECT_FALSE(t->add_special_tokens());
  EXPECT_FALSE(ParseTokenizeRequest(R"({"model":"m"})").ok());
  auto d = ParseDetokenizeRequest(R"({"tokens":[1,2]})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->second.size(), 2u);
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens":"12"})").ok());
}

}  // namespace
}  // namespace ringlane::router::openai
