// Error kinds that the status code alone does not tell apart, carried as a
// payload on the absl::Status so that the gateway chooses its HTTP status
// and OpenAI error type from a code, never from message text.
#ifndef RINGLANE_ROUTER_REQUEST_ERRORS_H_
#define RINGLANE_ROUTER_REQUEST_ERRORS_H_

#include <string>

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

// InvalidArgument naming the `model` field, of kind kModelNotFound.
absl::Status UnknownModelError(absl::string_view requested, absl::string_view served);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_ERRORS_H_
