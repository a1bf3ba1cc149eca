// Structured output end to end, on real workers behind a real router, with
// the bundled model: every response_format json_schema request gives text
// that parses as JSON and validates against its schema (checked by a
// validator written here over the parsed value, apart from the grammar
// compiler), streamed and not, greedy and sampled, with speculative
// decoding off and forced on, one at a time and all at once: the text,
// finish and logprobs are the same in all of them. json_object, tool_choice "required" and a named
// function give a parsable call; logit_bias moves greedy output; bad
// schemas, tool choices and tool messages are 400s naming the field.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"

namespace ringlane {
namespace {

using nlohmann::json;

// The schemas: objects, arrays, enums, nesting, required and optional
// fields, numbers, booleans, $ref. Strings are bounded: a 260K-parameter
// model will not close an unbounded string on its own within max_tokens.
const std::vector<json>& Schemas() {
  static const std::vector<json> schemas = {
      json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false})"),
      json::parse(
          R"({"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "minItems": 1, "maxItems": 3})"),
      json::parse(R"({"type": "object", "properties": {
          "mood": {"enum": ["happy", "sad", "angry"]},
          "pet": {"type": "object", "properties": {
              "kind": {"type": "string", "enum": ["cat", "dog"]},
              "legs": {"type": "integer"},
              "good": {"type": "boolean"}},
            "required": ["kind", "good"], "additionalProperties": false},
          "note": {"type": "string", "maxLength": 6}},
        "required": ["mood", "pet"], "additionalProperties": false})"),
      json::parse(R"({"type": "object", "properties": {
          "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
          "winner": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/player"}]}},
        "required": ["scores", "winner"], "additionalProperties": false,
        "$defs": {"player": {"type": "object", "properties": {
            "id": {"type": "integer"}, "tag": {"type": "string", "maxLength": 4}},
          "required": ["id", "tag"], "additionalProperties": false}}})"),
  };
  return schemas;
}

// Validates `v` against the subset of JSON Schema the schemas above use;
// "" when valid, else where and why not.
std::string Validate(const json& v, const json& schema, const json& root, const std::string& at) {
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    const std::string name = ref.substr(ref.rfind('/') + 1);
    return Validate(v, root["$defs"][name], root, at);
  }
  if (schema.contains("anyOf")) {
    for (const json& alt : schema["anyOf"]) {
      if (Validate(v, alt, root, at).empty()) return "";
    }
    return at + ": matches no anyOf alternative";
  }
  if (schema.contains("enum")) {
    for (const json& e : schema["enum"]) {
      if (e == v) return "";
    }
    return at + ": not one of enum";
  }
  const std::string type = schema.value("type", "");
  if (type == "object") {
    if (!v.is_object()) return at + ": not an object";
    for (const json& r : schema.value("required", json::array())) {
      if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
    }
    for (const auto& [k, val] : v.items()) {
      if (!schema["properties"].contains(k)) return at + ": extra property " + k;
      std::string e = Validate(val, schema["properties"][k], root, at + "." + k);
      if (!e.empty()) return e;
    }
    return "";
  }
  if (type == "array") {
    if (!v.is_array()) return at + ": not an array";
    if (v.size() < schema.value("minItems", 0u)) return at + ": too few items";
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) {
      return at + ": too many items";
    }
    for (size_t i = 0; i < v.size(); ++i) {
      std::string e = Validate(v[i], schema["items"], root, absl::StrCat(at, "[", i, "]"));
      if (!e.empty()) return e;
    }
    return "";
  }
  if (type == "string") {
    if (!v.is_string()) return at + ": not a string";
    // maxLength counts code points.
    size_t cps = 0;
    for (unsigned char ch : v.get<std::string>()) cps += (ch & 0xc0) != 0x80;
    if (schema.contains("maxLength") && cps > schema["maxLength"].get<size_t>()) {
      return at + ": too long";
    }
    return "";
  }
  if (type == "integer") return v.is_number_integer() ? "" : at + ": not an integer";
  if (type == "number") return v.is_number() ? "" : at + ": not a number";
  if (type == "boolean") return v.is_boolean() ? "" : at + ": not a boolean";
  if (type == "null") return v.is_null() ? "" : at + ": not null";
  return at + ": schema type the validator does not know";
}

