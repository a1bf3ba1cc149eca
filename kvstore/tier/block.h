// What a tier stores per entry: one block's whole payload (every cache kind
// of its positions, opaque to the store) and its XXH64. Immutable once made;
// shared so that a Get can stream a block while the tier evicts it.
#ifndef RINGLANE_KVSTORE_TIER_BLOCK_H_
#define RINGLANE_KVSTORE_TIER_BLOCK_H_

#include <cstdint>
#include <memory>
#include <string>

namespace ringlane::kvstore {

struct Block {
  std::shared_ptr<const std::string> payload;
  uint64_t xxh64 = 0;  // XXH64, seed 0, of *payload

  int64_t bytes() const { return payload ? static_cast<int64_t>(payload->size()) : 0; }
};

// XXH64 with seed 0, the checksum every ringlane block carries.
uint64_t PayloadXxh64(const void* data, size_t size);
inline uint64_t PayloadXxh64(const std::string& s) { return PayloadXxh64(s.data(), s.size()); }

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_TIER_BLOCK_H_
