#include "kvstore/tier/disk_tier.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/test_util.h"

namespace ringlane::kvstore {
namespace {

using testing::Enc;
using testing::FreshDir;
using testing::TestBlock;
using testing::TestPayload;

std::unique_ptr<DiskTier> OpenTier(const std::string& dir, int64_t capacity,
                                   int64_t max_entries = 1000) {
  auto t = DiskTier::Open({.dir = dir, .capacity_bytes = capacity, .max_entries = max_entries});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<std::string> Keys(std::initializer_list<int> ids) {
  std::vector<std::string> v;
  for (int i : ids) v.push_back(Enc(i));
  return v;
}

// Flips bytes of the first copy of `needle` in any file of `dir` whose name
// ends in `suffix`; how many files were changed.
int CorruptFiles(const std::string& dir, const std::string& suffix, const std::string& needle) {
  int changed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().string();
    if (name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string bytes;
    {
      std::ifstream in(name, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = bytes.find(needle);
    if (at == std::string::npos) continue;
    for (size_t i = 0; i < 8; ++i) bytes[at + i] = static_cast<char>(~bytes[at + i]);
    std::ofstream out(name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ++changed;
  }
  return changed;
}

TEST(DiskTierTest, StoresAndReadsBlocks) {
  auto t = OpenTier(FreshDir("rw"), 1 << 20);
  ASSERT_NE(t, nullptr);
  bool is_new = false;
  ASSERT_TRUE(t->Put(Enc(1), TestBlock(1, 10000), &is_new).ok());
  EXPECT_TRUE(is_new);
  ASSERT_TRUE(t->Put(Enc(1), TestBlock(1, 10000), &is_new).ok());
  EXPECT_FALSE(is_new);
  absl::StatusOr<Block> b = t->Get(Enc(1));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b->payload, TestPayload(1, 10000));
  EXPECT_EQ(t->Get(Enc(2)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->stats().entries, 1);
  EXPECT_EQ(t->stats().bytes, 10000);
}

TEST(DiskTierTest, EvictsLeastRecentlyUsedByBytesAndByEntries) {
  auto t = OpenTier(FreshDir("lru"), 3000, /*max_entries=*/1000);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Enc(i), TestBlock(i, 1000)).ok());
  ASSERT_TRUE(t->Get(Enc(0)).ok());  // refreshed: 1 is now the oldest
  EXPECT_TRUE(t->Contains(Enc(1)));  // does not refresh
  ASSERT_TRUE(t->Put(Enc(3), TestBlock(3, 1000)).ok());
  EXPECT_EQ(t->KeysLruOrderForTesting(), Keys({2, 0, 3}));
  EXPECT_EQ(t->Get(Enc(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->stats().evictions, 1);
  EXPECT_LE(t->stats().bytes, 3000);
  EXPECT_EQ(t->Put(Enc(9), TestBlock(9, 3001)).code(), absl::StatusCode::kFailedPrecondition);

  auto u = OpenTier(FreshDir("cap"), 1 << 20, /*max_entries=*/2);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(u->Put(Enc(i), TestBlock(i, 10)).ok());
  EXPECT_EQ(u->KeysLruOrderForTesting(), Keys({1, 2}));
}

TEST(DiskTierTest, ARestartKeepsBlocksAndTheirRecency) {
  const std::string dir = FreshDir("restart");
  {
    auto t = OpenTier(dir, 1 << 20);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->Put(Enc(i), TestBlock(i, 5000)).ok());
    ASSERT_TRUE(t->Get(Enc(0)).ok());
  }
  {
    auto t = OpenTier(dir, 1 << 20);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->KeysLruOrderForTesting(), Keys({1, 2, 3, 0}));
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<Block> b = t->Get(Enc(i));
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(*b->payload, TestPayload(i, 5000));
    }
    EXPECT_EQ(t->stats().bytes, 20000);
  }
  // A smaller budget after a restart keeps the most recent entries.
  auto t = OpenTier(dir, 10000);
  EXPECT_EQ(t->KeysLruOrderForTesting(), Keys({2, 3}));
  EXPECT_EQ(t->stats().bytes, 10000);
}

TEST(DiskTierTest, ABlockCorruptedInItsBlobFileIsAMissAndCounted) {
  const std::string dir = FreshDir("corrupt");
  const std::string payload = TestPayload(7, 64 << 10);
  {
    auto t = OpenTier(dir, 1 << 20);
    ASSERT_TRUE(t->Put(Enc(7), TestBlock(7, 64 << 10)).ok());
    ASSERT_TRUE(t->Put(Enc(8), TestBlock(8, 64 << 10)).ok());
    ASSERT_TRUE(t->FlushForTesting().ok());
  }
  // Values of 4 KiB and more live in blob files; flip 8 bytes in the middle
  // of block 7's payload there, as a bad sector or a stray write would.
  ASSERT_EQ(CorruptFiles(dir, ".blob", payload.substr(30000, 64)), 1);
  {
    auto t = OpenTier(dir, 1 << 20);
    EXPECT_EQ(t->Get(Enc(7)).status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(t->stats().checksum_failures, 1);
    EXPECT_FALSE(t->Contains(Enc(7)));  // dropped
    EXPECT_EQ(t->Get(Enc(7)).status().code(), absl::StatusCode::kNotFound);
    absl::StatusOr<Block> other = t->Get(Enc(8));  // its neighbour is intact
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(*other->payload, TestPayload(8, 64 << 10));
  }
  auto t = OpenTier(dir, 1 << 20);
  EXPECT_FALSE(t->Contains(Enc(7)));  // and stays dropped
}

TEST(DiskTierTest, AValueWhoseChecksumDoesNotMatchIsNeverServed) {
  auto t = OpenTier(FreshDir("badsum"), 1 << 20);
  const std::string payload = TestPayload(3, 9000);
  // RocksDB holds these bytes intact; only our XXH64 can tell.
  ASSERT_TRUE(t->PutUncheckedForTesting(Enc(3), payload, PayloadXxh64(payload) ^ 1).ok());
  EXPECT_EQ(t->Get(Enc(3)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(t->stats().checksum_failures, 1);
  EXPECT_EQ(t->stats().entries, 0);
  EXPECT_EQ(t->stats().bytes, 0);
}

TEST(DiskTierTest, EraseWithPrefixDropsOneModelAcrossARestart) {
  const std::string dir = FreshDir("erase");
  {
    auto t = OpenTier(dir, 1 << 20);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Enc(i, "a"), TestBlock(i, 100)).ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(t->Put(Enc(i, "ab"), TestBlock(i, 100)).ok());
    absl::StatusOr<int64_t> n = t->EraseWithPrefix(ModelPrefix("a"));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 3);
    EXPECT_EQ(t->stats().entries, 2);
  }
  auto t = OpenTier(dir, 1 << 20);
  EXPECT_EQ(t->stats().entries, 2);
  EXPECT_FALSE(t->Contains(Enc(0, "a")));
  EXPECT_TRUE(t->Contains(Enc(0, "ab")));
}

TEST(DiskTierTest, AKillMidWriteLeavesOnlyWholeVerifiedEntries) {
  const std::string dir = FreshDir("crash");
  // A child writes blocks as fast as it can (evicting as it goes) until it
  // is killed at a moment it does not choose.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto t = DiskTier::Open({.dir = dir, .capacity_bytes = 4 << 20, .max_entries = 1000});
    if (!t.ok()) _exit(3);
    for (int i = 0;; ++i) (void)(*t)->Put(Enc(i), TestBlock(i, 40000 + (i % 7) * 1000));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited on its own: " << status;
  auto t = OpenTier(dir, 4 << 20);
  ASSERT_NE(t, nullptr);
  const std::vector<std::string> keys = t->KeysLruOrderForTesting();
  EXPECT_GT(keys.size(), 0u);
  for (const std::string& k : keys) {
    absl::StatusOr<Block> b = t->Get(k);
    EXPECT_TRUE(b.ok()) << b.status();
  }
  EXPECT_EQ(t->stats().checksum_failures, 0);
  EXPECT_LE(t->stats().bytes, 4 << 20);
}

TEST(DiskTierTest, UnusableDirectoriesFailToOpen) {
  const std::string file = FreshDir("file");
  { std::ofstream(file) << "x"; }
  EXPECT_FALSE(DiskTier::Open({.dir = file, .capacity_bytes = 100}).ok());
  EXPECT_EQ(DiskTier::Open({.dir = "", .capacity_bytes = 100}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string dir = FreshDir("locked");
  auto first = OpenTier(dir, 100);
  ASSERT_NE(first, nullptr);
  // RocksDB's LOCK file: two stores never share a directory.
  EXPECT_FALSE(DiskTier::Open({.dir = dir, .capacity_bytes = 100}).ok());
}

}  // namespace
}  // namespace ringlane::kvstore
