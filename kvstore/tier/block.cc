#include "kvstore/tier/block.h"

#include <xxhash.h>

namespace ringlane::kvstore {

uint64_t PayloadXxh64(const void* data, size_t size) { return XXH64(data, size, 0); }

}  // namespace ringlane::kvstore
