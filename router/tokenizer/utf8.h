#ifndef RINGLANE_ROUTER_TOKENIZER_UTF8_H_
#define RINGLANE_ROUTER_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

// UTF-8 helpers the tokenizers share. Stateless; safe from any thread.
namespace ringlane::router::utf8 {

// What starts at a byte offset of a UTF-8 string.
struct Unit {
  enum Kind {
    // A well-formed character of `length` bytes.
    kChar,
    // Ill-formed: `length` is the maximal subpart (the bytes that started a
    // sequence before it went wrong, at least 1), which a decoder replaces
    // with one U+FFFD as the Unicode standard recommends.
    kInvalid,
    // A well-formed prefix of a character that the string ends in the middle
    // of; `length` covers the rest of the string.
    kIncomplete,
  };
  Kind kind;
  size_t length;
  // The code point for kChar, U+FFFD otherwise.
  char32_t code_point;
};

// Classifies the unit starting at text[pos]. Requires pos < text.size().
// Overlong forms, surrogates and values above U+10FFFF are kInvalid.
Unit Scan(std::string_view text, size_t pos);

// Offset of the first byte that is not part of a well-formed character, or
// text.size() if `text` is valid UTF-8.
size_t FirstInvalid(std::string_view text);

// `text` with every ill-formed or incomplete unit replaced by U+FFFD.
std::string ToValid(std::string_view text);

// Appends `cp` encoded as UTF-8 (U+FFFD for surrogates and out-of-range
// values).
void Append(char32_t cp, std::string* out);

// The Unicode White_Space property, which Rust's char::is_whitespace (and so
// Hugging Face tokenizers' lstrip/rstrip and Strip) uses.
bool IsWhitespace(char32_t cp);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace ringlane::router::utf8

#endif  // RINGLANE_ROUTER_TOKENIZER_UTF8_H_
