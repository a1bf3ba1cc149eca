#include "router/tokenizer/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/tokenizer/read_file.h"
#include "router/tokenizer/utf8.h"

namespace ringlane::router {
namespace {

// Field numbers of sentencepiece_model.proto (sentencepiece.ModelProto and
// its sub-messages). Only what encoding and decoding need is read.
constexpr uint32_t kModelPieces = 1;
constexpr uint32_t kModelTrainerSpec = 2;
constexpr uint32_t kModelNormalizerSpec = 3;
constexpr uint32_t kPiecePiece = 1;
constexpr uint32_t kPieceScore = 2;
constexpr uint32_t kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3;
constexpr uint32_t kTrainerTreatWhitespaceAsSuffix = 24;
constexpr uint32_t kTrainerByteFallback = 35;
constexpr uint32_t kTrainerUnkId = 40;
constexpr uint32_t kTrainerBosId = 41;
constexpr uint32_t kTrainerEosId = 42;
constexpr uint32_t kNormalizerName = 1;
constexpr uint32_t kNormalizerPrecompiledCharsmap = 2;
constexpr uint32_t kNormalizerAddDummyPrefix = 3;
constexpr uint32_t kNormalizerRemoveExtraWhitespaces = 4;
constexpr uint32_t kNormalizerEscapeWhitespaces = 5;

// TrainerSpec.ModelType.
constexpr uint64_t kModelTypeBpe = 2;

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 "▁"

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads protobuf wire format from a byte range. Every read is bounds-checked;
// errors name the byte offset within the whole file.
class WireReader {
 public:
  WireReader(std::string_view data, size_t base) : data_(data), base_(base) {}

  bool done() const { return pos_ >= data_.size(); }

  absl::Status Key(uint32_t* field, uint32_t* wire) {
    uint64_t key = 0;
    absl::Status s = Varint(&key);
    if (!s.ok()) return s;
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<uint32_t>(key & 7);
    if (*field == 0) return Error("field number 0");
    return absl::OkStatus();
  }

  absl::Status Varint(uint64_t* value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Error("truncated varint");
      const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *value = v;
        return absl::OkStatus();
      }
    }
    return Error("varint longer than 10 bytes");
  }