struct Output {
  std::string text;
  std::string finish;
  std::vector<float> logprobs;
};

json ChatBody(const std::string& user, const json& extra) {
  json body = {{"model", "stories260K"},
               {"messages", {{{"role", "user"}, {"content", user}}}},
               {"max_tokens", 400},
               {"logprobs", true}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

Output Whole(services::HttpClient& c, const json& body) {
  const services::HttpResponse r = testing::Post(c, "/v1/chat/completions", body.dump());
  Output o;
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return o;
  const json j = testing::Json(r);
  const json& choice = j["choices"][0];
  o.text = choice["message"]["content"].is_string() ? choice["message"]["content"] : "";
  o.finish = choice["finish_reason"];
  for (const json& e : choice["logprobs"]["content"]) o.logprobs.push_back(e["logprob"]);
  return o;
}

Output Streamed(services::HttpClient& c, json body) {
  body["stream"] = true;
  const testing::SseStream s = testing::PostSse(c, "/v1/chat/completions", body.dump());
  Output o;
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  for (const json& ev : s.events) {
    for (const json& ch : ev["choices"]) {
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) {
        o.text += ch["delta"]["content"].get<std::string>();
      }
      if (ch["finish_reason"].is_string()) o.finish = ch["finish_reason"];
      if (ch["logprobs"].is_object()) {
        for (const json& e : ch["logprobs"]["content"]) o.logprobs.push_back(e["logprob"]);
      }
    }
  }
  return o;
}

// Every body sent at once, each on its own connection.
std::vector<Output> AllAtOnce(testing::Cluster& cluster, const std::vector<json>& bodies) {
  std::vector<Output> out(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = Whole(*cluster.Client(), bodies[i]); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

void ExpectSame(const Output& want, const Output& got, const std::string& what) {
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(got.finish, want.finish) << what;
  EXPECT_EQ(got.logprobs, want.logprobs) << what;
}

const char* kPrompts[] = {"Tell me about Lily.", "What colors do you like?",
                          "Ben had a dog named Max."};

TEST(StructuredOutputE2eTest, SchemasValidateStreamedAndNotWithSpeculationOnAndOff) {
  // [config][case] -> output
  std::vector<std::vector<Output>> outputs(2);
  int valid = 0;
  for (int spec = 0; spec < 2; ++spec) {
    SCOPED_TRACE(spec ? "speculation on" : "speculation off");
    testing::ClusterOptions co;
    co.ready = testing::ClusterOptions::Ready::kHttp;
    if (!spec) co.router_flags = {"--mask_threads=1"};
    if (spec) {
      // Masks side by side on 3 threads here, one after another without
      // speculation: the outputs compared below must not differ.
      co.router_flags = {"--spec_drafters=ngram,suffix", "--spec_adaptive=false",
                         "--spec_max_drafts=4", "--mask_threads=3"};
    }
    auto cluster = testing::StartCluster(co);
    ASSERT_NE(cluster, nullptr);
    auto client = cluster->Client();
    std::vector<json> bodies;
    for (size_t si = 0; si < Schemas().size(); ++si) {
      const json& schema = Schemas()[si];
      for (const char* prompt : kPrompts) {
        for (int sampled = 0; sampled < 2; ++sampled) {
          json extra = {{"response_format",
                         {{"type", "json_schema"},
                          {"json_schema", {{"name", "s"}, {"schema", schema}, {"strict", true}}}}}};
          if (sampled) {
            extra["temperature"] = 0.8;
            extra["seed"] = 7 + si;
          }
          const json body = ChatBody(prompt, extra);
          const std::string what =
              absl::StrCat("schema ", si, ", prompt '", prompt, "', sampled ", sampled);
          const Output whole = Whole(*client, body);
          const Output streamed = Streamed(*client, body);
          ExpectSame(whole, streamed, what + ": streamed vs whole");
          EXPECT_EQ(whole.finish, "stop") << what << ": " << whole.text;
          const json v = json::parse(whole.text, nullptr, false);
          ASSERT_FALSE(v.is_discarded()) << what << ": not JSON: " << whole.text;
          const std::string why = Validate(v, schema, schema, "$");
          EXPECT_EQ(why, "") << what << ": " << whole.text;
          valid += why.empty();
          outputs[spec].push_back(whole);
          bodies.push_back(body);
        }
      }
    }
    // All at once, each lane's masks beside the others': the same outputs
    // (batch invariance holds for constrained rows too).
    const std::vector<Output> together = AllAtOnce(*cluster, bodies);
    for (size_t i = 0; i < bodies.size(); ++i) {
      ExpectSame(outputs[spec][i], together[i], absl::StrCat("case ", i, ": concurrent vs solo"));
    }
    if (spec) {
      auto metrics = testing::GetOnce(cluster->http(), "/metrics");
      ASSERT_TRUE(metrics.ok());
      const double drafted = testing::Metric(metrics->body, "ringlane_spec_drafted_tokens_total");
      const double accepted = testing::Metric(metrics->body, "ringlane_spec_accepted_tokens_total");
      std::printf("structured output with speculation: drafted %.0f, accepted %.0f\n", drafted,
                  accepted);
      EXPECT_GT(drafted, 0) << "the grammar cut every draft: speculation was never tested";
      // Every choice, solo and concurrent, whole and streamed, was constrained.
      EXPECT_EQ(testing::Metric(metrics->body, "ringlane_constrained_choices_total"),
                3.0 * static_cast<double>(bodies.size()));
      EXPECT_GT(testing::Metric(metrics->body, "ringlane_grammar_mask_seconds_count"), 0);
    }
  }
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    ExpectSame(outputs[0][i], outputs[1][i], absl::StrCat("case ", i, ": speculation on vs off"));
  }
  std::printf("%d of %zu outputs valid\n", valid, outputs[0].size() * 2);
}

// A constrained lane preempted for KV blocks restarts with what it
// generated as prompt and its grammar where it was: the same outputs as
// one at a time.
TEST(StructuredOutputE2eTest, PreemptedConstrainedLanesGiveTheSoloOutput) {
  testing::ClusterOptions co;
  co.ready = testing::ClusterOptions::Ready::kHttp;
  co.worker_flags = {"--kv_blocks=30", "--block_size=16"};
  auto cluster = testing::StartCluster(co);
  ASSERT_NE(cluster, nullptr);
  std::vector<json> bodies;
  for (size_t si : {size_t{0}, size_t{2}, size_t{3}}) {
    for (const char* prompt : kPrompts) {
      for (int sampled = 0; sampled < 2; ++sampled) {
        json extra = {{"response_format",
                       {{"type", "json_schema"},
                        {"json_schema", {{"name", "s"}, {"schema", Schemas()[si]}}}}}};
        if (sampled) {
          extra["temperature"] = 0.8;
          extra["seed"] = 11;
        }
        bodies.push_back(ChatBody(prompt, extra));
      }
    }
  }
  std::vector<Output> solo;
  for (const json& b : bodies) solo.push_back(Whole(*cluster->Client(), b));
  const std::vector<Output> together = AllAtOnce(*cluster, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    ExpectSame(solo[i], together[i], absl::StrCat("case ", i, ": preempted vs solo"));
    EXPECT_EQ(solo[i].finish, "stop") << solo[i].text;
  }
  auto metrics = testing::GetOnce(cluster->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  const double preemptions = testing::Metric(metrics->body, "ringlane_preemptions_total");
  std::printf("constrained lanes: %.0f preemptions\n", preemptions);
  EXPECT_GT(preemptions, 0) << "the pool never ran short: preemption was not tested";
}

class StructuredOutputApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::ClusterOptions co;
    co.ready = testing::ClusterOptions::Ready::kHttp;
    cluster_ = testing::StartCluster(co).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static testing::Cluster* cluster_;
};

testing::Cluster* StructuredOutputApiTest::cluster_ = nullptr;

// Short: the bundled model's context is 512 tokens, and the tools are part
// of the prompt.
const json kWeatherTools = json::parse(R"([
  {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "time"}}])");

