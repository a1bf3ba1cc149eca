#include "services/flags_util.h"

#include <string>

#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

TEST(ValidatePortTest, Range) {
  for (int port : {0, 1, 80, 50051, 65535}) {
    EXPECT_TRUE(ValidatePort(port).ok()) << port;
  }
  for (int port : {-1, 65536, 100000, -65535}) {
    EXPECT_EQ(ValidatePort(port).code(), absl::StatusCode::kInvalidArgument) << port;
  }
}

TEST(ParseHostPortTest, Good) {
  struct Case {
    const char* input;
    const char* host;
    int port;
  };
  const Case cases[] = {
      {"127.0.0.1:50051", "127.0.0.1", 50051},
      {"localhost:0", "localhost", 0},
      {"worker-0.ringlane.svc:50061", "worker-0.ringlane.svc", 50061},
      {"[::1]:8080", "::1", 8080},
      {"[fe80::1%eth0]:1", "fe80::1%eth0", 1},
      {"0.0.0.0:65535", "0.0.0.0", 65535},
      {"h:007", "h", 7},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.input);
    absl::StatusOr<std::pair<std::string, int>> parsed = ParseHostPort(c.input);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->first, c.host);
    EXPECT_EQ(parsed->second, c.port);
  }
}

TEST(ParseHostPortTest, Bad) {
  const char* const cases[] = {
      "",                  // empty
      "localhost",         // no port
      "localhost:",        // empty port
      ":50051",            // empty host
      "host:http",         // not a number
      "host:-1",           // sign
      "host:+80",          // sign
      "host:65536",        // out of range
      "host:123456",       // too many digits
      "host:99999999999",  // would overflow int
      "host: 80",          // space
      " host:80",          // space
      "::1:80",            // IPv6 without brackets
      "[::1]",             // no port
      "[::1]80",           // no colon after bracket
      "[::1:80",           // unclosed bracket
      "[]:80",             // empty host
      "[host]:80",         // brackets around a non-IPv6 host
      "host:80:90",        // two colons
  };
  for (const char* input : cases) {
    SCOPED_TRACE(input);
    absl::StatusOr<std::pair<std::string, int>> parsed = ParseHostPort(input);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(parsed.status().message().empty());
  }
}

TEST(JoinHostPortTest, RoundTrips) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 50051), "127.0.0.1:50051");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  for (const char* s : {"127.0.0.1:1", "[::1]:80", "example.com:443"}) {
    absl::StatusOr<std::pair<std::string, int>> parsed = ParseHostPort(s);
    ASSERT_TRUE(parsed.ok()) << s;
    EXPECT_EQ(JoinHostPort(parsed->first, parsed->second), s);
  }
}

TEST(ExitWithUsageErrorTest, PrintsErrorAndExitsTwo) {
  EXPECT_EXIT(ExitWithUsageError("--port: out of range"), ::testing::ExitedWithCode(2),
              "error: --port: out of range");
}

}  // namespace
}  // namespace ringlane::services
