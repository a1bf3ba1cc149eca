#include "router/api/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace ringlane::router {

bool ConstantTimeEquals(std::string_view presented, std::string_view expected) {
  // Every byte of `presented` is compared (against expected's bytes in turn)
  // and the lengths are folded in, so a mismatch leaves no early exit.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  if (expected.empty()) return false;
  for (size_t i = 0; i < presented.size(); ++i) {
    diff = diff | static_cast<unsigned char>(presented[i] ^ expected[i % expected.size()]);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ApiKeys::Authenticate(const std::string* authorization) const {
  if (keys_.empty()) return std::string();
  if (authorization == nullptr || authorization->empty()) {
    return absl::UnauthenticatedError("no API key: send it as 'Authorization: Bearer KEY'");
  }
  constexpr absl::string_view kScheme = "bearer";
  const absl::string_view v = *authorization;
  if (v.size() <= kScheme.size() || !absl::EqualsIgnoreCase(v.substr(0, kScheme.size()), kScheme) ||
      (v[kScheme.size()] != ' ' && v[kScheme.size()] != '\t')) {
    return absl::UnauthenticatedError("the Authorization header must be 'Bearer KEY'");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(v.substr(kScheme.size()));
  // Each key is compared, matched or not, so the time says nothing about
  // which one (or how many) came close.
  const std::string* match = nullptr;
  for (const std::string& k : keys_) {
    if (ConstantTimeEquals(std::string_view(key.data(), key.size()), k)) match = &k;
  }
  if (match == nullptr) return absl::UnauthenticatedError("invalid API key");
  return *match;
}

}  // namespace ringlane::router