// Whether `text` is the start of some JSON text: nlohmann's parser fails
// only when it reads past the end.
bool IsJsonPrefix(const std::string& text) {
  struct Sax : json::json_sax_t {
    size_t error_at = 0;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(size_t position, const std::string&,
                     const nlohmann::detail::exception&) override {
      error_at = position;
      return false;
    }
  } sax;
  return json::sax_parse(text, &sax) || sax.error_at == text.size() + 1;
}

TEST_F(StructuredOutputApiTest, JsonObjectParses) {
  ASSERT_NE(cluster_, nullptr);
  auto c = cluster_->Client();
  // json_object leaves strings unbounded, and a 260K model often does not
  // close one: an output cut by max_tokens is a prefix of an object, one
  // that stops is an object.
  // The bias on the tokens of '"' and '}' lets some outputs close within
  // max_tokens (the grammar still decides where they may go).
  const services::HttpResponse tok =
      testing::Post(*c, "/tokenize",
                    R"({"model": "stories260K", "prompt": "a\"}", "add_special_tokens": false})");
  ASSERT_EQ(tok.status, 200) << tok.body;
  const json ids = testing::Json(tok)["tokens"];
  ASSERT_GE(ids.size(), 2u) << tok.body;
  json bias = json::object();
  for (size_t i = 1; i < ids.size(); ++i) {
    bias[std::to_string(ids[i].get<int>())] = i + 1 == ids.size() ? 10 : 4;
  }
  int stopped = 0;
  for (const char* prompt : kPrompts) {
    for (int seed = 0; seed < 4; ++seed) {
      json extra = {{"response_format", {{"type", "json_object"}}},
                    {"max_tokens", 120},
                    {"logit_bias", bias}};
      if (seed) {
        extra["temperature"] = 1.0;
        extra["seed"] = seed;
      }
      const Output o = Whole(*c, ChatBody(prompt, extra));
      SCOPED_TRACE(absl::StrCat("prompt '", prompt, "' seed ", seed, ": ", o.text));
      if (o.finish == "stop") {
        ++stopped;
        EXPECT_TRUE(json::parse(o.text, nullptr, false).is_object());
      } else {
        EXPECT_EQ(o.finish, "length");
        EXPECT_EQ(o.text.find_first_not_of(' '), o.text.find('{'));
        EXPECT_TRUE(IsJsonPrefix(o.text));
      }
    }
  }
  std::printf("json_object: %d of 12 outputs closed their object\n", stopped);
  EXPECT_GT(stopped, 0);
}

