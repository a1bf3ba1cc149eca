#ifndef RINGLANE_ROUTER_TOKENIZER_INCREMENTAL_DECODER_H_
#define RINGLANE_ROUTER_TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

// Turns a stream of generated token ids into text that is safe to send as
// it arrives: every returned piece is valid UTF-8, and a character whose
// bytes are spread over several tokens (byte-fallback "<0xE4>" pieces,
// byte-level tokens that split a code point) is held back until its last
// byte arrives. Rules that depend on position (the first token's
// dummy-prefix space, the space after llama2.c's BOS) are applied as
// Decode applies them, so for any id sequence that decodes to valid UTF-8
// the concatenation of Add() results and Flush() equals
// Decode(ids, skip_special_tokens). Ill-formed bytes become U+FFFD as soon as
// they are known to be ill-formed, one per maximal subpart.
//
// One instance per generated sequence (lane and choice), used by the thread
// that owns that sequence; not thread-safe. Borrows the tokenizer, which must
// outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Feeds one id; returns the text that became complete (possibly empty).
  // Returns InvalidArgument for an id outside the vocabulary, leaving the
  // decoder as it was.
  absl::StatusOr<std::string> Add(int32_t id);

  // Ends the sequence: returns the bytes still held back (an incomplete
  // character, as U+FFFD) and resets the decoder for a new sequence.
  std::string Flush();

  // Bytes held back waiting for the rest of a character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  DecodeState state_;
  // Undelivered bytes: a proper prefix of a well-formed UTF-8 character.
  std::string pending_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_INCREMENTAL_DECODER_H_
