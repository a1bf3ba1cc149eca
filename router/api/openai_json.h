// JSON readers shared by the request parsers (openai_request.cc): a body
// checked against its nesting limit and parsed into an object, and fields
// read with their type checked. Every failure is InvalidArgument whose
// message starts with the field ("n: expected an integer, got string"), the
// shape ErrorFromStatus takes `param` from.
#ifndef RINGLANE_ROUTER_API_OPENAI_JSON_H_
#define RINGLANE_ROUTER_API_OPENAI_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_request.h"

namespace ringlane::router::openai::internal {

// InvalidArgument "field: why".
absl::Status Bad(std::string_view field, std::string_view why);
// "string", "integer", ... as a client would name the JSON type of `v`.
std::string TypeName(const nlohmann::json& v);
// "field: expected `want`, got <type of v>".
absl::Status WrongType(std::string_view field, std::string_view want, const nlohmann::json& v);

absl::StatusOr<double> Number(const nlohmann::json& v, std::string_view field);
// Integers within int64; a float with no fraction (1.0) counts, as in
// Python's pydantic coercion that OpenAI servers use.
absl::StatusOr<int64_t> Integer(const nlohmann::json& v, std::string_view field);
// An integer in [lo, hi].
absl::StatusOr<int32_t> Int32(const nlohmann::json& v, std::string_view field, int64_t lo,
                              int64_t hi);
absl::StatusOr<bool> Bool(const nlohmann::json& v, std::string_view field);
absl::StatusOr<std::string> String(const nlohmann::json& v, std::string_view field);

// `body` as a JSON object, refused before parsing when it nests deeper than
// limits.max_json_depth.
absl::StatusOr<nlohmann::json> ParseObject(std::string_view body, const RequestLimits& limits);

}  // namespace ringlane::router::openai::internal

#endif  // RINGLANE_ROUTER_API_OPENAI_JSON_H_