TEST_F(StructuredOutputApiTest, RequiredAndNamedToolChoiceGiveParsedCalls) {
  ASSERT_NE(cluster_, nullptr);
  auto c = cluster_->Client();
  // "required" allows one or more calls, which a small model need not stop
  // writing: parallel_tool_calls false makes it exactly one.
  for (const json& choice : {json("required"), json::parse(R"({"type": "function",
                                                  "function": {"name": "weather"}})")}) {
    for (bool stream : {false, true}) {
      json body = ChatBody(
          "What is the weather?",
          {{"tools", kWeatherTools}, {"tool_choice", choice}, {"parallel_tool_calls", false}});
      body.erase("max_tokens");  // what the context leaves
      body["stream"] = stream;
      std::vector<json> calls;
      std::string finish;
      if (!stream) {
        const services::HttpResponse r = testing::Post(*c, "/v1/chat/completions", body.dump());
        ASSERT_EQ(r.status, 200) << r.body;
        const json msg = testing::Json(r)["choices"][0]["message"];
        finish = testing::Json(r)["choices"][0]["finish_reason"];
        ASSERT_TRUE(msg.contains("tool_calls")) << msg.dump();
        for (const json& tc : msg["tool_calls"]) calls.push_back(tc);
      } else {
        const testing::SseStream s = testing::PostSse(*c, "/v1/chat/completions", body.dump());
        ASSERT_EQ(s.status, 200);
        for (const json& ev : s.events) {
          for (const json& ch : ev["choices"]) {
            if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
            if (!ch["delta"].contains("tool_calls")) continue;
            for (const json& d : ch["delta"]["tool_calls"]) {
              const size_t i = d["index"];
              if (calls.size() <= i) calls.resize(i + 1, json{{"function", {{"arguments", ""}}}});
              if (d.contains("id")) calls[i]["id"] = d["id"];
              if (d["function"].contains("name"))
                calls[i]["function"]["name"] = d["function"]["name"];
              if (d["function"].contains("arguments")) {
                calls[i]["function"]["arguments"] =
                    calls[i]["function"]["arguments"].get<std::string>() +
                    d["function"]["arguments"].get<std::string>();
              }
            }
          }
        }
      }
      SCOPED_TRACE(absl::StrCat(choice.dump(), stream ? " streamed" : " whole"));
      EXPECT_EQ(finish, "tool_calls");
      ASSERT_EQ(calls.size(), 1u);
      for (const json& tc : calls) {
        const std::string name = tc["function"]["name"];
        EXPECT_TRUE(name == "weather" || (choice == "required" && name == "time")) << name;
        const json args =
            json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
        ASSERT_TRUE(args.is_object()) << tc.dump();
        if (name == "weather") {
          const json& schema = kWeatherTools[0]["function"]["parameters"];
          EXPECT_EQ(Validate(args, schema, schema, "$"), "") << tc.dump();
        }
        EXPECT_TRUE(tc["id"].is_string());
      }
    }
  }
}

