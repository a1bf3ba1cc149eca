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

absl::Status FieldError(std::string_view field, std::string_view why) {
  return WithParam(
      absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", std::string(why))), field);
}

absl::Status WithParam(absl::Status status, std::string_view field) {
  if (!status.ok() && !field.empty()) {
    status.SetPayload(kErrorParamPayload, absl::Cord(std::string(field)));
  }
  return status;
}

std::string ParamOf(const absl::Status& status) {
  auto p = status.GetPayload(kErrorParamPayload);
  return p ? std::string(*p) : std::string();
}

absl::Status UnknownModelError(absl::string_view requested, absl::string_view served) {
  return WithKind(FieldError("model", absl::StrCat("unknown model '", requested,
                                                   "'; this router serves '", served, "'")),
                  ErrorKind::kModelNotFound);
}

}  // namespace ringlane::router
