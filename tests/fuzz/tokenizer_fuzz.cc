// Tokenizer encode and decode (router/tokenizer/) over arbitrary text and id
// sequences, for every format the router loads: the bundled model's llama2.c
// tokenizer (deploy/models/stories260K/tok512.bin) and its SentencePiece
// model (tok512.model), and the tokenizer.json fixtures that copy the layouts
// of Llama 3, GPT-2, Qwen2, Llama 2 and Mistral (router/tokenizer/testdata/;
// no tokenizer.json ships under shared/models). What must hold, as
// tokenizer.h and incremental_decoder.h promise: no crash, no undefined
// behaviour; Encode's ids are in the vocabulary and, for valid UTF-8 text,
// decode to valid UTF-8; IncrementalDecoder hands out valid UTF-8 only, and
// its pieces add up to Decode's text whenever that is valid UTF-8.
//
// Input: byte 0 = tokenizer, byte 1 = flags (bit 0: decode ids instead of
// encoding text; bit 1: add_special_tokens / skip_special_tokens), then the
// text, or the ids as 16-bit little-endian values (some past the vocabulary,
// to exercise the range checks).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "router/tokenizer/incremental_decoder.h"
#include "router/tokenizer/tokenizer.h"
#include "router/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ringlane::router::IncrementalDecoder;
using ringlane::router::Tokenizer;
namespace utf8 = ringlane::router::utf8;

const std::vector<std::unique_ptr<Tokenizer>>& Tokenizers() {
  static const auto* all = [] {
    const std::string src = RINGLANE_SOURCE_DIR;
    const std::string testdata = src + "/router/tokenizer/testdata/";
    auto* v = new std::vector<std::unique_ptr<Tokenizer>>;
    for (const std::string& path :
         {src + "/deploy/models/stories260K/tok512.bin",
          src + "/deploy/models/stories260K/tok512.model", testdata + "byte_level",
          testdata + "gpt2", testdata + "qwen2", testdata + "sp_bpe", testdata + "metaspace"}) {
      absl::StatusOr<std::unique_ptr<Tokenizer>> t = ringlane::router::LoadTokenizer(path);
      FUZZ_CHECK(t.ok(), "cannot load %s: %s", path.c_str(), t.status().ToString().c_str());
      v->push_back(std::move(*t));
    }
    return v;
  }();
  return *all;
}

bool ValidUtf8(std::string_view s) { return utf8::FirstInvalid(s) == s.size(); }

// Feeds `ids` through an IncrementalDecoder; returns the ids it accepted and
// checks every piece.
std::vector<int32_t> DecodeIncrementally(const Tokenizer& t, const std::vector<int32_t>& ids,
                                         bool skip_special, std::string* text) {
  IncrementalDecoder decoder(t, skip_special);
  std::vector<int32_t> accepted;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = decoder.Add(id);
    // A vocabulary may leave ids unused (tokenizer.h); those have no token.
    const bool in_vocab = id >= 0 && id < t.vocab_size() && !t.IdToToken(id).empty();
    FUZZ_CHECK(piece.ok() == in_vocab, "%s: Add(%d) with vocab %d gave %s",
               std::string(t.format()).c_str(), id, t.vocab_size(),
               piece.status().ToString().c_str());
    if (!piece.ok()) continue;
    FUZZ_CHECK(ValidUtf8(*piece), "%s: Add(%d) gave invalid UTF-8", std::string(t.format()).c_str(),
               id);
    FUZZ_CHECK(decoder.pending_bytes() <= 3, "%zu bytes held back", decoder.pending_bytes());
    text->append(*piece);
    accepted.push_back(id);
  }
  const std::string rest = decoder.Flush();
  FUZZ_CHECK(ValidUtf8(rest), "Flush gave invalid UTF-8");
  text->append(rest);
  return accepted;
}

void CheckDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  std::string incremental;
  const std::vector<int32_t> accepted = DecodeIncrementally(t, ids, skip_special, &incremental);
  absl::StatusOr<std::string> whole = t.Decode(accepted, skip_special);
  FUZZ_CHECK(whole.ok(), "Decode of in-vocabulary ids failed: %s",
             whole.status().ToString().c_str());
  if (ValidUtf8(*whole)) {
    FUZZ_CHECK(incremental == *whole, "%s: incremental text differs from Decode's",
               std::string(t.format()).c_str());
  }
  if (accepted.size() != ids.size()) {
    absl::StatusOr<std::string> bad = t.Decode(ids, skip_special);
    FUZZ_CHECK(!bad.ok() && bad.status().code() == absl::StatusCode::kInvalidArgument,
               "Decode accepted an id outside the vocabulary");
  }
  for (int32_t id : accepted) {
    absl::StatusOr<std::string> bytes = t.TokenBytes(id);
    FUZZ_CHECK(bytes.ok(), "TokenBytes(%d): %s", id, bytes.status().ToString().c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& all = Tokenizers();
  ringlane::fuzz::ByteReader in(data, size);
  const Tokenizer& t = *all[in.Byte() % all.size()];
  const uint8_t flags = in.Byte();
  const bool special = (flags & 2) != 0;
  if ((flags & 1) != 0) {
    std::vector<int32_t> ids;
    // Ids up to 1/16 past the vocabulary, and a few negative ones.
    const int32_t span = t.vocab_size() + t.vocab_size() / 16 + 2;
    while (!in.empty() && ids.size() < 512) {
      ids.push_back(static_cast<int32_t>(in.U16() % span) - 1);
    }
    CheckDecode(t, ids, special);
    return 0;
  }
  const std::string_view text = in.Rest();
  absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text, special);
  if (!ids.ok()) {
    const absl::StatusCode code = ids.status().code();
    FUZZ_CHECK(
        code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted,
        "%s: Encode failed with %s", std::string(t.format()).c_str(),
        ids.status().ToString().c_str());
    FUZZ_CHECK(code != absl::StatusCode::kInvalidArgument || !ValidUtf8(text),
               "%s: Encode refused valid UTF-8: %s", std::string(t.format()).c_str(),
               ids.status().ToString().c_str());
    return 0;
  }
  for (int32_t id : *ids) {
    FUZZ_CHECK(id >= 0 && id < t.vocab_size(), "%s: Encode gave id %d, vocab %d",
               std::string(t.format()).c_str(), id, t.vocab_size());
  }
  absl::StatusOr<std::string> back = t.Decode(*ids, /*skip_special_tokens=*/false);
  FUZZ_CHECK(back.ok(), "Decode of Encode's ids failed: %s", back.status().ToString().c_str());
  if (ValidUtf8(text)) {
    FUZZ_CHECK(ValidUtf8(*back), "%s: valid text encodes to ids that decode to invalid UTF-8",
               std::string(t.format()).c_str());
  }
  CheckDecode(t, *ids, /*skip_special=*/!special);
  return 0;
}
