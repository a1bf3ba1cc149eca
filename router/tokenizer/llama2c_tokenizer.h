#ifndef RINGLANE_ROUTER_TOKENIZER_LLAMA2C_TOKENIZER_H_
#define RINGLANE_ROUTER_TOKENIZER_LLAMA2C_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringlane::router {

// The SentencePiece-derived BPE tokenizer of karpathy/llama2.c, read from its
// `tokenizer.bin` export (e.g. deploy/models/stories260K/tok512.bin). Encode and
// decode reproduce run.c's encode()/decode() token for token and byte for byte,
// so prompts the router tokenizes feed the model exactly what run.c would.
//
// Immutable after Load(): every method is const and touches no mutable state,
// so one instance may be shared by any number of threads without locking
// (typically owned by the router through a unique_ptr and borrowed by request
// handlers and the scheduler).
//
// File format (native little-endian, as llama2.c's tokenizer.py writes it):
//   int32 max_token_length
//   repeated until EOF: float32 score, int32 len, len bytes of piece
// Token id = record index; the vocabulary size is the number of records.
class Llama2cTokenizer {
 public:
  // Fixed by the SentencePiece export llama2.c uses: <unk>, <s>, </s>, then
  // the 256 byte-fallback pieces <0x00>..<0xFF>.
  static constexpr int32_t kUnkId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kFirstByteId = 3;
  // Pieces needed for byte fallback to produce in-range ids.
  static constexpr int32_t kMinVocabSize = kFirstByteId + 256;

  // Reads and validates the whole file at `path`.
  // Returns NotFound if the file does not exist (other open/read failures map
  // from errno), and InvalidArgument naming the path and the defect if the
  // file is empty or shorter than its header, max_token_length is negative, a
  // record is truncated, a length is negative or runs past EOF, or there are
  // fewer than kMinVocabSize records.
  static absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> Load(const std::string& path);

  Llama2cTokenizer(const Llama2cTokenizer&) = delete;
  Llama2cTokenizer& operator=(const Llama2cTokenizer&) = delete;

  // Tokenizes `text` as run.c's encode(): optional BOS, a dummy-prefix " "
  // token when `text` is non-empty, one token per UTF-8 codepoint (or one
  // byte-fallback token per byte when the codepoint is not a piece), then
  // greedy merging of the adjacent pair with the highest-scoring
  // concatenation (leftmost on ties) until no pair merges; optional EOS last.
  // Every returned id is in [0, vocab_size()).
  //
  // Unlike run.c, which takes a C string, an embedded NUL byte is encoded like
  // any other byte instead of ending the text.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool add_eos = false) const;

  // The text run.c's decode() yields for `token` following `prev_token`: the
  // piece, minus one leading space when `prev_token` is BOS (SentencePiece
  // strips the dummy prefix), with "<0xHH>" pieces turned into that raw byte.
  // Pass a prev_token that is not an id (e.g. -1) when nothing precedes.
  // BOS/EOS decode to their literal pieces here; Decode() skips them.
  // The view stays valid for the tokenizer's lifetime. `token` outside
  // [0, vocab_size()) yields empty text (callers validate untrusted ids with
  // Decode() or vocab_size()).
  std::string_view DecodePiece(int32_t prev_token, int32_t token) const;

  // Concatenates DecodePiece over `ids`, each with the id before it as
  // prev_token (none for the first). BOS and EOS produce no text but still
  // count as the previous token, so a leading BOS strips the first piece's
  // space as run.c's output does.
  // Returns InvalidArgument naming the position if an id is out of range.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // True for the token that ends generation. llama2.c's models were trained
  // on stories that each start with BOS and never contain EOS, so a model
  // ends a story by predicting the next one's BOS; run.c's generate loop
  // stops on BOS (1) and never on EOS (2), and so do we.
  bool IsStop(int32_t id) const { return id == kBosId; }

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const { return kBosId; }
  int32_t eos_id() const { return kEosId; }
  // The header's max_token_length, in bytes. Informational: run.c sizes its
  // merge buffer with it; this implementation does not depend on it.
  int32_t max_token_length() const { return max_token_length_; }
  // Raw piece bytes and merge score of `id`; empty / 0 if out of range.
  std::string_view piece(int32_t id) const;
  float score(int32_t id) const;

 private:
  Llama2cTokenizer(int32_t max_token_length, std::vector<std::string> pieces,
                   std::vector<float> scores);

  // run.c's merge loop over `ids`: repeatedly replaces the adjacent pair whose
  // concatenated pieces form the highest-scoring piece (leftmost on ties).
  std::vector<int32_t> MergePairs(const std::vector<int32_t>& ids) const;

  // Id of `text` as a whole piece, or -1. With duplicate pieces (none in real
  // exports) the lowest id wins; run.c's bsearch picks an unspecified one.
  int32_t Lookup(std::string_view text) const;

  // All fields are set in the constructor and never change afterwards.
  const int32_t max_token_length_;
  const std::vector<std::string> pieces_;
  const std::vector<float> scores_;
  // Piece -> id. Keys view into pieces_, whose strings never move.
  std::unordered_map<std::string_view, int32_t> piece_to_id_;
  // Id of " " used as SentencePiece's dummy prefix, or -1 if the vocabulary
  // lacks it (run.c would then emit id -1; we fall back to the byte token).
  int32_t dummy_prefix_id_ = -1;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_LLAMA2C_TOKENIZER_H_
