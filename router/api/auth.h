// API keys of the router's public APIs, checked the same way for the HTTP
// gateway (the Authorization header) and the gRPC Generate API (the
// `authorization` metadata): `Bearer KEY`, the scheme in any case (RFC 7235),
// the key compared in constant time against every accepted key.
#ifndef RINGLANE_ROUTER_API_AUTH_H_
#define RINGLANE_ROUTER_API_AUTH_H_

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::router {

// Immutable after construction; safe to share between threads.
class ApiKeys {
 public:
  ApiKeys() = default;
  explicit ApiKeys(const std::set<std::string>& keys) : keys_(keys.begin(), keys.end()) {}

  // No keys: every caller is let in and shares one identity ("").
  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

  // The key named by an Authorization value (nullptr: none was sent), or
  // Unauthenticated saying what is wrong, never which part of a key matched.
  absl::StatusOr<std::string> Authenticate(const std::string* authorization) const;

 private:
  std::vector<std::string> keys_;
};

// Equality whose running time depends only on the length of `presented`, not
// on where it first differs from `expected` nor on expected's length.
bool ConstantTimeEquals(std::string_view presented, std::string_view expected);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_API_AUTH_H_
