#ifndef RINGLANE_ROUTER_TOKENIZER_HF_TOKENIZER_H_
#define RINGLANE_ROUTER_TOKENIZER_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

// A Hugging Face `tokenizer.json` tokenizer with a BPE model, following the
// Rust `tokenizers` library:
//   encode: split the text on added tokens (leftmost-longest, honouring
//     lstrip/rstrip/single_word; non-normalized ones on the raw text,
//     normalized ones after normalizing), normalize, pre-tokenize, BPE each
//     word (merge by rank, leftmost on ties, cached per word), then the
//     post-processor's framing tokens;
//   decode: the decoder chain per token, so it can run incrementally.
// Supported components (anything else is an Unimplemented error naming it):
//   normalizer: Sequence, Prepend, Replace, Strip, and NFC/NFD/NFKC/NFKD and
//     Lowercase when built with ICU (RINGLANE_TOKENIZER_HAVE_ICU);
//   pre_tokenizer: Sequence, Split (Regex/String, every behavior, invert),
//     ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation;
//   model: BPE (byte_fallback, fuse_unk, ignore_merges, merges as "a b" or
//     [a, b]); dropout, continuing_subword_prefix and end_of_word_suffix are
//     not supported;
//   post_processor: TemplateProcessing, ByteLevel, RobertaProcessing,
//     BertProcessing, Sequence;
//   decoder: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
//     Strip (after Fuse: start only), or none (tokens joined by spaces).
// tokenizer_config.json, when given, supplies bos_token/eos_token and its
// add_bos_token/add_eos_token override whether the template adds them, as
// transformers' Llama tokenizers do. clean_up_tokenization_spaces is never
// applied (it is lossy and servers do not apply it when streaming).
//
// Thread-safe: immutable after loading except the per-word BPE cache, which
// locks itself.
class HfTokenizer final : public Tokenizer {
 public:
  // Reads `tokenizer_json_path` and, if `tokenizer_config_path` is not
  // empty, that tokenizer_config.json. NotFound if a file is missing;
  // InvalidArgument naming the file and the defect if it is not valid JSON
  // or the tokenizer is inconsistent (a merge of tokens not in the
  // vocabulary, a bad regex); Unimplemented naming the component type for
  // components listed above as unsupported.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(
      const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);

  // As Load, from the files' contents; `source` names them in errors.
  // `tokenizer_config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json,
      std::string_view source);

  ~HfTokenizer() override;

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override;
  absl::Status DecodeToken(int32_t id, bool skip_special_tokens, DecodeState* state,
                           std::string* out) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  std::vector<int32_t> StopIds() const override;
  bool IsSpecial(int32_t id) const override;
  std::string_view IdToToken(int32_t id) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::string_view format() const override { return "tokenizer.json"; }

  // The parsed tokenizer; defined and used only in hf_tokenizer.cc.
  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);

  const std::unique_ptr<Impl> impl_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_HF_TOKENIZER_H_
