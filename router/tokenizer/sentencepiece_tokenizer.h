#ifndef RINGLANE_ROUTER_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define RINGLANE_ROUTER_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/tokenizer/bpe.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

// A SentencePiece BPE model read straight from its `tokenizer.model` file, a
// serialized sentencepiece.ModelProto, with a protobuf wire-format reader of
// our own (Debian's libsentencepiece cannot share a process with our gRPC;
// see BUILD-NOTES.md).
//
// Encode follows SentencePiece's BPE: normalize (drop leading, trailing and
// repeated spaces when remove_extra_whitespaces, prepend the dummy-prefix
// space when add_dummy_prefix, spaces -> "▁"), split into characters with
// user-defined pieces kept whole, merge the adjacent pair whose concatenation
// is the highest-scoring piece (leftmost on ties), then map characters that
// are not pieces to byte pieces (byte_fallback) or unk. Decode maps "▁" back
// to spaces, byte pieces to their bytes, drops the space of the first
// rendered piece (the dummy prefix), and renders unk as its piece ("<unk>").
//
// Unsupported, reported as Unimplemented by Load: Unigram/word/char models,
// normalization rules with a precompiled charsmap (nmt_nfkc and friends;
// "identity" models such as Llama's have none), treat_whitespace_as_suffix.
// An UNUSED piece produced by merging is split back into two pieces along
// the first split of it into pieces, where SentencePiece uses the pair that
// produced it.
//
// Immutable after loading; safe to share between threads.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Piece types of sentencepiece_model.proto.
  enum class PieceType : uint8_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };

  // Reads the model at `path`. NotFound if missing; InvalidArgument naming
  // the path and the defect for a malformed protobuf (truncated varint or
  // field, wrong wire type, no pieces, bad special ids); Unimplemented as
  // described above.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);
  // As Load, from the file's bytes; `source` names them in errors.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromSerialized(
      std::string_view model_proto, std::string_view source);

  // add_special_tokens adds BOS (when the model has one), as Llama's
  // tokenizer does; never EOS. Invalid UTF-8 is accepted: each ill-formed
  // byte is a character of its own, which byte fallback keeps intact.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override;
  absl::Status DecodeToken(int32_t id, bool skip_special_tokens, DecodeState* state,
                           std::string* out) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  std::vector<int32_t> StopIds() const override;
  bool IsSpecial(int32_t id) const override;
  std::string_view IdToToken(int32_t id) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::string_view format() const override { return "sentencepiece"; }

  PieceType piece_type(int32_t id) const { return types_[id]; }
  float score(int32_t id) const { return scores_[id]; }
  int32_t unk_id() const { return unk_id_; }
  bool add_dummy_prefix() const { return add_dummy_prefix_; }
  bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  SentencePieceTokenizer() = default;

  // Applies the normalizer spec; returns text with "▁" for spaces.
  std::string Normalize(std::string_view text) const;
  // Encodes a run of text holding no user-defined piece.
  void EncodeRun(std::string_view run, std::vector<int32_t>* ids) const;
  // Appends `id`, splitting UNUSED pieces back into pieces.
  void AppendResegmented(int32_t id, std::vector<int32_t>* ids) const;

  // All fields are set while loading and never change afterwards.
  std::string source_;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<PieceType> types_;
  std::unordered_map<std::string, int32_t> piece_ids_;
  // Merges into NORMAL, USER_DEFINED and UNUSED pieces, by negated score.
  BpeMerges merges_;
  // UNUSED piece -> its first split into two pieces.
  std::unordered_map<int32_t, std::pair<int32_t, int32_t>> unused_splits_;
  // USER_DEFINED pieces by first byte, longest first, matched whole in the
  // input.
  std::array<std::vector<int32_t>, 256> user_defined_;
  std::array<int32_t, 256> byte_ids_{};
  // Id -> the byte of a BYTE piece, -1 for other pieces.
  std::vector<int16_t> byte_of_;
  int32_t unk_id_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool byte_fallback_ = false;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
