#include "router/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace ringlane::router {
namespace {

pcre2_code* Code(void* code) { return static_cast<pcre2_code*>(code); }

std::string ErrorText(int error) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", error);
  return std::string(reinterpret_cast<const char*>(buffer), n);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2 rejects PCRE2_UCP together with PCRE2_LITERAL; a literal has no
  // character classes for it to affect anyway.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("regex /", std::string(pattern),
                                                   "/ does not compile: ", ErrorText(error),
                                                   " at offset ", offset));
  }
  // JIT is an optimisation: without it (unsupported CPU, no executable
  // memory) pcre2_match falls back to the interpreter.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

absl::Status Regex::FindAll(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>* matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(Code(code_), nullptr));
  if (data == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Hugging Face drops empty matches; PCRE2_NOTEMPTY makes the engine look
  // for a non-empty alternative instead of stopping at an empty one.
  const uint32_t options = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
  size_t start = 0;
  while (start < text.size()) {
    int rc = pcre2_match(Code(code_), subject, text.size(), start, options, data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's default 32 KiB stack is small for patterns such as
      // \s+(?!\S) on long whitespace runs; the interpreter keeps its
      // backtracking state on the heap.
      rc = pcre2_match(Code(code_), subject, text.size(), start, options | PCRE2_NO_JIT, data.get(),
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
        rc == PCRE2_ERROR_HEAPLIMIT) {
      return absl::ResourceExhaustedError(
          absl::StrCat("regex /", pattern_, "/ at byte ", start, " of the text: ", ErrorText(rc)));
    }
    if (rc < 0) {
      return absl::InternalError(
          absl::StrCat("regex /", pattern_, "/ failed at byte ", start, ": ", ErrorText(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    // PCRE2_NOTEMPTY rules out empty matches, but a look-behind could still
    // report one ending before `start`; never loop on it.
    if (end <= start) break;
    matches->emplace_back(begin, end);
    start = end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Regex::ReplaceAll(std::string_view text,
                                              std::string_view replacement) const {
  std::vector<std::pair<size_t, size_t>> matches;
  absl::Status status = FindAll(text, &matches);
  if (!status.ok()) return status;
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text.substr(pos, begin - pos));
    out.append(replacement);
    pos = end;
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace ringlane::router
