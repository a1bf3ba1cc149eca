#include "router/api/auth.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

using ::testing::HasSubstr;

absl::StatusCode Code(const ApiKeys& k, const std::string& header) {
  return k.Authenticate(&header).status().code();
}

TEST(ConstantTimeEqualsTest, EqualOnlyWhenEveryByteAndTheLengthAgree) {
  EXPECT_TRUE(ConstantTimeEquals("secret-1", "secret-1"));
  EXPECT_FALSE(ConstantTimeEquals("secret-2", "secret-1"));
  EXPECT_FALSE(ConstantTimeEquals("secret-1x", "secret-1"));
  EXPECT_FALSE(ConstantTimeEquals("secret-", "secret-1"));
  // A repetition of the key is no match, though every byte lines up with it.
  EXPECT_FALSE(ConstantTimeEquals("abab", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", ""));
}

TEST(ApiKeysTest, NoKeysLetsEveryoneInAsOneIdentity) {
  ApiKeys none;
  EXPECT_TRUE(none.empty());
  auto k = none.Authenticate(nullptr);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, "");
}

TEST(ApiKeysTest, BearerInAnyCaseWithTheRightKey) {
  ApiKeys keys({"secret-1", "secret-2"});
  for (const std::string h : {"Bearer secret-1", "bearer secret-1", "BEARER secret-1",
                              "bEaReR  secret-1", "Bearer\tsecret-1", "Bearer secret-1 "}) {
    auto k = keys.Authenticate(&h);
    ASSERT_TRUE(k.ok()) << h << ": " << k.status();
    EXPECT_EQ(*k, "secret-1") << h;
  }
  const std::string two = "Bearer secret-2";
  EXPECT_EQ(*keys.Authenticate(&two), "secret-2");
}

TEST(ApiKeysTest, MissingMalformedAndWrongAreUnauthenticated) {
  ApiKeys keys({"secret-1"});
  EXPECT_THAT(keys.Authenticate(nullptr).status().message(), HasSubstr("no API key"));
  EXPECT_EQ(Code(keys, ""), absl::StatusCode::kUnauthenticated);
  for (const std::string h :
       {"secret-1", "Basic secret-1", "Bearersecret-1", "Bearer", "Bearer ", "Bearer secret-",
        "Bearer secret-11", "Bearer Secret-1", "Bearer secret-1 secret-1", "Token secret-1"}) {
    EXPECT_EQ(Code(keys, h), absl::StatusCode::kUnauthenticated) << h;
  }
  const std::string wrong = "Bearer nope";
  EXPECT_EQ(keys.Authenticate(&wrong).status().message(), "invalid API key");
}

}  // namespace
}  // namespace ringlane::router
