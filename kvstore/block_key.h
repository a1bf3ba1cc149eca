// BlockKey in the kvstore: the checks every key passes where it arrives, and
// the one byte encoding both tiers index by (and RocksDB stores), so that a
// key means the same entry in DRAM, on disk and after a restart.
//
// The encoding starts with the model id (length-prefixed), so that one model's
// entries form one contiguous key range (DeleteModel drops the range). A
// rank_shared block encodes rank as -1 whatever its `rank` says: every rank's
// copy of it is the same entry. Free functions; thread-safe.
#ifndef RINGLANE_KVSTORE_BLOCK_KEY_H_
#define RINGLANE_KVSTORE_BLOCK_KEY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "ringlane/v1/common.pb.h"

namespace ringlane::kvstore {

inline constexpr int kPrefixHashBytes = 16;
inline constexpr int kMaxModelIdBytes = 256;
inline constexpr int kMaxWorldSize = 4096;
inline constexpr int kMaxBlockSizeTokens = 1 << 20;

// OK for a key the store accepts; InvalidArgument naming the field otherwise
// (the message never echoes the field's bytes, only sizes and numbers).
absl::Status ValidateKey(const v1::BlockKey& key);

// The entry's identity as bytes. Only for keys that passed ValidateKey.
std::string EncodeKey(const v1::BlockKey& key);

// The first bytes of every encoded key of `model_id` (the range
// [ModelPrefix, PrefixSuccessor(ModelPrefix)) holds exactly its entries).
std::string ModelPrefix(std::string_view model_id);
// The smallest string greater than every string starting with `prefix`;
// empty when there is none (all bytes 0xff).
std::string PrefixSuccessor(std::string_view prefix);

// A short printable name of an encoded key for log lines: at most 64 bytes
// of its model id (non-printable bytes as '?'), the first 8 bytes of its
// prefix hash in hex, and its rank. Bounded, whatever the client sent.
std::string DescribeEncodedKey(std::string_view encoded);

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_BLOCK_KEY_H_
