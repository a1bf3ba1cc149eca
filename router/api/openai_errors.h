// OpenAI's error shape and the one table from absl::Status to HTTP status
// and OpenAI error type (STYLE.md "Map once"). The status and type come from
// the status code and the ErrorKind it carries (router/request/errors.h),
// never from its text.
#ifndef RINGLANE_ROUTER_API_OPENAI_ERRORS_H_
#define RINGLANE_ROUTER_API_OPENAI_ERRORS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ringlane::router::openai {

// An error as OpenAI returns it: {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
std::string ErrorJson(const ApiError& e);

// The HTTP status and error for a failure of the router or of parsing:
// InvalidArgument 400 (404 model_not_found for an unknown model),
// ResourceExhausted 429, Unavailable 503, Unauthenticated 401,
// PermissionDenied 403, NotFound 404, DeadlineExceeded 504, Cancelled 499,
// others 500. `param` is the field a message starts with ("max_tokens: ...").
ApiError ErrorFromStatus(const absl::Status& status);

// Text for JSON: invalid UTF-8 sequences replaced by U+FFFD (token bytes of
// byte-level vocabularies may be part of a character).
std::string ValidUtf8(std::string_view bytes);

}  // namespace ringlane::router::openai

#endif  // RINGLANE_ROUTER_API_OPENAI_ERRORS_H_
