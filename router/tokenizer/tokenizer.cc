#include "router/tokenizer/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "router/tokenizer/hf_tokenizer.h"
#include "router/tokenizer/sentencepiece_tokenizer.h"

namespace ringlane::router {
namespace {

namespace fs = std::filesystem;

class Llama2cAdapter final : public Tokenizer {
 public:
  explicit Llama2cAdapter(std::unique_ptr<Llama2cTokenizer> tok) : tok_(std::move(tok)) {
    for (int32_t id = 0; id < tok_->vocab_size(); ++id) ids_.emplace(tok_->piece(id), id);
  }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override {
    return tok_->Encode(text, add_special_tokens);
  }

  absl::Status DecodeToken(int32_t id, bool skip_special_tokens, DecodeState* state,
                           std::string* out) const override {
    if (id < 0 || id >= tok_->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", tok_->vocab_size(), ")"));
    }
    // BOS still counts as the previous token when skipped: run.c strips the
    // space of the piece after it either way.
    if (!(skip_special_tokens && IsSpecial(id))) {
      const std::string_view piece = tok_->DecodePiece(state->prev_id, id);
      out->append(piece);
      ++state->num_rendered;
      state->text_started = state->text_started || !piece.empty();
    }
    state->prev_id = id;
    return absl::OkStatus();
  }

  int32_t vocab_size() const override { return tok_->vocab_size(); }
  int32_t bos_id() const override { return tok_->bos_id(); }
  int32_t eos_id() const override { return tok_->eos_id(); }
  std::vector<int32_t> StopIds() const override { return {Llama2cTokenizer::kBosId}; }
  bool IsSpecial(int32_t id) const override {
    return id == Llama2cTokenizer::kBosId || id == Llama2cTokenizer::kEosId;
  }
  std::string_view IdToToken(int32_t id) const override { return tok_->piece(id); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  std::string_view format() const override { return "llama2c"; }

 private:
  const std::unique_ptr<Llama2cTokenizer> tok_;
  // Piece -> lowest id; keys view into tok_'s pieces.
  std::unordered_map<std::string_view, int32_t> ids_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2c(const std::string& path) {
  absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> tok = Llama2cTokenizer::Load(path);
  if (!tok.ok()) return tok.status();
  return WrapLlama2cTokenizer(std::move(*tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFile(const fs::path& file) {
  const std::string name = file.filename().string();
  if (absl::EndsWith(name, ".json")) {
    if (name == "tokenizer_config.json") {
      return absl::InvalidArgumentError(absl::StrCat(
          file.string(), " is a tokenizer_config.json; pass tokenizer.json or its directory"));
    }
    const fs::path config = file.parent_path() / "tokenizer_config.json";
    std::error_code ec;
    return HfTokenizer::Load(file.string(),
                             fs::is_regular_file(config, ec) ? config.string() : std::string());
  }
  if (absl::EndsWith(name, ".model")) return SentencePieceTokenizer::Load(file.string());
  if (absl::EndsWith(name, ".bin")) return LoadLlama2c(file.string());
  return absl::InvalidArgumentError(
      absl::StrCat("cannot tell the tokenizer format of ", file.string(),
                   ": expected a .json (Hugging Face), .model (SentencePiece) or .bin (llama2.c) "
                   "file, or a directory holding one"));
}

}  // namespace

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::string text;
  DecodeState state;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::Status status = DecodeToken(ids[i], skip_special_tokens, &state, &text);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("position ", i, ": ", status.message()));
    }
  }
  return text;
}

absl::StatusOr<std::string> Tokenizer::TokenBytes(int32_t id) const {
  // A state that is past the start and not after BOS, so no first-token or
  // after-BOS rule applies.
  DecodeState state;
  state.num_rendered = 1;
  state.text_started = true;
  state.leading_stripped = 1 << 30;
  std::string bytes;
  absl::Status status = DecodeToken(id, /*skip_special_tokens=*/false, &state, &bytes);
  if (!status.ok()) return status;
  return bytes;
}

std::unique_ptr<Tokenizer> WrapLlama2cTokenizer(std::unique_ptr<Llama2cTokenizer> tokenizer) {
  return std::make_unique<Llama2cAdapter>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot access tokenizer path ", path));
    }
    return absl::NotFoundError(absl::StrCat("tokenizer path ", path, " does not exist"));
  }
  if (!fs::is_directory(st)) return LoadFile(p);

  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin"}) {
    if (fs::is_regular_file(p / name, ec)) return LoadFile(p / name);
  }
  // Otherwise a llama2.c export (tok512.bin) or a SentencePiece model, whichever
  // kind is there, the export first: a llama2.c directory holds the .model only
  // as the source of its export, and run.c, the reference for those models,
  // reads the export. Several of one kind would make the choice a guess.
  std::vector<std::string> exports, models;
  for (const fs::directory_entry& entry : fs::directory_iterator(p, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec)) continue;
    if (absl::StartsWith(name, "tok") && absl::EndsWith(name, ".bin")) exports.push_back(name);
    if (absl::EndsWith(name, ".model")) models.push_back(name);
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list directory ", path));
  for (std::vector<std::string>* found : {&exports, &models}) {
    if (found->empty()) continue;
    if (found->size() == 1) return LoadFile(p / found->front());
    std::sort(found->begin(), found->end());
    return absl::InvalidArgumentError(
        absl::StrCat("directory ", path, " holds several candidate tokenizers (",
                     absl::StrJoin(*found, ", "), "); pass the file to use"));
  }
  return absl::NotFoundError(
      absl::StrCat("no tokenizer in directory ", path,
                   ": looked for tokenizer.json, tokenizer.model, tokenizer.bin, tok*.bin and "
                   "*.model"));
}

}  // namespace ringlane::router
