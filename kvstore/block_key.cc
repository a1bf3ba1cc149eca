#include "kvstore/block_key.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringlane::kvstore {

namespace {

void AppendU32(std::string* out, uint32_t v) {
  // Big-endian: keys of one model sort by their fields, which keeps the
  // encoding readable in ldb dumps; nothing depends on the order.
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<char>((v >> s) & 0xff));
}

void AppendU64(std::string* out, uint64_t v) {
  AppendU32(out, static_cast<uint32_t>(v >> 32));
  AppendU32(out, static_cast<uint32_t>(v));
}

}  // namespace

absl::Status ValidateKey(const v1::BlockKey& key) {
  if (key.model_id().empty()) return absl::InvalidArgumentError("key: empty model_id");
  if (key.model_id().size() > kMaxModelIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key: model_id of ", key.model_id().size(),
                                                   " bytes (at most ", kMaxModelIdBytes, ")"));
  }
  if (key.prefix_hash().size() != kPrefixHashBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key: prefix_hash of ", key.prefix_hash().size(),
                                                   " bytes (must be ", kPrefixHashBytes, ")"));
  }
  const int world = key.tp_world_size();
  if (key.rank_shared()) {
    if (world < 0 || world > kMaxWorldSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("key: tp_world_size ", world, " (rank_shared: 0..", kMaxWorldSize, ")"));
    }
  } else {
    if (world < 1 || world > kMaxWorldSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("key: tp_world_size ", world, " (1..", kMaxWorldSize, ")"));
    }
    if (key.rank() < 0 || key.rank() >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat("key: rank ", key.rank(), " outside [0, ", world, ")"));
    }
  }
  if (!v1::DType_IsValid(key.kv_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("key: unknown kv_dtype ", key.kv_dtype()));
  }
  if (key.block_size_tokens() < 1 || key.block_size_tokens() > kMaxBlockSizeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key: block_size_tokens ", key.block_size_tokens(), " (1..", kMaxBlockSizeTokens, ")"));
  }
  return absl::OkStatus();
}

std::string ModelPrefix(std::string_view model_id) {
  std::string out;
  out.push_back(static_cast<char>((model_id.size() >> 8) & 0xff));
  out.push_back(static_cast<char>(model_id.size() & 0xff));
  out.append(model_id);
  return out;
}

std::string PrefixSuccessor(std::string_view prefix) {
  std::string out(prefix);
  while (!out.empty()) {
    if (static_cast<unsigned char>(out.back()) != 0xff) {
      out.back() = static_cast<char>(static_cast<unsigned char>(out.back()) + 1);
      return out;
    }
    out.pop_back();
  }
  return out;
}

std::string EncodeKey(const v1::BlockKey& key) {
  std::string out = ModelPrefix(key.model_id());
  out.reserve(out.size() + kPrefixHashBytes + 8 + 4 * 4 + 1);
  out.append(key.prefix_hash());
  AppendU64(&out, key.layout_fingerprint());
  AppendU32(&out, static_cast<uint32_t>(key.rank_shared() ? -1 : key.rank()));
  AppendU32(&out, static_cast<uint32_t>(key.tp_world_size()));
  AppendU32(&out, static_cast<uint32_t>(key.kv_dtype()));
  AppendU32(&out, static_cast<uint32_t>(key.block_size_tokens()));
  return out;
}

std::string DescribeEncodedKey(std::string_view encoded) {
  if (encoded.size() < 2) return "<short key>";
  const size_t len =
      (static_cast<unsigned char>(encoded[0]) << 8) | static_cast<unsigned char>(encoded[1]);
  if (encoded.size() < 2 + len + kPrefixHashBytes + 8 + 4) return "<short key>";
  std::string model(encoded.substr(2, std::min<size_t>(len, 64)));
  for (char& c : model) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  std::string hash;
  for (int i = 0; i < 8; ++i) {
    absl::StrAppendFormat(&hash, "%02x", static_cast<unsigned char>(encoded[2 + len + i]));
  }
  const size_t r = 2 + len + kPrefixHashBytes + 8;
  const int32_t rank =
      static_cast<int32_t>((static_cast<uint32_t>(static_cast<unsigned char>(encoded[r])) << 24) |
                           (static_cast<unsigned char>(encoded[r + 1]) << 16) |
                           (static_cast<unsigned char>(encoded[r + 2]) << 8) |
                           static_cast<unsigned char>(encoded[r + 3]));
  return absl::StrCat(model, len > 64 ? "..." : "", "/", hash, "/",
                      rank < 0 ? std::string("shared") : absl::StrCat("r", rank));
}

}  // namespace ringlane::kvstore
