#include "kvstore/store.h"

#include <string>

#include "gtest/gtest.h"
#include "kvstore/test_util.h"

namespace ringlane::kvstore {
namespace {

using testing::Enc;
using testing::FreshDir;
using testing::TestPayload;

constexpr int64_t kBlock = 10000;
// DRAM room for two kBlock blocks and their bookkeeping, not three.
constexpr int64_t kTwoBlocks = 2 * (kBlock + 200 + DramTier::kEntryOverheadBytes);

std::unique_ptr<Store> OpenStore(StoreOptions o) {
  auto s = Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

absl::Status PutBlock(Store& s, int i, int64_t n = kBlock, bool* already = nullptr) {
  auto p = std::make_shared<const std::string>(TestPayload(i, n));
  return s.Put(Enc(i), p, PayloadXxh64(*p), already);
}

TEST(StoreTest, DramEvictionsAreDemotedAndDiskHitsPromoted) {
  auto s =
      OpenStore({.dram_bytes = kTwoBlocks, .disk_dir = FreshDir("demote"), .disk_bytes = 1 << 20});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutBlock(*s, i).ok());
  v1::StatsResponse st = s->Stats();
  EXPECT_EQ(st.dram().entries(), 2);
  EXPECT_EQ(st.disk().entries(), 1);
  EXPECT_EQ(st.demotions(), 1);
  EXPECT_EQ(st.blocks_stored(), 3);
  EXPECT_EQ(st.bytes_in(), 3 * kBlock);
  EXPECT_FALSE(s->dram_for_testing()->Contains(Enc(0)));
  EXPECT_TRUE(s->Contains(Enc(0)));

  absl::StatusOr<Block> b = s->Get(Enc(0));  // from disk, back into DRAM
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b->payload, TestPayload(0, kBlock));
  EXPECT_TRUE(s->dram_for_testing()->Contains(Enc(0)));
  ASSERT_TRUE(s->Get(Enc(0)).ok());  // now a DRAM hit
  st = s->Stats();
  EXPECT_EQ(st.disk().hits(), 1);
  EXPECT_EQ(st.dram().hits(), 1);
  // Promoting 0 pushed 1 out of DRAM; the disk keeps 0's copy as well.
  EXPECT_EQ(st.demotions(), 2);
  EXPECT_EQ(st.disk().entries(), 2);
  EXPECT_EQ(s->Get(Enc(9)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().misses(), 1);
}

TEST(StoreTest, PutChecksPayloadsAndRepeatsOnlyRefresh) {
  auto s = OpenStore({.dram_bytes = 1 << 20});
  auto p = std::make_shared<const std::string>(TestPayload(1, 100));
  EXPECT_EQ(s->Put(Enc(1), p, PayloadXxh64(*p) + 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(s->Contains(Enc(1)));
  EXPECT_EQ(s->Stats().checksum_failures_put(), 1);
  bool already = true;
  ASSERT_TRUE(PutBlock(*s, 1, 100, &already).ok());
  EXPECT_FALSE(already);
  ASSERT_TRUE(PutBlock(*s, 1, 100, &already).ok());
  EXPECT_TRUE(already);
  EXPECT_EQ(s->Stats().blocks_stored(), 1);
}

TEST(StoreTest, WithoutADiskTierEvictionsAreDropped) {
  auto s = OpenStore({.dram_bytes = kTwoBlocks});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutBlock(*s, i).ok());
  EXPECT_FALSE(s->Contains(Enc(0)));
  EXPECT_EQ(s->Stats().demotions(), 0);
  EXPECT_EQ(s->Stats().dram().evictions(), 1);
  // Larger than DRAM and nowhere else to go.
  EXPECT_EQ(PutBlock(*s, 5, kTwoBlocks).code(), absl::StatusCode::kResourceExhausted);
}

TEST(StoreTest, ABlockLargerThanDramGoesStraightToDisk) {
  auto s =
      OpenStore({.dram_bytes = kTwoBlocks, .disk_dir = FreshDir("big"), .disk_bytes = 1 << 20});
  ASSERT_TRUE(PutBlock(*s, 5, 3 * kBlock).ok());
  EXPECT_EQ(s->Stats().dram().entries(), 0);
  EXPECT_EQ(s->Stats().disk().entries(), 1);
  absl::StatusOr<Block> b = s->Get(Enc(5));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->payload->size(), static_cast<size_t>(3 * kBlock));
}

TEST(StoreTest, WriteThroughAndTheShutdownFlushBothReachDisk) {
  const std::string dir = FreshDir("through");
  {
    auto s = OpenStore(
        {.dram_bytes = 1 << 20, .disk_dir = dir, .disk_bytes = 1 << 20, .write_through = true});
    ASSERT_TRUE(PutBlock(*s, 1).ok());
    EXPECT_EQ(s->Stats().disk().entries(), 1);
    EXPECT_EQ(s->Stats().dram().entries(), 1);
  }
  {
    auto s = OpenStore({.dram_bytes = 1 << 20, .disk_dir = dir, .disk_bytes = 1 << 20});
    EXPECT_TRUE(s->Contains(Enc(1)));
    ASSERT_TRUE(PutBlock(*s, 2).ok());
    EXPECT_EQ(s->Stats().disk().entries(), 1);  // 2 is in DRAM only
    s->FlushDramToDisk();
  }
  auto s = OpenStore({.dram_bytes = 1 << 20, .disk_dir = dir, .disk_bytes = 1 << 20});
  EXPECT_EQ(s->Stats().disk().entries(), 2);
  ASSERT_TRUE(s->Get(Enc(2)).ok());
}

TEST(StoreTest, ACorruptDiskBlockIsAMiss) {
  auto s =
      OpenStore({.dram_bytes = kTwoBlocks, .disk_dir = FreshDir("corrupt"), .disk_bytes = 1 << 20});
  const std::string p = TestPayload(4, kBlock);
  ASSERT_TRUE(s->disk_for_testing()->PutUncheckedForTesting(Enc(4), p, PayloadXxh64(p) ^ 8).ok());
  EXPECT_TRUE(s->Contains(Enc(4)));
  EXPECT_EQ(s->Get(Enc(4)).status().code(), absl::StatusCode::kNotFound);
  const v1::StatsResponse st = s->Stats();
  EXPECT_EQ(st.checksum_failures_disk(), 1);
  EXPECT_EQ(st.misses(), 1);
  EXPECT_EQ(st.disk().hits(), 0);
  EXPECT_FALSE(s->Contains(Enc(4)));
}

TEST(StoreTest, DeleteModelEmptiesBothTiers) {
  auto s =
      OpenStore({.dram_bytes = kTwoBlocks, .disk_dir = FreshDir("delete"), .disk_bytes = 1 << 20});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutBlock(*s, i).ok());
  auto other = std::make_shared<const std::string>("other model");
  ASSERT_TRUE(s->Put(Enc(0, "n"), other, PayloadXxh64(*other)).ok());
  absl::StatusOr<v1::DeleteModelResponse> r = s->DeleteModel("m");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_dram_deleted() + r->num_disk_deleted(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(s->Contains(Enc(i)));
  EXPECT_TRUE(s->Contains(Enc(0, "n")));
}

}  // namespace
}  // namespace ringlane::kvstore
