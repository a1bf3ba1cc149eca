// JSON text that arrives inside a request (a tool list, a JSON schema) read
// safely and in order: nlohmann recurses per nesting level, so depth is
// checked before parsing, and nlohmann::ordered_json finds a duplicate key
// by a linear search, so the members of one object are bounded before an
// ordered parse could take quadratic time.
#ifndef RINGLANE_ROUTER_REQUEST_JSON_TEXT_H_
#define RINGLANE_ROUTER_REQUEST_JSON_TEXT_H_

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {

// Nesting of arrays and objects a request's embedded JSON may have, and
// the distinct members one of its objects may have.
inline constexpr int kMaxEmbeddedJsonDepth = 64;
inline constexpr size_t kMaxEmbeddedJsonMembers = 256;

// InvalidArgument naming `field` when `text` nests arrays/objects deeper
// than `max_depth` (a linear scan; unbalanced text is the parser's to
// report).
absl::Status CheckJsonNesting(std::string_view text, int max_depth, std::string_view field);

// `text` parsed keeping every object's members in the order written (JSON
// schemas emit properties in declaration order). InvalidArgument naming
// `field` for invalid JSON, nesting deeper than kMaxEmbeddedJsonDepth, or
// an object of more than kMaxEmbeddedJsonMembers distinct members.
absl::StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text,
                                                        std::string_view field);

// For `object_text`, valid JSON text of an object: the text of the value of
// its member `key` (the last one, as nlohmann keeps when a key repeats),
// keys compared after unescaping. nullopt when there is none.
std::optional<std::string_view> MemberText(std::string_view object_text, std::string_view key);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_JSON_TEXT_H_
