#include "kvstore/block_key.h"

#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "kvstore/test_util.h"

namespace ringlane::kvstore {
namespace {

using testing::TestKey;

TEST(BlockKeyTest, ValidKeyPasses) { EXPECT_TRUE(ValidateKey(TestKey(1)).ok()); }

TEST(BlockKeyTest, EveryBadFieldIsInvalidArgument) {
  struct Case {
    const char* name;
    std::function<void(v1::BlockKey*)> mutate;
  };
  const Case cases[] = {
      {"empty model", [](v1::BlockKey* k) { k->clear_model_id(); }},
      {"long model",
       [](v1::BlockKey* k) { k->set_model_id(std::string(kMaxModelIdBytes + 1, 'm')); }},
      {"short hash", [](v1::BlockKey* k) { k->set_prefix_hash(std::string(15, 'h')); }},
      {"long hash", [](v1::BlockKey* k) { k->set_prefix_hash(std::string(17, 'h')); }},
      {"negative rank", [](v1::BlockKey* k) { k->set_rank(-1); }},
      {"rank == world", [](v1::BlockKey* k) { k->set_rank(2); }},
      {"world 0", [](v1::BlockKey* k) { k->set_tp_world_size(0); }},
      {"world too large", [](v1::BlockKey* k) { k->set_tp_world_size(kMaxWorldSize + 1); }},
      {"unknown dtype", [](v1::BlockKey* k) { k->set_kv_dtype(static_cast<v1::DType>(99)); }},
      {"block size 0", [](v1::BlockKey* k) { k->set_block_size_tokens(0); }},
      {"shared, negative world",
       [](v1::BlockKey* k) {
         k->set_rank_shared(true);
         k->set_tp_world_size(-1);
       }},
  };
  for (const Case& c : cases) {
    v1::BlockKey k = TestKey(1);
    c.mutate(&k);
    absl::Status s = ValidateKey(k);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    // Sizes and numbers only: the client's bytes are not echoed.
    EXPECT_EQ(std::string(s.message()).find("mmmmmmmm"), std::string::npos) << c.name;
  }
}

TEST(BlockKeyTest, RankSharedKeysAreOneEntryAcrossRanks) {
  v1::BlockKey a = TestKey(1, "m", 0);
  v1::BlockKey b = TestKey(1, "m", 1);
  EXPECT_NE(EncodeKey(a), EncodeKey(b));
  a.set_rank_shared(true);
  b.set_rank_shared(true);
  EXPECT_EQ(EncodeKey(a), EncodeKey(b));
  // Any rank number is fine when shared, and world 0 means "any group size".
  b.set_rank(77);
  b.set_tp_world_size(0);
  EXPECT_TRUE(ValidateKey(b).ok());
  EXPECT_NE(EncodeKey(a), EncodeKey(b));  // the world size is still part of it
  // Shared and per-rank blocks never alias.
  EXPECT_NE(EncodeKey(TestKey(1, "m", 0)), EncodeKey(a));
}

TEST(BlockKeyTest, EveryFieldChangesTheEncoding) {
  const std::string base = EncodeKey(TestKey(1));
  std::function<void(v1::BlockKey*)> mutations[] = {
      [](v1::BlockKey* k) { k->set_layout_fingerprint(1); },
      [](v1::BlockKey* k) { k->set_kv_dtype(v1::DTYPE_BF16); },
      [](v1::BlockKey* k) { k->set_block_size_tokens(32); },
      [](v1::BlockKey* k) { k->set_tp_world_size(4); },
      [](v1::BlockKey* k) { k->set_rank(1); },
      [](v1::BlockKey* k) { k->set_model_id("n"); },
  };
  for (auto& m : mutations) {
    v1::BlockKey k = TestKey(1);
    m(&k);
    EXPECT_NE(EncodeKey(k), base);
  }
  EXPECT_NE(EncodeKey(TestKey(2)), base);
}

TEST(BlockKeyTest, ModelPrefixSelectsExactlyOneModel) {
  const std::string a = ModelPrefix("a");
  EXPECT_EQ(EncodeKey(TestKey(1, "a")).rfind(a, 0), 0u);
  // "ab" is not inside "a"'s range although the text starts the same.
  const std::string ab = EncodeKey(TestKey(1, "ab"));
  EXPECT_NE(ab.rfind(a, 0), 0u);
  EXPECT_FALSE(ab >= a && ab < PrefixSuccessor(a));
  EXPECT_EQ(PrefixSuccessor(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixSuccessor(std::string("\xff\xff", 2)), "");
}

TEST(BlockKeyTest, DescriptionIsBoundedAndPrintable) {
  v1::BlockKey k = TestKey(1);
  k.set_model_id(std::string(kMaxModelIdBytes, '\n'));
  const std::string d = DescribeEncodedKey(EncodeKey(k));
  EXPECT_LE(d.size(), 100u);
  EXPECT_EQ(d.find('\n'), std::string::npos);
  EXPECT_EQ(DescribeEncodedKey("x"), "<short key>");
  k.set_rank_shared(true);
  EXPECT_NE(DescribeEncodedKey(EncodeKey(k)).find("shared"), std::string::npos);
}

}  // namespace
}  // namespace ringlane::kvstore
