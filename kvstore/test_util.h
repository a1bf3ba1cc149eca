// Helpers the kvstore's unit tests share: keys, payloads, a fresh directory.
#ifndef RINGLANE_KVSTORE_TEST_UTIL_H_
#define RINGLANE_KVSTORE_TEST_UTIL_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "kvstore/block_key.h"
#include "kvstore/tier/block.h"
#include "ringlane/v1/common.pb.h"

namespace ringlane::kvstore::testing {

// A valid key of `model` whose prefix hash encodes `i`.
inline v1::BlockKey TestKey(int i, const std::string& model = "m", int rank = 0) {
  v1::BlockKey k;
  k.set_model_id(model);
  std::string h(kPrefixHashBytes, '\0');
  for (int b = 0; b < 4; ++b) h[b] = static_cast<char>((i >> (8 * b)) & 0xff);
  k.set_prefix_hash(h);
  k.set_rank(rank);
  k.set_tp_world_size(2);
  k.set_kv_dtype(v1::DTYPE_F32);
  k.set_block_size_tokens(16);
  return k;
}

inline std::string Enc(int i, const std::string& model = "m") {
  return EncodeKey(TestKey(i, model));
}

// `n` bytes that differ per `seed`, so a block read back can be told apart.
inline std::string TestPayload(int seed, int64_t n) {
  std::string p(static_cast<size_t>(n), '\0');
  uint32_t x = 0x9e3779b9u * static_cast<uint32_t>(seed + 1);
  for (auto& c : p) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return p;
}

inline Block TestBlock(int seed, int64_t n) {
  auto p = std::make_shared<const std::string>(TestPayload(seed, n));
  return Block{p, PayloadXxh64(*p)};
}

// A new empty directory under the test's temp dir.
inline std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir() + "/rl_kvstore_" + name + "_" +
                          std::to_string(getpid()) + "_" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace ringlane::kvstore::testing

#endif  // RINGLANE_KVSTORE_TEST_UTIL_H_
