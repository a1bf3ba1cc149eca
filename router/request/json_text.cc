#include "router/request/json_text.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "router/request/errors.h"

namespace ringlane::router {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

// The end of the string that starts at s[i] == '"' (one past its quote).
size_t StringEnd(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return s.size();
}

// The end of the value that starts at s[i] (valid JSON text assumed).
size_t ValueEnd(std::string_view s, size_t i) {
  if (i >= s.size()) return s.size();
  if (s[i] == '"') return StringEnd(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '"') {
        i = StringEnd(s, i) - 1;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return i + 1;
      }
    }
    return s.size();
  }
  while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && !IsSpace(s[i])) ++i;
  return i;
}

}  // namespace

absl::Status CheckJsonNesting(std::string_view text, int max_depth, std::string_view field) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return FieldError(field, absl::StrCat("JSON nested deeper than ", max_depth,
                                              " levels (at byte ", i, ")"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text,
                                                        std::string_view field) {
  if (absl::Status st = CheckJsonNesting(text, kMaxEmbeddedJsonDepth, field); !st.ok()) return st;
  // The sorted parse is O(n log n) whatever the keys; its sizes bound the
  // ordered parse's searches.
  const nlohmann::json plain = nlohmann::json::parse(text, nullptr, false);
  if (plain.is_discarded()) return FieldError(field, "not valid JSON");
  std::vector<const nlohmann::json*> todo{&plain};
  while (!todo.empty()) {
    const nlohmann::json* v = todo.back();
    todo.pop_back();
    if (v->is_object() && v->size() > kMaxEmbeddedJsonMembers) {
      return FieldError(field, absl::StrCat("an object has ", v->size(), " members; at most ",
                                            kMaxEmbeddedJsonMembers));
    }
    if (v->is_structured()) {
      for (const nlohmann::json& c : *v) todo.push_back(&c);
    }
  }
  nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(text, nullptr, false);
  if (ordered.is_discarded()) return FieldError(field, "not valid JSON");
  return ordered;
}

std::optional<std::string_view> MemberText(std::string_view s, std::string_view key) {
  std::optional<std::string_view> found;
  size_t i = SkipSpace(s, 0);
  if (i >= s.size() || s[i] != '{') return found;
  i = SkipSpace(s, i + 1);
  while (i < s.size() && s[i] == '"') {
    const size_t key_end = StringEnd(s, i);
    const std::string_view raw_key = s.substr(i, key_end - i);
    bool match = raw_key.size() == key.size() + 2 && raw_key.substr(1, key.size()) == key;
    if (!match && raw_key.find('\\') != std::string_view::npos) {
      const nlohmann::json k = nlohmann::json::parse(raw_key, nullptr, false);
      match = k.is_string() && k.get_ref<const std::string&>() == key;
    }
    i = SkipSpace(s, key_end);
    if (i >= s.size() || s[i] != ':') return found;
    i = SkipSpace(s, i + 1);
    const size_t value_end = ValueEnd(s, i);
    if (match) found = s.substr(i, value_end - i);
    i = SkipSpace(s, value_end);
    if (i >= s.size() || s[i] != ',') break;
    i = SkipSpace(s, i + 1);
  }
  return found;
}

}  // namespace ringlane::router