TEST_F(StructuredOutputApiTest, LogitBiasMovesGreedyOutput) {
  ASSERT_NE(cluster_, nullptr);
  auto c = cluster_->Client();
  json body = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}};
  const services::HttpResponse plain = testing::Post(*c, "/v1/completions", body.dump());
  ASSERT_EQ(plain.status, 200);
  // Token 65 of the bundled vocabulary is a byte token; +100 forces it.
  body["logit_bias"] = {{"65", 100}};
  const services::HttpResponse biased = testing::Post(*c, "/v1/completions", body.dump());
  ASSERT_EQ(biased.status, 200) << biased.body;
  EXPECT_NE(testing::Json(plain)["choices"][0]["text"],
            testing::Json(biased)["choices"][0]["text"]);
}

TEST_F(StructuredOutputApiTest, BadInputIs400NamingTheField) {
  ASSERT_NE(cluster_, nullptr);
  auto c = cluster_->Client();
  const struct {
    json extra;
    const char* param;
  } cases[] = {
      {{{"response_format", {{"type", "xml"}}}}, "response_format.type"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format.json_schema"},
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"name", "x"}, {"schema", {{"type", "integer"}, {"minimum", 3}}}}}}}},
       "response_format.json_schema.schema.minimum"},
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"name", "x"}, {"schema", {{"type", "strin"}}}}}}}},
       "response_format.json_schema.schema.type"},
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"name", "x"}, {"schema", {{"$ref", "#/$defs/missing"}}}}}}}},
       "response_format.json_schema.schema.$ref"},
      {{{"tools", kWeatherTools},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
       "tool_choice.function.name"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", kWeatherTools}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}},
       "tools[0].function.name"},
      {{{"tools", {{{"type", "retrieval"}}}}}, "tools[0].type"},
      {{{"logit_bias", {{"abc", 1}}}}, "logit_bias.abc"},
      {{{"logit_bias", {{"5", 101}}}}, "logit_bias.5"},
      {{{"logit_bias", {{"99999", 1}}}}, "sampling.logit_bias[99999]"},
      {{{"messages", {{{"role", "tool"}, {"content", "42"}}}}}, "messages[0].tool_call_id"},
      {{{"messages",
         {{{"role", "assistant"},
           {"tool_calls",
            {{{"id", "c1"},
              {"type", "function"},
              {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
      {{{"messages",
         {{{"role", "user"},
           {"content", "hi"},
           {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}}}},
       "messages[0].tool_calls"},
  };
  for (const auto& cs : cases) {
    const json body = ChatBody("hello", cs.extra);
    const services::HttpResponse r = testing::Post(*c, "/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 400) << cs.param << ": " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    const std::string message =
        j.contains("error") && j["error"]["message"].is_string() ? j["error"]["message"] : "";
    EXPECT_EQ(message.rfind(cs.param, 0), 0u) << cs.param << ": " << message;
    EXPECT_EQ(j.contains("error") ? j["error"]["param"] : json(), json(cs.param)) << r.body;
  }
  // The router still serves.
  EXPECT_EQ(Whole(*c, ChatBody("hello", {{"max_tokens", 3}})).finish, "length");
}

}  // namespace
}  // namespace ringlane
