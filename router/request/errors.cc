#include "router/request/errors.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ringlane::router {

namespace {
constexpr absl::string_view kModelNotFound = "model_not_found";
}  // namespace

absl::Status WithKind(absl::Status status, ErrorKind kind) {
  if (kind == ErrorKind::kModelNotFound) {
    status.SetPayload(kErrorKindPayload, absl::Cord(kModelNotFound));
  }
  return status;
}

ErrorKind KindOf(const absl::Status& status) {
  auto p = status.GetPayload(kErrorKindPayload);
  if (p && *p == kModelNotFound) return ErrorKind::kModelNotFound;
  return ErrorKind::kNone;
}

absl::Status UnknownModelError(absl::string_view requested, absl::string_view served) {
  return WithKind(absl::InvalidArgumentError(absl::StrCat("model: unknown model '", requested,
                                                          "'; this router serves '", served, "'")),
                  ErrorKind::kModelNotFound);
}

}  // namespace ringlane::router
