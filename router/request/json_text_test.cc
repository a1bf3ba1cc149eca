#include "router/request/json_text.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request/errors.h"

namespace ringlane::router {
namespace {

using ::testing::HasSubstr;

TEST(JsonTextTest, MemberTextFindsTheLastMemberByItsUnescapedKey) {
  const std::string body =
      R"({ "a" : {"x": [1, "}\"]"]}, "b":"s\"}", "c" :-1.5e3 ,"t\u006fols": [ {"k":2} ], "a": true })";
  EXPECT_EQ(MemberText(body, "a"), "true");
  EXPECT_EQ(MemberText(body, "b"), R"("s\"}")");
  EXPECT_EQ(MemberText(body, "c"), "-1.5e3");
  EXPECT_EQ(MemberText(body, "tools"), R"([ {"k":2} ])");
  EXPECT_EQ(MemberText(body, "x"), std::nullopt);  // not a top-level member
  EXPECT_EQ(MemberText("[1]", "a"), std::nullopt);
  EXPECT_EQ(MemberText("{}", "a"), std::nullopt);
}

TEST(JsonTextTest, OrderedParseKeepsTheWrittenOrder) {
  absl::StatusOr<nlohmann::ordered_json> j =
      ParseOrderedJson(R"({"zeta":1,"alpha":{"m":1,"b":2}})", "f");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->dump(), R"({"zeta":1,"alpha":{"m":1,"b":2}})");
}

TEST(JsonTextTest, BadTextIsRefusedNamingTheField) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  std::string wide = "{";
  for (size_t i = 0; i <= kMaxEmbeddedJsonMembers; ++i) {
    absl::StrAppend(&wide, i ? "," : "", "\"k", i, "\":0");
  }
  wide += "}";
  // Repeated keys count once: the ordered parse's search is over distinct ones.
  std::string repeated = "{";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&repeated, i ? "," : "", "\"k", i % 4, "\":0");
  repeated += "}";
  EXPECT_TRUE(ParseOrderedJson(repeated, "f").ok());
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"{", "not valid JSON"}, {deep, "nested deeper"}, {wide, "members"}}) {
    absl::StatusOr<nlohmann::ordered_json> j = ParseOrderedJson(text, "tools");
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ParamOf(j.status()), "tools");
    EXPECT_THAT(j.status().message(), HasSubstr(why));
  }
}

}  // namespace
}  // namespace ringlane::router
