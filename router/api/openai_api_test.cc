#include "router/api/openai_api.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/errors.h"
#include "router/tokenizer/tokenizer.h"

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
      {C, R"({"model":"m","prompt":"x","tools":[{"type":"function"}]})", "tools",
       "only /v1/chat/completions"},
      {C, R"({"model":"m","prompt":"x","response_format":{"type":"xml"}})", "response_format.type",
       "must be"},
      {C, R"({"model":"m","prompt":"x","response_format":{"type":"json_schema"}})",
       "response_format.json_schema", "required"},
      {C, R"({"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":{}}})",
       "response_format.json_schema.name", "required"},
      {C, R"({"model":"m","prompt":"x","response_format":{"type":"json_object","x":1}})",
       "response_format.x", "unknown field"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"a":5}})", "logit_bias.a", "token ids"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"1":"5"}})", "logit_bias.1", "a number"},
      {C, R"({"model":"m","prompt":"x","logit_bias":[1]})", "logit_bias", "an object"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
       "tool_choice", "needs tools"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"always"})",
       "tool_choice", "must be"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}})", "tools",
       "an array"},
      {H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"web"}]})",
       "tools[0].type", "function"},
      {H,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name", "must be"},
      {H,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice.function.name", "not one of tools"},
      {H, R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id",
       "required"},
      {H,
       R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]})",
       "messages[0].tool_calls", "only assistant"},
      {H,
       R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "JSON text of an object"},
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

TEST(OpenAiParseTest, StructuredOutputAndToolFieldsMapOntoGenerateRequest) {
  RequestLimits limits;
  limits.max_abs_logit_bias = 100;  // as the workers advertise it
  // Schema keys out of sorted order: the constraint and the tools keep
  // them as written (properties are generated in declaration order).
  auto p = ParseRequest(Endpoint::kChatCompletions, R"({"model":"m",
      "messages":[{"role":"user","content":"x"},
                  {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",
                   "function":{"name":"get","arguments":"{\"city\":\"Oslo\"}"}}]},
                  {"role":"tool","tool_call_id":"c1","content":"5 C"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"r","schema":
        {"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}},
         "required":["zeta","alpha"]}}},
      "tools":[{"type":"function","function":{"name":"get","parameters":
        {"type":"object","properties":{"zz":{"type":"string"},"aa":{"type":"number"}}}}}],
      "logit_bias":{"7":-100,"9":2.5}})",
                        "", limits);
  ASSERT_TRUE(p.ok()) << p.status();
  const v1::GenerateRequest& r = p->prompts[0];
  ASSERT_EQ(r.constraint().kind_case(), v1::OutputConstraint::kJsonSchema);
  EXPECT_LT(r.constraint().json_schema().find("zeta"), r.constraint().json_schema().find("alpha"));
  EXPECT_LT(r.chat().tools().find("zz"), r.chat().tools().find("aa"));
  EXPECT_EQ(r.sampling().logit_bias().at(7), -100.0f);
  EXPECT_EQ(r.sampling().logit_bias().at(9), 2.5f);
  ASSERT_EQ(r.chat().messages(1).tool_calls_size(), 1);
  EXPECT_EQ(r.chat().messages(1).tool_calls(0).name(), "get");
  EXPECT_EQ(r.chat().messages(1).tool_calls(0).arguments(), R"({"city":"Oslo"})");
  EXPECT_EQ(r.chat().messages(2).tool_call_id(), "c1");
  EXPECT_EQ(p->tool_choice, "auto");

  // tool_choice required / named set the tool-call constraint.
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get"}}])";
  auto req = ParseRequest(Endpoint::kChatCompletions,
                          R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools +
                              R"(,"tool_choice":"required"})",
                          "", limits);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_TRUE(req->prompts[0].constraint().tool_calls());
  auto named = ParseRequest(Endpoint::kChatCompletions,
                            R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools +
                                R"(,"tool_choice":{"type":"function","function":{"name":"get"}}})",
                            "", limits);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->prompts[0].constraint().tool_function(), "get");

  // The workers' logit_bias bound, under OpenAI's field name.
  auto big = ParseRequest(Endpoint::kCompletions,
                          R"({"model":"m","prompt":"x","logit_bias":{"3":101}})", "", limits);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(ErrorFromStatus(big.status()).param, "logit_bias.3");
  EXPECT_THAT(big.status().message(), HasSubstr("must be in [-100, 100], got 101"));
  // A schema the grammar cannot build names its place.
  auto pattern = ParseRequest(
      Endpoint::kCompletions,
      R"({"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":
          {"name":"r","schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}}}}})",
      "", limits);
  ASSERT_FALSE(pattern.ok());
  EXPECT_EQ(ErrorFromStatus(pattern.status()).status, 400);
  EXPECT_THAT(pattern.status().message(),
              HasSubstr("response_format.json_schema.schema.properties.a"));
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

// Chat output with tools: the calls out of the text, whole and streamed
// alike; parallel_tool_calls false keeps the first.
TEST(OpenAiResponseTest, ToolCallsWholeAndStreamed) {
  auto tok = LoadTokenizer(RINGLANE_SOURCE_DIR "/deploy/models/stories260K/tok512.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  for (bool parallel : {true, false}) {
    std::vector<json> final_calls[2];
    for (bool stream : {false, true}) {
      SCOPED_TRACE(absl::StrCat("parallel ", parallel, " stream ", stream));
      auto p = ParseRequest(
          Endpoint::kChatCompletions,
          absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":)",
                       stream ? "true" : "false", R"(,"parallel_tool_calls":)",
                       parallel ? "true" : "false",
                       R"(,"tools":[{"type":"function","function":{"name":"f"}},)",
                       R"({"type":"function","function":{"name":"g"}}]})"),
          "");
      ASSERT_TRUE(p.ok()) << p.status();
      ToolParserOptions options;
      options.tool_parameters = {{"f", json()}, {"g", json()}};
      ResponseBuilder b(*p, "chatcmpl-1", 0, "m", 1, **tok, options);
      std::vector<json> calls;
      std::string finish;
      for (size_t at = 0; at < text.size(); at += 7) {
        v1::GenerateResponse msg;
        msg.set_text(text.substr(at, 7));
        if (at + 7 >= text.size()) msg.set_finish_reason(v1::FINISH_REASON_STOP);
        for (const json& chunk : b.Add(0, msg)) {
          for (const json& ch : chunk["choices"]) {
            if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
            for (const json& d : ch["delta"].value("tool_calls", json::array())) {
              const size_t i = d["index"];
              if (calls.size() <= i) calls.resize(i + 1);
              if (d.contains("id")) {
                calls[i] = {{"id", d["id"]},
                            {"type", "function"},
                            {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}};
              }
              calls[i]["function"]["arguments"] =
                  calls[i]["function"]["arguments"].get<std::string>() +
                  d["function"]["arguments"].get<std::string>();
            }
          }
        }
      }
      if (!stream) {
        const json whole = b.Final();
        const json& ch = whole["choices"][0];
        finish = ch["finish_reason"];
        EXPECT_TRUE(ch["message"]["content"].is_null()) << whole.dump();
        for (const json& c : ch["message"]["tool_calls"]) calls.push_back(c);
      }
      EXPECT_EQ(finish, "tool_calls");
      ASSERT_EQ(calls.size(), parallel ? 2u : 1u);
      EXPECT_EQ(calls[0]["function"]["name"], "f");
      EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
                json({{"a", 1}}));
      final_calls[stream] = calls;
    }
    EXPECT_EQ(final_calls[0], final_calls[1]);
  }
}

}  // namespace
}  // namespace ringlane::router::openai
