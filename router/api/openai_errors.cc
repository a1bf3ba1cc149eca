#include "router/api/openai_errors.h"

#include "nlohmann/json.hpp"
#include "router/request/errors.h"
#include "router/tokenizer/utf8.h"

namespace ringlane::router::openai {

using nlohmann::json;

std::string ValidUtf8(std::string_view bytes) { return utf8::ToValid(bytes); }

std::string ErrorJson(const ApiError& e) {
  json j = {{"error",
             {{"message", ValidUtf8(e.message)},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return j.dump();
}

ApiError ErrorFromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  e.param = ParamOf(status);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      if (KindOf(status) == ErrorKind::kModelNotFound) {
        e.status = 404;
        e.type = "not_found_error";
        e.code = "model_not_found";
      } else {
        e.status = 400;
      }
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout_error";
      break;
    case absl::StatusCode::kCancelled:
      e.status = 499;
      e.type = "cancelled";
      break;
    default:
      e.status = 500;
      e.type = "internal_error";
  }
  return e;
}

}  // namespace ringlane::router::openai