  absl::Status Bytes(std::string_view* value, size_t* offset) {
    uint64_t len = 0;
    absl::Status s = Varint(&len);
    if (!s.ok()) return s;
    if (len > data_.size() - pos_) {
      return Error(absl::StrCat("length ", len, " runs past the end of its message"));
    }
    *offset = base_ + pos_;
    *value = data_.substr(pos_, len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status Fixed32(uint32_t* value) {
    if (data_.size() - pos_ < 4) return Error("truncated fixed32");
    std::memcpy(value, data_.data() + pos_, 4);  // Little-endian on our targets.
    pos_ += 4;
    return absl::OkStatus();
  }

  absl::Status Skip(uint32_t wire) {
    uint64_t v;
    std::string_view bytes;
    size_t offset;
    switch (wire) {
      case kVarint:
        return Varint(&v);
      case kFixed64:
        if (data_.size() - pos_ < 8) return Error("truncated fixed64");
        pos_ += 8;
        return absl::OkStatus();
      case kLengthDelimited:
        return Bytes(&bytes, &offset);
      case kFixed32:
        if (data_.size() - pos_ < 4) return Error("truncated fixed32");
        pos_ += 4;
        return absl::OkStatus();
      default:
        return Error(absl::StrCat("unsupported wire type ", wire));
    }
  }

  // Checks that a known field arrived with the wire type its schema says.
  absl::Status Expect(uint32_t field, uint32_t wire, uint32_t want) {
    if (wire == want) return absl::OkStatus();
    return Error(absl::StrCat("field ", field, " has wire type ", wire, ", expected ", want));
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", base_ + pos_));
  }

  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
};

struct RawPiece {
  std::string piece;
  float score = 0;
  uint64_t type = 1;
};

struct RawModel {
  std::vector<RawPiece> pieces;
  uint64_t model_type = 1;  // proto default: UNIGRAM
  bool treat_whitespace_as_suffix = false;
  bool byte_fallback = false;
  int32_t unk_id = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  std::string normalizer_name;
  bool has_charsmap = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

absl::Status ParsePiece(std::string_view data, size_t base, RawPiece* p) {
  WireReader r(data, base);
  while (!r.done()) {
    uint32_t field, wire;
    absl::Status s = r.Key(&field, &wire);
    if (!s.ok()) return s;
    if (field == kPiecePiece) {
      std::string_view v;
      size_t offset;
      s = r.Expect(field, wire, kLengthDelimited);
      if (s.ok()) s = r.Bytes(&v, &offset);
      p->piece.assign(v);
    } else if (field == kPieceScore) {
      uint32_t bits = 0;
      s = r.Expect(field, wire, kFixed32);
      if (s.ok()) s = r.Fixed32(&bits);
      std::memcpy(&p->score, &bits, sizeof(bits));
    } else if (field == kPieceType) {
      s = r.Expect(field, wire, kVarint);
      if (s.ok()) s = r.Varint(&p->type);
    } else {
      s = r.Skip(wire);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Reads a varint-encoded int32 (negative values arrive sign-extended to 64
// bits).
absl::Status Int32(WireReader& r, uint32_t field, uint32_t wire, int32_t* out) {
  absl::Status s = r.Expect(field, wire, kVarint);
  uint64_t v = 0;
  if (s.ok()) s = r.Varint(&v);
  *out = static_cast<int32_t>(static_cast<int64_t>(v));
  return s;
}

absl::Status Bool(WireReader& r, uint32_t field, uint32_t wire, bool* out) {
  absl::Status s = r.Expect(field, wire, kVarint);
  uint64_t v = 0;
  if (s.ok()) s = r.Varint(&v);
  *out = v != 0;
  return s;
}

absl::Status ParseTrainerSpec(std::string_view data, size_t base, RawModel* m) {
  WireReader r(data, base);
  while (!r.done()) {
    uint32_t field, wire;
    absl::Status s = r.Key(&field, &wire);
    if (!s.ok()) return s;
    switch (field) {
      case kTrainerModelType:
        s = r.Expect(field, wire, kVarint);
        if (s.ok()) s = r.Varint(&m->model_type);
        break;
      case kTrainerTreatWhitespaceAsSuffix:
        s = Bool(r, field, wire, &m->treat_whitespace_as_suffix);
        break;
      case kTrainerByteFallback:
        s = Bool(r, field, wire, &m->byte_fallback);
        break;
      case kTrainerUnkId:
        s = Int32(r, field, wire, &m->unk_id);
        break;
      case kTrainerBosId:
        s = Int32(r, field, wire, &m->bos_id);
        break;
      case kTrainerEosId:
        s = Int32(r, field, wire, &m->eos_id);
        break;
      default:
        s = r.Skip(wire);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizerSpec(std::string_view data, size_t base, RawModel* m) {
  WireReader r(data, base);
  while (!r.done()) {
    uint32_t field, wire;
    absl::Status s = r.Key(&field, &wire);
    if (!s.ok()) return s;
    std::string_view bytes;
    size_t offset;
    switch (field) {
      case kNormalizerName:
        s = r.Expect(field, wire, kLengthDelimited);
        if (s.ok()) s = r.Bytes(&bytes, &offset);
        m->normalizer_name.assign(bytes);
        break;
      case kNormalizerPrecompiledCharsmap:
        s = r.Expect(field, wire, kLengthDelimited);
        if (s.ok()) s = r.Bytes(&bytes, &offset);
        m->has_charsmap = !bytes.empty();
        break;
      case kNormalizerAddDummyPrefix:
        s = Bool(r, field, wire, &m->add_dummy_prefix);
        break;
      case kNormalizerRemoveExtraWhitespaces:
        s = Bool(r, field, wire, &m->remove_extra_whitespaces);
        break;
      case kNormalizerEscapeWhitespaces:
        s = Bool(r, field, wire, &m->escape_whitespaces);
        break;
      default:
        s = r.Skip(wire);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseModel(std::string_view data, RawModel* m) {
  WireReader r(data, 0);
  while (!r.done()) {
    uint32_t field, wire;
    absl::Status s = r.Key(&field, &wire);
    if (!s.ok()) return s;
    if (field == kModelPieces || field == kModelTrainerSpec || field == kModelNormalizerSpec) {
      std::string_view sub;
      size_t offset;
      s = r.Expect(field, wire, kLengthDelimited);
      if (s.ok()) s = r.Bytes(&sub, &offset);
      if (s.ok()) {
        if (field == kModelPieces) {
          m->pieces.emplace_back();
          s = ParsePiece(sub, offset, &m->pieces.back());
        } else if (field == kModelTrainerSpec) {
          s = ParseTrainerSpec(sub, offset, m);
        } else {
          s = ParseNormalizerSpec(sub, offset, m);
        }
      }
    } else {
      s = r.Skip(wire);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xHH>" piece stands for, or -1.
int BytePieceValue(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int hi = HexDigit(piece[3]);
  const int lo = HexDigit(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

const char* ModelTypeName(uint64_t type) {
  switch (type) {
    case 1:
      return "UNIGRAM";
    case 2:
      return "BPE";
    case 3:
      return "WORD";
    case 4:
      return "CHAR";
    default:
      return "unknown";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  absl::StatusOr<std::string> data = ReadWholeFile(path, "SentencePiece model");
  if (!data.ok()) return data.status();
  return FromSerialized(*data, path);
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromSerialized(
    std::string_view model_proto, std::string_view source) {
  const std::string src(source);
  const auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece model ", src, ": ", what));
  };
  const auto unsupported = [&](absl::string_view what) {
    return absl::UnimplementedError(absl::StrCat("SentencePiece model ", src, ": ", what));
  };
  RawModel m;
  absl::Status s = ParseModel(model_proto, &m);
  if (!s.ok()) return invalid(s.message());
  if (m.pieces.empty()) return invalid("has no pieces (is it a SentencePiece model?)");
  if (m.pieces.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid("more pieces than int32 ids can address");
  }
  if (m.model_type != kModelTypeBpe) {
    return unsupported(absl::StrCat("model type ", ModelTypeName(m.model_type), " (", m.model_type,
                                    ") is not supported; only BPE is"));
  }
  if (m.has_charsmap) {
    return unsupported(absl::StrCat("normalization rule \"", m.normalizer_name,
                                    "\" uses a precompiled charsmap, which is not supported"));
  }
  if (m.treat_whitespace_as_suffix) return unsupported("treat_whitespace_as_suffix");

  auto tok = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
  tok->source_ = std::string(source);
  const int32_t size = static_cast<int32_t>(m.pieces.size());
  tok->byte_ids_.fill(-1);
  for (int32_t id = 0; id < size; ++id) {
    RawPiece& p = m.pieces[id];
    if (p.type < 1 || p.type > 6) {
      return invalid(absl::StrCat("piece ", id, " has unknown type ", p.type));
    }
    if (p.piece.empty()) return invalid(absl::StrCat("piece ", id, " is empty"));
    const auto type = static_cast<PieceType>(p.type);
    tok->byte_of_.push_back(-1);
    if (type == PieceType::kByte) {
      const int byte = BytePieceValue(p.piece);
      if (byte < 0) {
        return invalid(absl::StrCat("byte piece ", id, " is \"", p.piece, "\", not <0xHH>"));
      }
      tok->byte_ids_[byte] = id;
      tok->byte_of_.back() = static_cast<int16_t>(byte);
    }
    // The first of duplicated pieces wins, as in SentencePiece's own map.
    tok->piece_ids_.emplace(p.piece, id);
    tok->pieces_.push_back(std::move(p.piece));
    tok->scores_.push_back(p.score);
    tok->types_.push_back(type);
    if (type == PieceType::kUserDefined) {
      tok->user_defined_[static_cast<unsigned char>(tok->pieces_.back()[0])].push_back(id);
    }
  }
  const auto check_id = [&](const char* what, int32_t id, int32_t* out) -> absl::Status {
    if (id >= size) {
      return invalid(absl::StrCat(what, " ", id, " is outside the ", size, " pieces"));
    }
    *out = id < 0 ? -1 : id;
    return absl::OkStatus();
  };
  s = check_id("unk_id", m.unk_id, &tok->unk_id_);
  if (s.ok()) s = check_id("bos_id", m.bos_id, &tok->bos_id_);
  if (s.ok()) s = check_id("eos_id", m.eos_id, &tok->eos_id_);
  if (!s.ok()) return s;
  if (tok->unk_id_ < 0) return invalid("has no unk piece (unk_id < 0)");
  tok->byte_fallback_ = m.byte_fallback;
  tok->add_dummy_prefix_ = m.add_dummy_prefix;
  tok->remove_extra_whitespaces_ = m.remove_extra_whitespaces;
  tok->escape_whitespaces_ = m.escape_whitespaces;
  for (std::vector<int32_t>& list : tok->user_defined_) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return tok->pieces_[a].size() > tok->pieces_[b].size();
    });
  }

  // SentencePiece merges two symbols when their concatenation is a piece, so
  // every split of a piece into two pieces is a merge at that piece's score.
  const auto mergeable = [&](int32_t id) {
    const PieceType t = tok->types_[id];
    return t == PieceType::kNormal || t == PieceType::kUserDefined || t == PieceType::kUnused;
  };
  for (int32_t id = 0; id < size; ++id) {
    if (!mergeable(id)) continue;
    const std::string& piece = tok->pieces_[id];
    for (size_t cut = utf8::Scan(piece, 0).length; cut < piece.size();
         cut += utf8::Scan(piece, cut).length) {
      const auto l = tok->piece_ids_.find(piece.substr(0, cut));
      const auto r = tok->piece_ids_.find(piece.substr(cut));
      if (l == tok->piece_ids_.end() || r == tok->piece_ids_.end() || !mergeable(l->second) ||
          !mergeable(r->second)) {
        continue;
      }
      tok->merges_.Add(l->second, r->second, -static_cast<double>(tok->scores_[id]), id);
      if (tok->types_[id] == PieceType::kUnused) {
        tok->unused_splits_.emplace(id, std::make_pair(l->second, r->second));
      }
    }
  }
  return tok;
}

std::string SentencePieceTokenizer::Normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size() + 8);
  if (remove_extra_whitespaces_) {
    // Leading and trailing spaces go, inner runs become one space.
    bool pending_space = false;
    for (char c : text) {
      if (c == ' ') {
        pending_space = true;
        continue;
      }
      if (pending_space && !out.empty()) out.push_back(' ');
      pending_space = false;
      out.push_back(c);
    }
  } else {
    out.assign(text);
  }
  if (out.empty()) return out;
  std::string escaped;
  escaped.reserve(out.size() + 16);
  if (add_dummy_prefix_) escaped.append(escape_whitespaces_ ? kSpaceSymbol : " ");
  if (!escape_whitespaces_) return escaped.append(out);
  for (char c : out) {
    if (c == ' ') {
      escaped.append(kSpaceSymbol);
    } else {
      escaped.push_back(c);
    }
  }
  return escaped;
}

void SentencePieceTokenizer::AppendResegmented(int32_t id, std::vector<int32_t>* ids) const {
  if (types_[id] == PieceType::kUnused) {
    const auto it = unused_splits_.find(id);
    if (it != unused_splits_.end()) {
      AppendResegmented(it->second.first, ids);
      AppendResegmented(it->second.second, ids);
      return;
    }
  }
  ids->push_back(id);
}

void SentencePieceTokenizer::EncodeRun(std::string_view run, std::vector<int32_t>* ids) const {
  // Characters that are not pieces become negative placeholders (which never
  // merge) indexing `unknown`.
  std::vector<int32_t> symbols;
  std::vector<std::string_view> unknown;
  symbols.reserve(run.size());
  for (size_t pos = 0; pos < run.size();) {
    const utf8::Unit u = utf8::Scan(run, pos);
    // An ill-formed byte is a character of its own, so byte fallback
    // reproduces the input exactly.
    const size_t len = u.kind == utf8::Unit::kChar ? u.length : 1;
    const std::string_view ch = run.substr(pos, len);
    pos += len;
    const auto it = piece_ids_.find(std::string(ch));
    const bool usable = it != piece_ids_.end() && (types_[it->second] == PieceType::kNormal ||
                                                   types_[it->second] == PieceType::kUserDefined ||
                                                   types_[it->second] == PieceType::kUnused);
    if (usable) {
      symbols.push_back(it->second);
    } else {
      unknown.push_back(ch);
      symbols.push_back(-static_cast<int32_t>(unknown.size()));
    }
  }
  bool last_unk = false;
  for (int32_t s : merges_.Apply(symbols)) {
    if (s >= 0) {
      AppendResegmented(s, ids);
      last_unk = false;
      continue;
    }
    const std::string_view ch = unknown[-s - 1];
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) ids->push_back(byte_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
      continue;
    }
    // SentencePiece reports a run of unknown characters as one unk.
    if (!last_unk) ids->push_back(unk_id_);
    last_unk = true;
  }
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(std::string_view text,
                                                                    bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens && bos_id_ >= 0) ids.push_back(bos_id_);
  const std::string norm = Normalize(text);
  size_t run_start = 0;
  for (size_t pos = 0; pos < norm.size();) {
    int32_t hit = -1;
    for (int32_t id : user_defined_[static_cast<unsigned char>(norm[pos])]) {
      if (norm.compare(pos, pieces_[id].size(), pieces_[id]) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      const utf8::Unit u = utf8::Scan(norm, pos);
      pos += u.kind == utf8::Unit::kChar ? u.length : 1;
      continue;
    }
    EncodeRun(std::string_view(norm).substr(run_start, pos - run_start), &ids);
    ids.push_back(hit);
    pos += pieces_[hit].size();
    run_start = pos;
  }
  EncodeRun(std::string_view(norm).substr(run_start), &ids);
  return ids;
}

absl::Status SentencePieceTokenizer::DecodeToken(int32_t id, bool skip_special_tokens,
                                                 DecodeState* state, std::string* out) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is outside the vocabulary [0, ", vocab_size(), ") of ", source_));
  }
  state->prev_id = id;
  const PieceType type = types_[id];
  if (type == PieceType::kControl) {
    // Control pieces never take part in the dummy-prefix rule, rendered or not.
    if (!skip_special_tokens) {
      out->append(pieces_[id]);
      state->text_started = true;
    }
    return absl::OkStatus();
  }
  if (type == PieceType::kByte) {
    out->push_back(static_cast<char>(byte_of_[id]));
    state->text_started = true;
    ++state->num_rendered;
    return absl::OkStatus();
  }
  std::string_view piece = pieces_[id];
  std::string text;
  if (escape_whitespaces_) {
    for (size_t pos = 0; pos < piece.size();) {
      if (piece.compare(pos, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
        text.push_back(' ');
        pos += kSpaceSymbol.size();
      } else {
        text.push_back(piece[pos++]);
      }
    }
  } else {
    text.assign(piece);
  }
  // The first rendered piece carries the dummy prefix.
  if (add_dummy_prefix_ && state->num_rendered == 0 && !text.empty() && text[0] == ' ') {
    text.erase(0, 1);
  }
  out->append(text);
  state->text_started = state->text_started || !text.empty();
  ++state->num_rendered;
  return absl::OkStatus();
}

std::vector<int32_t> SentencePieceTokenizer::StopIds() const {
  if (eos_id_ < 0) return {};
  return {eos_id_};
}

bool SentencePieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && types_[id] == PieceType::kControl;
}

std::string_view SentencePieceTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

std::optional<int32_t> SentencePieceTokenizer::TokenToId(std::string_view token) const {
  const auto it = piece_ids_.find(std::string(token));
  if (it == piece_ids_.end()) return std::nullopt;
  return it->second;
}

}  // namespace ringlane::router
