// What the status code alone does not say about an error, carried as
// payloads on the absl::Status so that the gateway chooses its HTTP status,
// OpenAI error type and `param` from codes, never from message text: the
// error's kind, and the request field it is about.
#ifndef RINGLANE_ROUTER_REQUEST_ERRORS_H_
#define RINGLANE_ROUTER_REQUEST_ERRORS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ringlane::router {

enum class ErrorKind {
  kNone,
  // The request named a model this router does not serve (HTTP 404).
  kModelNotFound,
};

inline constexpr absl::string_view kErrorKindPayload = "type.ringlane.dev/error_kind";

// `status` with `kind` attached.
absl::Status WithKind(absl::Status status, ErrorKind kind);
// The kind attached to `status`, kNone when there is none.
ErrorKind KindOf(const absl::Status& status);

inline constexpr absl::string_view kErrorParamPayload = "type.ringlane.dev/error_param";

// InvalidArgument "field: why", naming `field` (a request field such as
// "max_tokens" or "messages[1].content") as the error's param.
absl::Status FieldError(std::string_view field, std::string_view why);
// `status` naming `field` as its param.
absl::Status WithParam(absl::Status status, std::string_view field);
// The field `status` names, "" when it names none.
std::string ParamOf(const absl::Status& status);

// InvalidArgument naming the `model` field, of kind kModelNotFound.
absl::Status UnknownModelError(absl::string_view requested, absl::string_view served);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_ERRORS_H_
