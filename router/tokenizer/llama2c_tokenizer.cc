#include "router/tokenizer/llama2c_tokenizer.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "router/tokenizer/bpe.h"
#include "router/tokenizer/read_file.h"

namespace ringlane::router {
namespace {

// run.c starts its best-merge search at best_score = -1e10 and only accepts a
// strictly greater score, so merges scoring at or below this (or NaN) never
// happen.
constexpr float kMinMergeScore = -1e10f;

// Backing storage for the one-byte strings byte pieces decode to, so
// DecodePiece can hand out views without allocating.
constexpr std::array<char, 256> kAllBytes = [] {
  std::array<char, 256> bytes{};
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<char>(i);
  return bytes;
}();

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Returns the byte a "<0xHH>" byte-fallback piece stands for, or -1. run.c
// uses sscanf("<0x%02hhX>"), which also accepts lower-case digits; it would
// additionally accept malformed pieces such as "<0x4" that no SentencePiece
// export contains, and those we leave as literal text.
int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int hi = HexDigitValue(piece[3]);
  const int lo = HexDigitValue(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

absl::Status FileError(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("llama2.c tokenizer file ", path, ": ",
                                                 absl::string_view(what.data(), what.size())));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::Load(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadWholeFile(path, "llama2.c tokenizer file");
  if (!contents.ok()) return contents.status();
  const std::string_view data = *contents;

  if (data.empty()) return FileError(path, "file is empty");
  if (data.size() < sizeof(int32_t)) {
    return FileError(path,
                     absl::StrCat("file is ", data.size(),
                                  " bytes, too short for the 4-byte max_token_length header"));
  }
  int32_t max_token_length;
  std::memcpy(&max_token_length, data.data(), sizeof(max_token_length));
  if (max_token_length < 0) {
    return FileError(path, absl::StrCat("negative max_token_length ", max_token_length));
  }

  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t offset = sizeof(int32_t);
  while (offset < data.size()) {
    const size_t record = pieces.size();
    const size_t record_offset = offset;
    const auto where = [&] {
      return absl::StrCat("record ", record, " at byte offset ", record_offset);
    };
    constexpr size_t kRecordHeaderBytes = sizeof(float) + sizeof(int32_t);
    if (data.size() - offset < kRecordHeaderBytes) {
      return FileError(path, absl::StrCat(where(), " is truncated: ", data.size() - offset,
                                          " of its 8 score/length bytes present"));
    }
    float score;
    int32_t len;
    std::memcpy(&score, data.data() + offset, sizeof(score));
    std::memcpy(&len, data.data() + offset + sizeof(score), sizeof(len));
    offset += kRecordHeaderBytes;
    if (len < 0) {
      return FileError(path, absl::StrCat(where(), " has negative piece length ", len));
    }
    if (static_cast<size_t>(len) > data.size() - offset) {
      return FileError(path,
                       absl::StrCat(where(), " is truncated: piece length ", len, " but only ",
                                    data.size() - offset, " bytes left in the file"));
    }
    if (record >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return FileError(path, "more records than int32 token ids can address");
    }
    pieces.emplace_back(data.substr(offset, len));
    scores.push_back(score);
    offset += len;
  }
  if (pieces.size() < static_cast<size_t>(kMinVocabSize)) {
    // Byte fallback emits ids up to 3 + 255; a smaller vocabulary would make
    // Encode produce ids the model cannot embed.
    return FileError(path,
                     absl::StrCat("has ", pieces.size(),
                                  " vocabulary records; a llama2.c vocabulary needs at least ",
                                  kMinVocabSize, " (<unk>, <s>, </s> and 256 byte pieces)"));
  }
  return std::unique_ptr<Llama2cTokenizer>(
      new Llama2cTokenizer(max_token_length, std::move(pieces), std::move(scores)));
}

Llama2cTokenizer::Llama2cTokenizer(int32_t max_token_length, std::vector<std::string> pieces,
                                   std::vector<float> scores)
    : max_token_length_(max_token_length), pieces_(std::move(pieces)), scores_(std::move(scores)) {
  piece_to_id_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    // emplace keeps the first id of a duplicated piece.
    piece_to_id_.emplace(pieces_[id], static_cast<int32_t>(id));
  }
  dummy_prefix_id_ = Lookup(" ");
}

int32_t Llama2cTokenizer::Lookup(std::string_view text) const {
  const auto it = piece_to_id_.find(text);
  return it == piece_to_id_.end() ? -1 : it->second;
}

std::string_view Llama2cTokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

float Llama2cTokenizer::score(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return 0.0f;
  return scores_[id];
}

std::vector<int32_t> Llama2cTokenizer::Encode(std::string_view text, bool add_bos,
                                              bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 3);
  if (add_bos) ids.push_back(kBosId);
  // SentencePiece's add_dummy_prefix, which run.c applies only to non-empty
  // text.
  if (!text.empty()) {
    ids.push_back(dummy_prefix_id_ >= 0 ? dummy_prefix_id_
                                        : kFirstByteId + static_cast<unsigned char>(' '));
  }
  // run.c's codepoint split does not trust the lead byte: a unit is any byte
  // plus the continuation bytes after it, capped at 4 bytes, so stray or
  // excess continuation bytes start a unit of their own.
  for (size_t start = 0; start < text.size();) {
    size_t end = start + 1;
    while (end < text.size() && end - start < 4 && IsUtf8Continuation(text[end])) ++end;
    const std::string_view unit = text.substr(start, end - start);
    const int32_t id = Lookup(unit);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (char c : unit) ids.push_back(kFirstByteId + static_cast<unsigned char>(c));
    }
    start = end;
  }
  // run.c merges over the whole array, BOS included, and appends EOS after.
  ids = MergePairs(ids);
  if (add_eos) ids.push_back(kEosId);
  return ids;
}

// run.c merges the pair whose merged piece has the highest score, the
// leftmost on equal scores (it replaces its best only on a strictly greater
// score): priority = -score in the shared loop, which is exact for floats.
std::vector<int32_t> Llama2cTokenizer::MergePairs(const std::vector<int32_t>& ids) const {
  std::string concat;  // Reused to avoid an allocation per lookup.
  return MergeAdjacentPairs(ids, [&](int32_t l, int32_t r, double* priority, int32_t* merged) {
    // Concatenating the pieces (not the source text) is what run.c does, so
    // byte-fallback tokens only merge with pieces spelled "<0x..>".
    concat.assign(pieces_[l]);
    concat.append(pieces_[r]);
    const int32_t m = Lookup(concat);
    if (m < 0) return false;
    const float score = scores_[m];
    // NaN scores never merge, keeping the heap's order strict.
    if (!(score > kMinMergeScore)) return false;
    *priority = -static_cast<double>(score);
    *merged = m;
    return true;
  });
}

std::string_view Llama2cTokenizer::DecodePiece(int32_t prev_token, int32_t token) const {
  if (token < 0 || token >= vocab_size()) return {};
  std::string_view text = pieces_[token];
  // Same order as run.c: strip the space, then recognise a byte piece.
  if (prev_token == kBosId && !text.empty() && text.front() == ' ') text.remove_prefix(1);
  const int byte = ParseBytePiece(text);
  if (byte >= 0) return std::string_view(&kAllBytes[byte], 1);
  return text;
}

absl::StatusOr<std::string> Llama2cTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  int32_t prev = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size(), ")"));
    }
    // BOS/EOS delimit sequences; run.c never prints them.
    if (id != kBosId && id != kEosId) text.append(DecodePiece(prev, id));
    prev = id;
  }
  return text;
}

}  // namespace ringlane::router
