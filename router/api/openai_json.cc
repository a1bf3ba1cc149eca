#include "router/api/openai_json.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "router/request/errors.h"
#include "router/request/json_text.h"

namespace ringlane::router::openai {

using nlohmann::json;

absl::Status CheckJsonDepth(std::string_view body, int max_depth) {
  return CheckJsonNesting(body, max_depth, "body");
}

namespace internal {

absl::Status Bad(std::string_view field, std::string_view why) { return FieldError(field, why); }

std::string TypeName(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

absl::Status WrongType(std::string_view field, std::string_view want, const json& v) {
  return Bad(field, absl::StrCat("expected ", std::string(want), ", got ", TypeName(v)));
}

absl::StatusOr<double> Number(const json& v, std::string_view field) {
  if (!v.is_number()) return WrongType(field, "a number", v);
  return v.get<double>();
}

absl::StatusOr<int64_t> Integer(const json& v, std::string_view field) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(field, "out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // Range first: converting a double outside int64 (1e300) is undefined.
    if (std::abs(d) < 9e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  return WrongType(field, "an integer", v);
}

absl::StatusOr<int32_t> Int32(const json& v, std::string_view field, int64_t lo, int64_t hi) {
  absl::StatusOr<int64_t> i = Integer(v, field);
  if (!i.ok()) return i.status();
  if (*i < lo || *i > hi) {
    return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", *i));
  }
  return static_cast<int32_t>(*i);
}

absl::StatusOr<bool> Bool(const json& v, std::string_view field) {
  if (!v.is_boolean()) return WrongType(field, "a boolean", v);
  return v.get<bool>();
}

absl::StatusOr<std::string> String(const json& v, std::string_view field) {
  if (!v.is_string()) return WrongType(field, "a string", v);
  return v.get<std::string>();
}

absl::StatusOr<json> ParseObject(std::string_view body, const RequestLimits& limits) {
  // nlohmann parses, copies and destroys recursively: a body of 150,000
  // nested brackets, far under the body limit, overflows the stack. The scan
  // is linear and refuses such a body before the parser sees it.
  if (absl::Status st = CheckJsonDepth(body, limits.max_json_depth); !st.ok()) return st;
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again for the reason (the position of the first error).
    std::string why = "not valid JSON";
    try {
      const json again = json::parse(body.begin(), body.end());
      static_cast<void>(again);
    } catch (const json::exception& e) {  // out_of_range too: "1e400" overflows a double
      why = absl::StrCat("not valid JSON (", e.what(), ")");
    }
    return FieldError("body", why);
  }
  if (!j.is_object()) return WrongType("body", "a JSON object", j);
  return j;
}

}  // namespace internal
}  // namespace ringlane::router::openai
