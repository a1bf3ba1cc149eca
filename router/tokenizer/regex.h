#ifndef RINGLANE_ROUTER_TOKENIZER_REGEX_H_
#define RINGLANE_ROUTER_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringlane::router {

// A compiled PCRE2 pattern for the tokenizer.json pre-tokenizers,
// normalizers and decoders: UTF-8 with Unicode properties (PCRE2_UTF |
// PCRE2_UCP), JIT-compiled where PCRE2 supports it. Hugging Face compiles
// these patterns with Oniguruma; the constructs real tokenizers use
// (\p{L}, \p{N}, \s, look-ahead, (?i:...), possessive and bounded
// repetition) mean the same in PCRE2.
//
// Immutable after Compile; FindAll allocates its own match state, so one
// Regex may be used from any number of threads.
class Regex {
 public:
  // Compiles `pattern`; with `literal` it matches the pattern's text exactly
  // (tokenizer.json's {"String": ...} patterns). Returns InvalidArgument with
  // PCRE2's message and offset if the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of the successive non-overlapping,
  // non-empty matches in `text`, which must be valid UTF-8 (callers check
  // once; PCRE2 would otherwise rescan the whole subject on every call).
  // Returns ResourceExhausted if PCRE2 runs out of its match or depth limits
  // (pathological input), Internal for other match errors.
  absl::Status FindAll(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>* matches) const;

  // `text` with every match replaced by `replacement` (inserted literally).
  absl::StatusOr<std::string> ReplaceAll(std::string_view text, std::string_view replacement) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}

  const std::string pattern_;
  // pcre2_code_8*; kept opaque so that pcre2.h stays out of this header.
  void* const code_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_REGEX_H_
