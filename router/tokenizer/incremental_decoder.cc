#include "router/tokenizer/incremental_decoder.h"

#include <utility>

#include "router/tokenizer/utf8.h"

namespace ringlane::router {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> IncrementalDecoder::Add(int32_t id) {
  // Decode into a copy of the state so that a bad id changes nothing.
  DecodeState state = state_;
  std::string bytes = pending_;
  absl::Status status = tokenizer_.DecodeToken(id, skip_special_tokens_, &state, &bytes);
  if (!status.ok()) return status;
  state_ = state;

  std::string ready;
  ready.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const utf8::Unit u = utf8::Scan(bytes, pos);
    if (u.kind == utf8::Unit::kIncomplete) break;  // The next token may finish it.
    if (u.kind == utf8::Unit::kChar) {
      ready.append(bytes, pos, u.length);
    } else {
      ready.append(utf8::kReplacementChar);
    }
    pos += u.length;
  }
  pending_ = bytes.substr(pos);
  return ready;
}

std::string IncrementalDecoder::Flush() {
  std::string rest = pending_.empty() ? std::string() : std::string(utf8::kReplacementChar);
  pending_.clear();
  state_ = DecodeState();
  return rest;
}

}  // namespace ringlane::router
