#ifndef RINGLANE_ROUTER_TOKENIZER_TOKENIZER_H_
#define RINGLANE_ROUTER_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "router/tokenizer/llama2c_tokenizer.h"

namespace ringlane::router {

// What a decoder needs to know about the tokens before the one it renders.
// Some formats render a token differently at the start of the text (the
// SentencePiece dummy-prefix space is dropped there) or after BOS (llama2.c).
// Start every sequence with a default-constructed state and pass the same
// object to DecodeToken for each id in order.
struct DecodeState {
  // The id before the current one, rendered or skipped; -1 at the start.
  int32_t prev_id = -1;
  // Tokens rendered so far; skipped special tokens do not count.
  int32_t num_rendered = 0;
  // Characters a whole-text Strip decoder (tokenizer.json: Strip after Fuse)
  // has removed from the start so far.
  int32_t leading_stripped = 0;
  // Whether any byte of text has been produced yet.
  bool text_started = false;
};

// A text <-> token id mapping for one model: llama2.c tokenizer.bin, Hugging
// Face tokenizer.json or SentencePiece tokenizer.model (see LoadTokenizer).
//
// Implementations are immutable after loading apart from internal caches
// that lock themselves, so every method may be called from any number of
// threads at once. The router owns one per model (unique_ptr) and lends it
// to request handlers and the scheduler.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Tokenizes `text`. With `add_special_tokens` the model's framing tokens are
  // added around it the way its reference library adds them by default: BOS
  // for llama2.c and SentencePiece models, the post-processor template (and
  // tokenizer_config.json's add_bos_token/add_eos_token) for tokenizer.json.
  // Special tokens spelled out in `text` (e.g. "<|eot_id|>") are recognised
  // for tokenizer.json, as Hugging Face does; llama2.c and SentencePiece never
  // match control tokens in text.
  // Returns InvalidArgument if a format that needs valid UTF-8 gets invalid
  // UTF-8 (naming the byte offset), ResourceExhausted if a pre-tokenizer
  // regex hits PCRE2's match limits.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_special_tokens) const = 0;

  // Appends the bytes token `id` contributes to decoded text, given the
  // tokens before it as recorded in `state`, and advances `state`. Special
  // tokens (IsSpecial) produce nothing when `skip_special_tokens` and their
  // literal text otherwise. The bytes may be part of a UTF-8 character that
  // later tokens complete (byte-fallback and byte-level tokens), or not valid
  // UTF-8 at all if the ids are not a sensible sequence; IncrementalDecoder
  // deals with both.
  // Returns InvalidArgument if `id` is not a token id of this vocabulary.
  virtual absl::Status DecodeToken(int32_t id, bool skip_special_tokens, DecodeState* state,
                                   std::string* out) const = 0;

  // DecodeToken over all of `ids` from a fresh state: the raw bytes, which
  // are valid UTF-8 whenever the ids are (they are for any output of
  // Encode). Returns InvalidArgument naming the position of a bad id.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = true) const;

  // The bytes `id` contributes in the middle of a text (not first, not after
  // BOS), special tokens as their literal text; e.g. for logprob displays.
  absl::StatusOr<std::string> TokenBytes(int32_t id) const;

  // Ids are in [0, vocab_size()); a vocabulary may leave some unused.
  virtual int32_t vocab_size() const = 0;
  // -1 when the format does not define one.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Ids whose sampling ends generation by default (llama2.c: BOS; others:
  // EOS when known). Callers add model-specific ones (generation_config).
  virtual std::vector<int32_t> StopIds() const = 0;
  // Control tokens that Decode drops when asked to skip special tokens.
  virtual bool IsSpecial(int32_t id) const = 0;
  // The token's string as the vocabulary stores it ("Ġthe", "▁the",
  // "<0x0A>", "<|eot_id|>"); empty for ids not in the vocabulary, and for a
  // llama2.c vocabulary's zero-length pieces (which decode to nothing).
  virtual std::string_view IdToToken(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // "llama2c", "tokenizer.json" or "sentencepiece", for logs and errors.
  virtual std::string_view format() const = 0;
};

// Loads the tokenizer at `path`, choosing the format from it:
//   a directory: tokenizer.json (with tokenizer_config.json beside it when
//     present), else tokenizer.model, else tokenizer.bin, else its only
//     tok*.bin, else its only *.model (so the bundled stories260K directory
//     loads tok512.bin, which run.c uses, not tok512.model);
//   a file: *.json -> tokenizer.json, *.model -> SentencePiece,
//     *.bin -> llama2.c.
// Returns NotFound if `path` or a tokenizer inside the directory does not
// exist, InvalidArgument naming the file and the defect if it cannot be
// parsed or its format cannot be told from its name, and Unimplemented
// naming the feature for valid tokenizers that use something this code does
// not implement (e.g. SentencePiece Unigram, an NFKC normalizer without ICU).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

// Presents a llama2.c tokenizer through the common interface, reproducing
// run.c: Encode adds BOS (never EOS) with add_special_tokens, DecodeToken is
// Llama2cTokenizer::DecodePiece (the space after BOS is dropped), BOS/EOS are
// the special tokens, and BOS is the stop token.
std::unique_ptr<Tokenizer> WrapLlama2cTokenizer(std::unique_ptr<Llama2cTokenizer> tokenizer);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_TOKENIZER_H_
