#include "router/kv/kv_block_manager.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::router {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int32_t kB = 4;  // block size of most tests

BlockIdentity Identity() {
  return BlockIdentity{.model_id = "stories260K",
                       .model_revision = "",
                       .kv_dtype = "f32",
                       .block_size_tokens = kB,
                       .tp_world_size = 1,
                       .layout = ""};
}

std::unique_ptr<KvBlockManager> Make(int32_t num_blocks, int hash_bits = 128,
                                     BlockIdentity identity = Identity()) {
  auto m = KvBlockManager::Create({.num_blocks = num_blocks,
                                   .identity = std::move(identity),
                                   .hash_bits_for_testing = hash_bits});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// n consecutive token ids from `first`.
std::vector<int32_t> Seq(int n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<BlockId> Table(const KvBlockManager& m, LaneId lane) {
  auto t = m.BlockTable(lane);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::vector<BlockId>(t->begin(), t->end()) : std::vector<BlockId>{};
}

// Runs a prompt through a lane as the scheduler would: allocate it all,
// prefill (not simulated), commit, release.
void RunAndRelease(KvBlockManager& m, LaneId lane, const std::vector<int32_t>& prompt) {
  ASSERT_TRUE(m.Allocate(lane, prompt, prompt.size()).ok());
  ASSERT_TRUE(m.CommitFullBlocks(lane, prompt).ok());
  ASSERT_TRUE(m.Release(lane).ok());
}

struct Counts {
  int32_t free_blocks, in_use, evictable, cached;
};

void ExpectCounts(const KvBlockManager& m, Counts want) {
  KvBlockStats s = m.stats();
  EXPECT_EQ(s.free_blocks, want.free_blocks);
  EXPECT_EQ(s.in_use_blocks, want.in_use);
  EXPECT_EQ(s.evictable_blocks, want.evictable);
  EXPECT_EQ(s.cached_blocks, want.cached);
}

TEST(KvBlockManagerTest, CreateRejectsBadOptions) {
  struct Case {
    const char* name;
    std::function<void(KvBlockManager::Options&)> change;
  };
  const std::vector<Case> cases = {
      {"zero blocks", [](auto& o) { o.num_blocks = 0; }},
      {"zero block size", [](auto& o) { o.identity.block_size_tokens = 0; }},
      {"negative tp", [](auto& o) { o.identity.tp_world_size = -1; }},
      {"no model id", [](auto& o) { o.identity.model_id = ""; }},
      {"no kv dtype", [](auto& o) { o.identity.kv_dtype = ""; }},
      {"hash bits 129", [](auto& o) { o.hash_bits_for_testing = 129; }},
      {"hash bits -1", [](auto& o) { o.hash_bits_for_testing = -1; }},
      {"negative KDA chunk", [](auto& o) { o.linear_chunk = -1; }},
      {"KDA chunk not dividing the checkpoint interval",
       [](auto& o) {
         o.state_checkpoints = 2;
         o.checkpoint_interval = 2 * kB;
         o.linear_chunk = 3;
       }},
  };
  for (const Case& c : cases) {
    KvBlockManager::Options o{.num_blocks = 8, .identity = Identity()};
    c.change(o);
    EXPECT_EQ(KvBlockManager::Create(o).status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
  }
}

TEST(KvBlockManagerTest, BadCallsFailWithTheirCodeAndChangeNothing) {
  auto m = Make(4);
  const std::vector<int32_t> prompt = Seq(6, 10);
  ASSERT_EQ(*m->Allocate(1, prompt, 6), 0);
  const std::vector<BlockId> table = Table(*m, 1);

  struct Case {
    const char* name;
    std::function<absl::Status()> call;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"release unknown lane", [&] { return m->Release(99); }, absl::StatusCode::kNotFound},
      {"append unknown lane", [&] { return m->AppendSlots(99, 4); }, absl::StatusCode::kNotFound},
      {"commit unknown lane", [&] { return m->CommitFullBlocks(99, prompt); },
       absl::StatusCode::kNotFound},
      {"table of unknown lane", [&] { return m->BlockTable(99).status(); },
       absl::StatusCode::kNotFound},
      {"committed of unknown lane", [&] { return m->CommittedPositions(99).status(); },
       absl::StatusCode::kNotFound},
      {"allocate known lane", [&] { return m->Allocate(1, prompt, 6).status(); },
       absl::StatusCode::kAlreadyExists},
      {"allocate negative", [&] { return m->Allocate(2, prompt, -1).status(); },
       absl::StatusCode::kInvalidArgument},
      {"allocate beyond pool", [&] { return m->Allocate(2, Seq(17, 0), 17).status(); },
       absl::StatusCode::kResourceExhausted},
      {"trim unknown lane", [&] { return m->TrimSlots(99, 4); }, absl::StatusCode::kNotFound},
      {"append negative", [&] { return m->AppendSlots(1, -1); },
       absl::StatusCode::kInvalidArgument},
      {"append beyond pool", [&] { return m->AppendSlots(1, 4 * kB + 1); },
       absl::StatusCode::kResourceExhausted},
      {"append int64 max", [&] { return m->AppendSlots(1, std::numeric_limits<int64_t>::max()); },
       absl::StatusCode::kResourceExhausted},
      {"commit past the table", [&] { return m->CommitFullBlocks(1, Seq(2 * kB + 1, 10)); },
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.call().code(), c.code) << c.name;
    EXPECT_EQ(Table(*m, 1), table) << c.name;
    ExpectCounts(*m, {.free_blocks = 2, .in_use = 2, .evictable = 0, .cached = 0});
    EXPECT_EQ(m->stats().num_lanes, 1) << c.name;
  }
  EXPECT_EQ(m->stats().miss_tokens, 6);

  // Exactly the pool fits; one more block does not, for a new lane either.
  ASSERT_TRUE(m->AppendSlots(1, 4 * kB).ok());
  EXPECT_EQ(m->Allocate(2, Seq(1, 0), 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m->BlockTable(2).status().code(), absl::StatusCode::kNotFound);
}

TEST(KvBlockManagerTest, TrimGivesBackRejectedDraftBlocksButNeverCommittedOnes) {
  auto m = Make(8);
  const std::vector<int32_t> prompt = Seq(5, 10);
  ASSERT_EQ(*m->Allocate(1, prompt, 5), 0);
  ASSERT_TRUE(m->CommitFullBlocks(1, absl::MakeConstSpan(prompt).subspan(0, 4)).ok());
  // A verify row of 1 + 6 positions from position 5 needs blocks up to 12.
  ASSERT_TRUE(m->AppendSlots(1, 12).ok());
  EXPECT_EQ(Table(*m, 1).size(), 3u);
  EXPECT_EQ(m->available_blocks(), 5);
  // One draft accepted: positions [0, 7) stay, the third block goes back.
  ASSERT_TRUE(m->TrimSlots(1, 7).ok());
  EXPECT_EQ(Table(*m, 1).size(), 2u);
  EXPECT_EQ(m->available_blocks(), 6);
  // Trimming to more than the table holds changes nothing.
  ASSERT_TRUE(m->TrimSlots(1, 8).ok());
  EXPECT_EQ(Table(*m, 1).size(), 2u);
  // The committed block is final.
  EXPECT_EQ(m->TrimSlots(1, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Table(*m, 1).size(), 2u);
  ASSERT_TRUE(m->Release(1).ok());
  EXPECT_EQ(m->available_blocks(), 8);
}

TEST(KvBlockManagerTest, CommitRejectsTokensThatDisagreeWithTheLane) {
  auto m = Make(8);
  const std::vector<int32_t> prompt = Seq(9, 10);
  ASSERT_TRUE(m->Allocate(1, prompt, 9).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, prompt).ok());
  EXPECT_EQ(*m->CommittedPositions(1), 8);
  const KvBlockStats before = m->stats();

  std::vector<int32_t> other = prompt;
  other[2] += 1;
  ASSERT_TRUE(m->AppendSlots(1, 12).ok());
  other.insert(other.end(), {1, 2, 3});
  EXPECT_EQ(m->CommitFullBlocks(1, other).code(), absl::StatusCode::kInvalidArgument);
  // Fewer tokens than already committed.
  EXPECT_EQ(m->CommitFullBlocks(1, Seq(7, 10)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->stats().cached_blocks, before.cached_blocks);
  EXPECT_EQ(*m->CommittedPositions(1), 8);
}

// The acceptance rule: a resend of an n-token prompt reuses exactly
// floor((n-1)/B)*B tokens.
TEST(KvBlockManagerTest, ResendReusesExactlyTheFullBlocksBeforeTheLastToken) {
  struct Case {
    int n;
    int64_t cached;
  };
  for (const Case& c : std::vector<Case>{{1, 0},
                                         {kB - 1, 0},
                                         {kB, 0},
                                         {kB + 1, kB},
                                         {2 * kB, kB},
                                         {2 * kB + 1, 2 * kB},
                                         {5 * kB + 3, 5 * kB}}) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n);
    auto m = Make(16);
    const std::vector<int32_t> prompt = Seq(c.n, 100);
    ASSERT_EQ(*m->Allocate(1, prompt, c.n), 0);
    const std::vector<BlockId> first = Table(*m, 1);
    ASSERT_TRUE(m->CommitFullBlocks(1, prompt).ok());
    ASSERT_TRUE(m->Release(1).ok());

    EXPECT_EQ(m->MatchPrefix(prompt).cached_tokens, c.cached);
    ASSERT_EQ(*m->Allocate(2, prompt, c.n), c.cached);
    EXPECT_EQ(*m->CommittedPositions(2), c.cached);
    const std::vector<BlockId> second = Table(*m, 2);
    ASSERT_EQ(second.size(), first.size());
    // The reused blocks are the very blocks the first run wrote.
    for (int64_t i = 0; i < c.cached / kB; ++i) EXPECT_EQ(second[i], first[i]);
    EXPECT_EQ(m->stats().hit_tokens, c.cached);
    EXPECT_EQ(m->stats().miss_tokens, 2 * c.n - c.cached);
  }
}

TEST(KvBlockManagerTest, EmptyPromptMatchesNothing) {
  auto m = Make(4);
  EXPECT_EQ(m->MatchPrefix({}).cached_tokens, 0);
  EXPECT_EQ(*m->Allocate(1, {}, 0), 0);
  EXPECT_THAT(Table(*m, 1), IsEmpty());
  EXPECT_TRUE(m->CommitFullBlocks(1, {}).ok());
  EXPECT_TRUE(m->Release(1).ok());
}

TEST(KvBlockManagerTest, SharedPrefixBlocksAreReferenceCounted) {
  auto m = Make(8);
  const std::vector<int32_t> a = Seq(9, 0);  // blocks 0,1 full, 2 holds one token
  ASSERT_EQ(*m->Allocate(1, a, 9), 0);
  ASSERT_TRUE(m->CommitFullBlocks(1, a).ok());
  ExpectCounts(*m, {.free_blocks = 5, .in_use = 3, .evictable = 0, .cached = 2});

  // Same first 8 tokens, different tail: shares two blocks, owns its last.
  std::vector<int32_t> b = Seq(8, 0);
  b.push_back(77);
  ASSERT_EQ(*m->Allocate(2, b, 9), 2 * kB);
  const std::vector<BlockId> ta = Table(*m, 1);
  const std::vector<BlockId> tb = Table(*m, 2);
  EXPECT_EQ(tb[0], ta[0]);
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_NE(tb[2], ta[2]);  // the partial last block is private
  ExpectCounts(*m, {.free_blocks = 4, .in_use = 4, .evictable = 0, .cached = 2});

  // Lane 2 still holds the shared blocks: nothing becomes evictable.
  ASSERT_TRUE(m->Release(1).ok());
  ExpectCounts(*m, {.free_blocks = 5, .in_use = 3, .evictable = 0, .cached = 2});
  ASSERT_TRUE(m->Release(2).ok());
  ExpectCounts(*m, {.free_blocks = 6, .in_use = 0, .evictable = 2, .cached = 2});
  EXPECT_EQ(m->available_blocks(), 8);
}

TEST(KvBlockManagerTest, GrowsTablesBlockByBlock) {
  auto m = Make(4);
  ASSERT_EQ(*m->Allocate(1, Seq(1, 0), 1), 0);
  EXPECT_EQ(Table(*m, 1).size(), 1u);
  ASSERT_TRUE(m->AppendSlots(1, kB).ok());
  EXPECT_EQ(Table(*m, 1).size(), 1u);
  ASSERT_TRUE(m->AppendSlots(1, kB + 1).ok());
  EXPECT_EQ(Table(*m, 1).size(), 2u);
  ASSERT_TRUE(m->AppendSlots(1, 1).ok());  // never shrinks
  EXPECT_THAT(Table(*m, 1), ElementsAre(0, 1));
  ASSERT_TRUE(m->AppendSlots(1, 3 * kB + 1).ok());
  EXPECT_THAT(Table(*m, 1), ElementsAre(0, 1, 2, 3));
}

// Three one-block sequences through a three-block pool: X, then Y, then a
// hit on X. Making room for Z must evict Y (least recently used), not X.
TEST(KvBlockManagerTest, EvictsLeastRecentlyUsedAndAHitRefreshes) {
  auto m = Make(3);
  const std::vector<int32_t> x = Seq(kB + 1, 100);
  const std::vector<int32_t> y = Seq(kB + 1, 200);
  RunAndRelease(*m, 1, x);
  RunAndRelease(*m, 2, y);
  ExpectCounts(*m, {.free_blocks = 1, .in_use = 0, .evictable = 2, .cached = 2});

  ASSERT_EQ(*m->Allocate(3, x, kB + 1), kB);
  ASSERT_TRUE(m->Release(3).ok());

  ASSERT_EQ(*m->Allocate(4, Seq(2 * kB, 300), 2 * kB), 0);
  EXPECT_EQ(m->stats().evictions, 1);
  EXPECT_EQ(m->MatchPrefix(x).cached_tokens, kB);
  EXPECT_EQ(m->MatchPrefix(y).cached_tokens, 0);

  // Taking the rest evicts X too; then nothing is left to take.
  ASSERT_TRUE(m->AppendSlots(4, 3 * kB).ok());
  EXPECT_EQ(m->stats().evictions, 2);
  EXPECT_EQ(m->MatchPrefix(x).cached_tokens, 0);
  EXPECT_EQ(m->AppendSlots(4, 3 * kB + 1).code(), absl::StatusCode::kResourceExhausted);
}

// A released chain is evicted from its tail, so the prefix survives longest.
TEST(KvBlockManagerTest, EvictsAReleasedChainFromItsTail) {
  auto m = Make(3);
  const std::vector<int32_t> p = Seq(2 * kB + 1, 0);
  RunAndRelease(*m, 1, p);
  ExpectCounts(*m, {.free_blocks = 1, .in_use = 0, .evictable = 2, .cached = 2});
  ASSERT_EQ(m->MatchPrefix(p).cached_tokens, 2 * kB);
  ASSERT_TRUE(m->Allocate(2, Seq(2 * kB, 500), 2 * kB).ok());  // one free, one evicted
  EXPECT_EQ(m->MatchPrefix(p).cached_tokens, kB);
}

// Matched blocks waiting in the LRU are referenced before anything is
// evicted, so a lane cannot evict its own prefix; when the pool is short the
// call fails and the cache is as it was.
TEST(KvBlockManagerTest, AllocateNeverEvictsItsOwnMatch) {
  auto m = Make(4);
  const std::vector<int32_t> p = Seq(2 * kB + 1, 0);
  RunAndRelease(*m, 1, p);
  ASSERT_TRUE(m->Allocate(9, Seq(1, 700), 1).ok());
  ExpectCounts(*m, {.free_blocks = 1, .in_use = 1, .evictable = 2, .cached = 2});
  // Needs 2 matched + 2 new blocks: the pool has 3 takeable blocks, but 2 of
  // them are the match itself.
  EXPECT_EQ(m->Allocate(2, p, 4 * kB).status().code(), absl::StatusCode::kResourceExhausted);
  ExpectCounts(*m, {.free_blocks = 1, .in_use = 1, .evictable = 2, .cached = 2});
  EXPECT_EQ(m->stats().evictions, 0);
  EXPECT_EQ(m->MatchPrefix(p).cached_tokens, 2 * kB);
  // 2 matched + 1 new fits.
  EXPECT_EQ(*m->Allocate(2, p, 3 * kB), 2 * kB);
  ExpectCounts(*m, {.free_blocks = 0, .in_use = 4, .evictable = 0, .cached = 2});
}

// Two equal prompts allocated before either commits both compute their
// blocks; the second commit keeps its copy private, and its later blocks
// chain onto the first lane's registration.
TEST(KvBlockManagerTest, IdenticalConcurrentPrompts) {
  auto m = Make(8);
  const std::vector<int32_t> p = Seq(kB + 1, 40);
  ASSERT_EQ(*m->Allocate(1, p, kB + 1), 0);
  ASSERT_EQ(*m->Allocate(2, p, kB + 1), 0);
  const BlockId b1 = Table(*m, 1)[0];
  const BlockId b2 = Table(*m, 2)[0];
  ASSERT_NE(b1, b2);
  ASSERT_TRUE(m->CommitFullBlocks(1, p).ok());
  ASSERT_TRUE(m->CommitFullBlocks(2, p).ok());
  EXPECT_TRUE(m->RegisteredHash(b1).has_value());
  EXPECT_FALSE(m->RegisteredHash(b2).has_value());
  EXPECT_EQ(m->stats().cached_blocks, 1);
  EXPECT_EQ(m->stats().hash_collisions, 0);

  // Lane 2 decodes on to fill a second block and commits it.
  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), {7, 8, 9, 10});
  ASSERT_TRUE(m->AppendSlots(2, 2 * kB + 1).ok());
  ASSERT_TRUE(
      m->CommitFullBlocks(2, std::vector<int32_t>(longer.begin(), longer.begin() + 2 * kB)).ok());
  const BlockId b2_second = Table(*m, 2)[1];
  EXPECT_TRUE(m->RegisteredHash(b2_second).has_value());

  ASSERT_TRUE(m->Release(1).ok());
  ASSERT_TRUE(m->Release(2).ok());
  ExpectCounts(*m, {.free_blocks = 6, .in_use = 0, .evictable = 2, .cached = 2});
  EXPECT_THAT(m->MatchPrefix(longer).block_ids, ElementsAre(b1, b2_second));
}

// A commit that finds its block already registered counts as a use of the
// registered one: it becomes the most recently used.
TEST(KvBlockManagerTest, CommitOfADuplicateRefreshesTheRegisteredBlock) {
  auto m = Make(5);
  const std::vector<int32_t> x = Seq(kB + 1, 100);
  const std::vector<int32_t> y = Seq(kB + 1, 200);
  ASSERT_TRUE(m->Allocate(1, x, kB + 1).ok());
  ASSERT_TRUE(m->Allocate(2, x, kB + 1).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, x).ok());
  ASSERT_TRUE(m->Release(1).ok());
  RunAndRelease(*m, 3, y);                      // y is now more recent than x
  ASSERT_TRUE(m->CommitFullBlocks(2, x).ok());  // and now x is
  ExpectCounts(*m, {.free_blocks = 1, .in_use = 2, .evictable = 2, .cached = 2});

  ASSERT_TRUE(m->Allocate(4, Seq(2 * kB, 300), 2 * kB).ok());
  EXPECT_EQ(m->stats().evictions, 1);
  EXPECT_EQ(m->MatchPrefix(x).cached_tokens, kB);
  EXPECT_EQ(m->MatchPrefix(y).cached_tokens, 0);
}

// The registration a lane chains onto can be another lane's block; when that
// one is evicted under the lane, the lane's later blocks stay private
// instead of being registered where no lookup can reach them.
TEST(KvBlockManagerTest, ChainStopsWhenItsParentIsEvicted) {
  auto m = Make(4);
  const std::vector<int32_t> p = Seq(kB + 1, 40);
  ASSERT_TRUE(m->Allocate(1, p, kB + 1).ok());
  ASSERT_TRUE(m->Allocate(2, p, kB + 1).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, p).ok());
  ASSERT_TRUE(m->CommitFullBlocks(2, p).ok());  // lane 2 chains on lane 1's block
  ASSERT_TRUE(m->Release(1).ok());
  ASSERT_TRUE(m->Allocate(3, Seq(2 * kB, 900), 2 * kB).ok());  // evicts lane 1's block
  ASSERT_EQ(m->stats().evictions, 1);

  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), {7, 8, 9});
  ASSERT_TRUE(m->CommitFullBlocks(2, longer).ok());
  EXPECT_FALSE(m->RegisteredHash(Table(*m, 2)[1]).has_value());
  EXPECT_EQ(m->stats().cached_blocks, 0);
}

// With the hash cut to 0 bits every block hashes alike, so every lookup finds
// a candidate: only the stored tokens and the registration link stand between
// a prompt and someone else's KV.
TEST(KvBlockManagerTest, HashCollisionIsAMissNeverAWrongHit) {
  auto m = Make(8, /*hash_bits=*/0);
  const std::vector<int32_t> a = Seq(kB + 1, 100);
  const std::vector<int32_t> b = Seq(kB + 1, 200);
  RunAndRelease(*m, 1, a);
  ASSERT_EQ(m->stats().cached_blocks, 1);

  EXPECT_EQ(m->MatchPrefix(b).cached_tokens, 0);
  ASSERT_EQ(*m->Allocate(2, b, kB + 1), 0);
  ASSERT_TRUE(m->CommitFullBlocks(2, b).ok());
  EXPECT_EQ(m->stats().hash_collisions, 1);
  EXPECT_FALSE(m->RegisteredHash(Table(*m, 2)[0]).has_value());
  ASSERT_TRUE(m->Release(2).ok());

  // The registered block still serves its own tokens.
  EXPECT_EQ(m->MatchPrefix(a).cached_tokens, kB);
  EXPECT_EQ(m->MatchPrefix(b).cached_tokens, 0);
}

// Equal token blocks at different positions: the second block's tokens equal
// the first's and (at 0 bits) so does its hash, but its KV is of other
// positions. A check of tokens alone would reuse block 0 for block 1.
TEST(KvBlockManagerTest, HashCollisionAtAnotherPositionIsAMiss) {
  std::vector<int32_t> repeated = Seq(kB, 1);
  repeated.insert(repeated.end(), repeated.begin(), repeated.end());
  repeated.push_back(99);
  for (int bits : {0, 128}) {
    SCOPED_TRACE(testing::Message() << "bits=" << bits);
    auto m = Make(8, bits);
    RunAndRelease(*m, 1, repeated);
    const KvBlockManager::PrefixMatch match = m->MatchPrefix(repeated);
    EXPECT_EQ(match.cached_tokens, bits == 0 ? kB : 2 * kB);
    if (match.block_ids.size() == 2) {
      EXPECT_NE(match.block_ids[0], match.block_ids[1]);
    }
  }
}

TEST(KvBlockManagerTest, IdentitySeparatesEqualTokens) {
  const std::vector<int32_t> tokens = Seq(2 * kB, 7);
  std::vector<BlockIdentity> ids(7, Identity());
  ids[1].model_id = "other";
  ids[2].model_revision = "r2";
  ids[3].kv_dtype = "bf16";
  ids[4].tp_world_size = 2;
  ids[5].layout = "v2";
  ids[6].block_size_tokens = kB / 2;  // its blocks are half as long
  std::vector<BlockHash> first;
  for (const BlockIdentity& id : ids) {
    std::vector<BlockHash> h = ChainHashes(id, tokens);
    ASSERT_FALSE(h.empty());
    for (const BlockHash& seen : first) EXPECT_FALSE(seen == h[0]);
    first.push_back(h[0]);
  }
  // Field boundaries are length-prefixed: moving bytes between two fields
  // is another identity.
  BlockIdentity shifted = Identity();
  shifted.model_id = "stories260";
  shifted.model_revision = "K";
  EXPECT_FALSE(ChainHashes(shifted, tokens)[0] == first[0]);

  // Two pools of different identities register the same tokens under
  // different keys, and each manager's keys are the chain's.
  auto m1 = Make(4, 128, ids[0]);
  auto m2 = Make(4, 128, ids[4]);
  RunAndRelease(*m1, 1, tokens);
  RunAndRelease(*m2, 1, tokens);
  const std::optional<BlockHash> h1 = m1->RegisteredHash(0);
  const std::optional<BlockHash> h2 = m2->RegisteredHash(0);
  ASSERT_TRUE(h1.has_value() && h2.has_value());
  EXPECT_FALSE(*h1 == *h2);
  EXPECT_TRUE(*h1 == ChainHashes(ids[0], tokens)[0]);
  EXPECT_TRUE(*h2 == ChainHashes(ids[4], tokens)[0]);
}

// The chain's hashes are block keys in the kvstore and persist across
// builds. Computed outside this code (the documented encoding built with
// Python's struct.pack, hashed by a C program over libxxhash). If this fails,
// every stored block is lost: restore the encoding.
TEST(KvBlockManagerTest, GoldenChainHashPinsTheEncoding) {
  const BlockHash root = ChainRoot(Identity());
  EXPECT_EQ(root.high, 0x813457d991c91ce3ull);
  EXPECT_EQ(root.low, 0xfcbd9e4924429688ull);
  const std::vector<BlockHash> h = ChainHashes(Identity(), {1, 2, 3, 4});
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].Bytes(),
            std::string("\x0e\x25\x68\x39\xf2\x33\x26\xc0\xa2\x73\xcb\x4f\x4b\x02\x69\x4e", 16));
}

TEST(KvBlockManagerTest, ResetForgetsLanesAndCacheButKeepsCounters) {
  auto m = Make(4);
  const std::vector<int32_t> p = Seq(kB + 1, 0);
  RunAndRelease(*m, 1, p);
  ASSERT_EQ(*m->Allocate(2, p, kB + 1), kB);
  ASSERT_TRUE(m->Allocate(3, Seq(3, 50), 3).ok());

  m->Reset();
  ExpectCounts(*m, {.free_blocks = 4, .in_use = 0, .evictable = 0, .cached = 0});
  EXPECT_EQ(m->stats().num_lanes, 0);
  EXPECT_EQ(m->Release(2).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m->MatchPrefix(p).cached_tokens, 0);
  EXPECT_EQ(m->stats().resets, 1);
  EXPECT_EQ(m->stats().hit_tokens, kB);
  // The whole pool is available again, from block 0.
  ASSERT_EQ(*m->Allocate(4, Seq(4 * kB, 0), 4 * kB), 0);
  EXPECT_THAT(Table(*m, 4), ElementsAreArray({0, 1, 2, 3}));
}

// Token-granular reuse (Options::reuse_partial_blocks) from here on.
std::unique_ptr<KvBlockManager> MakePartial(int32_t num_blocks, int hash_bits = 128,
                                            size_t recorded = 0) {
  auto m = KvBlockManager::Create({.num_blocks = num_blocks,
                                   .identity = Identity(),
                                   .hash_bits_for_testing = hash_bits,
                                   .max_recorded_registrations = recorded,
                                   .reuse_partial_blocks = true});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

struct Copy {
  BlockId src, dst;
  friend bool operator==(const Copy&, const Copy&) = default;
};
std::vector<Copy> Copies(KvBlockManager& m) {
  std::vector<Copy> out;
  for (const KvBlockManager::BlockCopy& c : m.TakeCopies()) out.push_back({c.src, c.dst});
  return out;
}
std::ostream& operator<<(std::ostream& os, const Copy& c) { return os << c.src << "->" << c.dst; }

// An identical resend reuses every token but the last, whatever the length:
// the full blocks by reference, the rest of the last one through a copy of
// the block the first lane left partly filled.
TEST(KvBlockManagerPartialTest, ResendReusesAllButTheLastToken) {
  for (int n : {2, kB - 1, kB, kB + 1, kB + 2, 2 * kB, 2 * kB + 3, 5 * kB + 3}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    auto m = MakePartial(16);
    const std::vector<int32_t> prompt = Seq(n, 100);
    ASSERT_EQ(*m->Allocate(1, prompt, n), 0);
    EXPECT_THAT(Copies(*m), IsEmpty());
    const std::vector<BlockId> first = Table(*m, 1);
    ASSERT_TRUE(m->CommitFullBlocks(1, prompt).ok());
    ASSERT_TRUE(m->Release(1).ok());

    EXPECT_EQ(m->MatchPrefix(prompt).cached_tokens, n - 1);
    ASSERT_EQ(*m->Allocate(2, prompt, n), n - 1);
    const std::vector<BlockId> second = Table(*m, 2);
    ASSERT_EQ(second.size(), first.size());
    const size_t full = static_cast<size_t>((n - 1) / kB);
    for (size_t i = 0; i < full; ++i) EXPECT_EQ(second[i], first[i]);
    // The block holding position n - 1 is the lane's own, a copy unless
    // the full blocks end right before it.
    const size_t last = static_cast<size_t>((n - 1) / kB);
    EXPECT_NE(second[last], first[last]);
    const bool copied = (n - 1) % kB != 0;
    if (copied) {
      EXPECT_THAT(Copies(*m), ElementsAre(Copy{first[last], second[last]}));
    } else {
      EXPECT_THAT(Copies(*m), IsEmpty());
    }
    // Full blocks stay whole-block entries; only what follows is partial.
    EXPECT_EQ(*m->CommittedPositions(2), static_cast<int64_t>(full) * kB);
    EXPECT_EQ(m->stats().hit_tokens, n - 1);
    EXPECT_EQ(m->stats().partial_hit_tokens, n - 1 - static_cast<int64_t>(full) * kB);
    EXPECT_EQ(m->stats().block_copies, copied ? 1 : 0);
  }
}

// A partial hit follows the longest common prefix inside the block, from a
// partly filled block or from a registered full one, and never past the
// prompt's last token.
TEST(KvBlockManagerPartialTest, MatchesTheLongestCommonPrefixInsideABlock) {
  auto m = MakePartial(16);
  std::vector<int32_t> p = Seq(kB + 3, 0);  // block 0 full, block 1 holds 3
  RunAndRelease(*m, 1, p);
  std::vector<int32_t> q = p;
  q[kB + 2] = 999;  // differs at the third token of block 1
  EXPECT_EQ(m->MatchPrefix(q).cached_tokens, kB + 2);
  std::vector<int32_t> longer = Seq(3 * kB, 0);
  EXPECT_EQ(m->MatchPrefix(longer).cached_tokens, kB + 3);
  std::vector<int32_t> other = p;
  other[kB] = 999;  // differs at block 1's first token: only block 0
  EXPECT_EQ(m->MatchPrefix(other).cached_tokens, kB);
  EXPECT_EQ(m->MatchPrefix(Seq(kB + 2, 0)).cached_tokens, kB + 1);

  // A full block registered by a longer run serves a shorter prompt's last
  // block too: exactly 2 * kB tokens can reuse 2 * kB - 1.
  auto m2 = MakePartial(16);
  RunAndRelease(*m2, 1, Seq(3 * kB, 0));
  EXPECT_EQ(m2->MatchPrefix(Seq(2 * kB, 0)).cached_tokens, 2 * kB - 1);
  std::vector<int32_t> diverges = Seq(2 * kB, 0);
  diverges[kB + 1] = 999;
  EXPECT_EQ(m2->MatchPrefix(diverges).cached_tokens, kB + 1);
}

// The tokens a partial block keeps are the committed ones: positions a lane
// wrote but no result confirmed, or rolled back, are not offered.
TEST(KvBlockManagerPartialTest, KeepsOnlyCommittedTokens) {
  auto m = MakePartial(16);
  const std::vector<int32_t> seq = Seq(3 * kB, 0);
  ASSERT_TRUE(m->Allocate(1, absl::MakeConstSpan(seq.data(), kB + 2), kB + 2).ok());
  // Results so far cover kB + 1 positions; a verify row then wrote up to
  // 2 * kB and was rolled back to kB + 2, of which only kB + 1 are committed.
  ASSERT_TRUE(m->CommitFullBlocks(1, absl::MakeConstSpan(seq.data(), kB + 1)).ok());
  ASSERT_TRUE(m->AppendSlots(1, 2 * kB).ok());
  ASSERT_TRUE(m->TrimSlots(1, kB + 2).ok());
  ASSERT_TRUE(m->Release(1).ok());
  EXPECT_EQ(m->stats().partial_blocks, 1);
  EXPECT_EQ(m->MatchPrefix(seq).cached_tokens, kB + 1);

  // Rolled back below its committed tail, a lane keeps what is left.
  ASSERT_TRUE(m->Allocate(2, Seq(kB + 3, 500), kB + 3).ok());
  ASSERT_TRUE(m->CommitFullBlocks(2, Seq(kB + 3, 500)).ok());
  ASSERT_TRUE(m->TrimSlots(2, kB + 2).ok());
  ASSERT_TRUE(m->Release(2).ok());
  EXPECT_EQ(m->MatchPrefix(Seq(3 * kB, 500)).cached_tokens, kB + 2);
  // A lane with no committed tail leaves nothing partial.
  ASSERT_TRUE(m->Allocate(3, Seq(kB + 3, 900), kB + 3).ok());
  ASSERT_TRUE(m->Release(3).ok());
  EXPECT_EQ(m->MatchPrefix(Seq(3 * kB, 900)).cached_tokens, 0);
  EXPECT_EQ(m->stats().partial_blocks, 2);
}

// The copy's source cannot be the block handed out as its destination or
// evicted for another of the lane's blocks; when the pool has no room
// without it, the lane recomputes those positions instead of failing.
TEST(KvBlockManagerPartialTest, TheSourceIsNeverEvictedForItsOwnCopy) {
  auto m = MakePartial(2);
  const std::vector<int32_t> p = Seq(kB + 3, 0);
  RunAndRelease(*m, 1, p);  // block 0 full (cached), block 1 partial
  ExpectCounts(*m, {.free_blocks = 0, .in_use = 0, .evictable = 2, .cached = 1});
  EXPECT_EQ(m->stats().partial_blocks, 1);
  // Needs block 0 and one fresh block: the only candidate is the source.
  ASSERT_EQ(*m->Allocate(2, p, kB + 3), kB);
  EXPECT_THAT(Copies(*m), IsEmpty());
  EXPECT_EQ(m->stats().partial_blocks, 0);
  EXPECT_EQ(m->stats().evictions, 1);
  ASSERT_TRUE(m->Release(2).ok());

  // With a free block, the copy goes there and the source stays cached.
  auto m3 = MakePartial(3);
  RunAndRelease(*m3, 1, p);
  ASSERT_EQ(*m3->Allocate(2, p, kB + 3), kB + 2);
  const std::vector<Copy> c = Copies(*m3);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NE(c[0].src, c[0].dst);
  EXPECT_EQ(Table(*m3, 2)[1], c[0].dst);
  EXPECT_EQ(m3->stats().evictions, 0);
  EXPECT_EQ(m3->stats().partial_blocks, 1);
  // A caller that cannot order a copy asks for whole blocks only.
  EXPECT_EQ(*m3->Allocate(3, p, kB + 3, /*reuse_partial=*/false), kB);
  EXPECT_THAT(Copies(*m3), IsEmpty());
}

// A partial block is chained on its parent's registration: when the parent
// is evicted (or was never registered: a collision), it is unreachable. It
// never has a hash, so the kvstore neither receives it nor hears of its
// eviction.
TEST(KvBlockManagerPartialTest, PartialBlocksFollowTheirParentAndStayOutOfTheStore) {
  auto m = MakePartial(3, 128, /*recorded=*/16);
  const std::vector<int32_t> p = Seq(kB + 3, 0);
  RunAndRelease(*m, 1, p);
  const std::vector<BlockId> regs = m->TakeRegistrations();
  ASSERT_EQ(regs.size(), 1u);  // only the full block
  BlockId partial = -1;
  for (BlockId b = 0; b < 3; ++b) {
    if (b != regs[0] && m->stats().partial_blocks == 1 && !m->RegisteredHash(b)) partial = b;
  }
  ASSERT_GE(partial, 0);
  // Evict everything: the partial block goes first (tail first), and no
  // eviction is recorded for it.
  ASSERT_TRUE(m->Allocate(2, Seq(3 * kB, 500), 3 * kB).ok());
  const std::vector<KvBlockManager::Eviction> ev = m->TakeEvictions();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].block, regs[0]);
  EXPECT_EQ(m->stats().partial_blocks, 0);
  ASSERT_TRUE(m->Release(2).ok());
  EXPECT_EQ(m->MatchPrefix(p).cached_tokens, 0);

  // A lane whose parent registration was evicted under it (it chained on
  // another lane's copy) leaves no partial block: nothing could reach it.
  auto m2 = MakePartial(4);
  ASSERT_TRUE(m2->Allocate(1, p, kB + 3).ok());
  ASSERT_TRUE(m2->Allocate(2, p, kB + 3).ok());
  ASSERT_TRUE(m2->CommitFullBlocks(1, p).ok());
  ASSERT_TRUE(m2->CommitFullBlocks(2, p).ok());  // lane 2 chains on lane 1's block 0
  m2->TakeCopies();
  ASSERT_TRUE(m2->Release(1).ok());  // its block 0 and partial block 1 are evictable
  ASSERT_EQ(m2->stats().partial_blocks, 1);
  ASSERT_TRUE(m2->Allocate(3, Seq(2 * kB, 900), 2 * kB).ok());  // evicts both
  ASSERT_EQ(m2->stats().evictions, 2);
  ASSERT_TRUE(m2->Release(2).ok());
  EXPECT_EQ(m2->stats().partial_blocks, 0);
  EXPECT_EQ(m2->MatchPrefix(p).cached_tokens, 0);

  // Hash collisions: the partial block needs the exact parent registration.
  auto m3 = MakePartial(8, /*hash_bits=*/0);
  RunAndRelease(*m3, 1, p);
  std::vector<int32_t> q = Seq(kB + 3, 100);
  for (int i = kB; i < kB + 3; ++i) q[i] = p[i];  // same tail, other first block
  EXPECT_EQ(m3->MatchPrefix(q).cached_tokens, 0);
  RunAndRelease(*m3, 2, q);  // its full block collides: chain closed
  EXPECT_EQ(m3->stats().hash_collisions, 1);
  EXPECT_EQ(m3->stats().partial_blocks, 1) << "the closed chain left no partial block";
  EXPECT_EQ(m3->MatchPrefix(q).cached_tokens, 0);
  EXPECT_EQ(m3->MatchPrefix(p).cached_tokens, kB + 2);
}

// The same tail released twice is cached once; a longer one replaces a
// shorter one it extends, and a full block replaces the partial ones it
// extends.
TEST(KvBlockManagerPartialTest, OneCachedBlockPerContent) {
  auto m = MakePartial(16);
  const std::vector<int32_t> p = Seq(kB + 2, 0);
  RunAndRelease(*m, 1, p);
  RunAndRelease(*m, 2, p);
  EXPECT_EQ(m->stats().partial_blocks, 1);
  EXPECT_EQ(m->stats().evictable_blocks, 2);
  RunAndRelease(*m, 3, Seq(kB + 3, 0));
  EXPECT_EQ(m->stats().partial_blocks, 1);
  EXPECT_EQ(m->MatchPrefix(Seq(3 * kB, 0)).cached_tokens, kB + 3);
  // A shorter tail adds nothing: the longer block has it.
  RunAndRelease(*m, 4, Seq(kB + 1, 0));
  EXPECT_EQ(m->stats().partial_blocks, 1);
  RunAndRelease(*m, 5, Seq(2 * kB + 1, 0));
  EXPECT_EQ(m->stats().partial_blocks, 1) << "the full block dropped the partial one";
  EXPECT_EQ(m->stats().cached_blocks, 2);
  EXPECT_EQ(m->MatchPrefix(Seq(3 * kB, 0)).cached_tokens, 2 * kB + 1);
  EXPECT_EQ(m->stats().evictable_blocks, 3);
  EXPECT_EQ(m->stats().free_blocks, 13);
}

// A resent prompt whose copy became the lane's full block registers like any
// other; Reset forgets partial blocks and queued copies.
TEST(KvBlockManagerPartialTest, ACopiedBlockFillsUpAndResetForgetsAll) {
  auto m = MakePartial(8);
  const std::vector<int32_t> p = Seq(kB + 2, 0);
  RunAndRelease(*m, 1, p);
  std::vector<int32_t> q = Seq(2 * kB + 1, 0);
  ASSERT_EQ(*m->Allocate(2, q, 2 * kB + 1), kB + 2);
  const std::vector<Copy> c = Copies(*m);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_TRUE(m->CommitFullBlocks(2, q).ok());
  EXPECT_TRUE(m->RegisteredHash(c[0].dst).has_value());
  EXPECT_EQ(m->stats().partial_blocks, 0) << "the new full block extends the partial one";
  ASSERT_TRUE(m->Allocate(3, Seq(kB + 2, 300), kB + 2).ok());
  ASSERT_TRUE(m->Release(2).ok());
  EXPECT_EQ(m->stats().partial_blocks, 1);
  ASSERT_TRUE(m->Allocate(4, Seq(3 * kB, 0), 3 * kB).ok());
  m->Reset();
  EXPECT_THAT(Copies(*m), IsEmpty());
  EXPECT_EQ(m->stats().partial_blocks, 0);
  EXPECT_EQ(m->MatchPrefix(q).cached_tokens, 0);
  ExpectCounts(*m, {.free_blocks = 8, .in_use = 0, .evictable = 0, .cached = 0});
}

// CommitTail, the applier's per-round record between full blocks.
TEST(KvBlockManagerPartialTest, CommitTailRecordsWhatReleaseKeeps) {
  auto m = MakePartial(8);
  EXPECT_EQ(m->CommitTail(1, {}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(m->Allocate(1, Seq(kB + 1, 0), kB + 1).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, Seq(kB, 0)).ok());
  EXPECT_EQ(m->CommitTail(1, Seq(kB, 0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->CommitTail(1, {kB, kB + 1}).ok());
  ASSERT_TRUE(m->Release(1).ok());
  EXPECT_EQ(m->MatchPrefix(Seq(3 * kB, 0)).cached_tokens, kB + 2);
  // No block past the committed ones: nothing to keep a tail in.
  ASSERT_TRUE(m->Allocate(2, Seq(kB, 100), kB).ok());
  ASSERT_TRUE(m->CommitFullBlocks(2, Seq(kB, 100)).ok());
  EXPECT_EQ(m->CommitTail(2, {7}).code(), absl::StatusCode::kInvalidArgument);
  // Without the option it is accepted and ignored.
  auto plain = Make(4);
  ASSERT_TRUE(plain->Allocate(1, Seq(3, 0), 3).ok());
  ASSERT_TRUE(plain->CommitTail(1, Seq(3, 0)).ok());
  ASSERT_TRUE(plain->Release(1).ok());
  EXPECT_EQ(plain->MatchPrefix(Seq(8, 0)).cached_tokens, 0);
  EXPECT_EQ(plain->stats().free_blocks, 4);
}

// State checkpoints (models with recurrent layers): a hit ends at the last
// matched block whose end has a checkpoint, the lane's first row gets it
// once, a slot pinned by a pending resume is never handed on, and the least
// recently used slot is handed on when none is free (its block's hit ends
// earlier from then on).
std::unique_ptr<KvBlockManager> MakeWithCheckpoints(int32_t num_blocks, int32_t checkpoints,
                                                    int64_t interval) {
  auto m = KvBlockManager::Create({.num_blocks = num_blocks,
                                   .identity = Identity(),
                                   .reuse_partial_blocks = true,
                                   .state_checkpoints = checkpoints,
                                   .checkpoint_interval = interval});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(KvBlockManagerCheckpointTest, HitsEndAtTheLastCheckpoint) {
  EXPECT_FALSE(KvBlockManager::Create({.num_blocks = 8,
                                       .identity = Identity(),
                                       .state_checkpoints = 2,
                                       .checkpoint_interval = kB + 1})
                   .ok());
  auto m = MakeWithCheckpoints(32, 4, 2 * kB);
  const std::vector<int32_t> prompt = Seq(7 * kB + 1, 100);
  ASSERT_TRUE(m->Allocate(1, prompt, prompt.size()).ok());
  EXPECT_EQ(m->TakeResumeCheckpoint(1), -1);
  // The rows ran through positions 2B and 4B (not 6B: no checkpoint asked).
  absl::StatusOr<int32_t> a = m->CheckpointFor(1, 2 * kB);
  absl::StatusOr<int32_t> b = m->CheckpointFor(1, 4 * kB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_FALSE(m->CheckpointFor(1, 3 * kB).ok()) << "not a multiple of the interval";
  EXPECT_FALSE(m->CheckpointFor(1, 10 * kB).ok()) << "beyond the lane's table";
  ASSERT_TRUE(m->CommitFullBlocks(1, prompt).ok());
  ASSERT_TRUE(m->Release(1).ok());
  // Seven full blocks are cached; the hit ends at 4B, where the state is.
  absl::StatusOr<int64_t> cached = m->Allocate(2, prompt, prompt.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 4 * kB);
  EXPECT_EQ(m->TakeResumeCheckpoint(2), *b);
  EXPECT_EQ(m->TakeResumeCheckpoint(2), -1) << "once";
  ASSERT_TRUE(m->Release(2).ok());
  // No token-granular hits: a prompt that ends inside a block matches the
  // full blocks up to its checkpoint only.
  std::vector<int32_t> shorter(prompt.begin(), prompt.begin() + 4 * kB + 2);
  cached = m->Allocate(3, shorter, shorter.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 4 * kB);
  EXPECT_TRUE(m->TakeCopies().empty());
  ASSERT_TRUE(m->Release(3).ok());
}

TEST(KvBlockManagerCheckpointTest, PinnedSlotsAreKeptAndTheOldestIsHandedOn) {
  auto m = MakeWithCheckpoints(64, 2, kB);
  const std::vector<int32_t> p1 = Seq(2 * kB + 1, 0), p2 = Seq(2 * kB + 1, 1000);
  ASSERT_TRUE(m->Allocate(1, p1, p1.size()).ok());
  absl::StatusOr<int32_t> s1 = m->CheckpointFor(1, kB), s2 = m->CheckpointFor(1, 2 * kB);
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, p1).ok());
  ASSERT_TRUE(m->Release(1).ok());
  // Lane 2 resumes at 2B and pins that slot until its first row.
  absl::StatusOr<int64_t> cached = m->Allocate(2, p1, p1.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 2 * kB);
  // Another prompt's checkpoints: only the unpinned slot can be handed on
  // (even from the lane's own last checkpoint: it is the oldest unpinned).
  ASSERT_TRUE(m->Allocate(3, p2, p2.size()).ok());
  absl::StatusOr<int32_t> t1 = m->CheckpointFor(3, kB);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(*t1, *s1);
  absl::StatusOr<int32_t> t2 = m->CheckpointFor(3, 2 * kB);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(*t2, *s1);
  EXPECT_EQ(m->TakeResumeCheckpoint(2), *s2);
  // Unpinned now: handed on to lane 3's first block; p1's chain has none
  // left.
  t1 = m->CheckpointFor(3, kB);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(*t1, *s2);
  ASSERT_TRUE(m->Release(2).ok());
  ASSERT_TRUE(m->CommitFullBlocks(3, p2).ok());
  ASSERT_TRUE(m->Release(3).ok());
  cached = m->Allocate(4, p1, p1.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 0);
  EXPECT_EQ(m->TakeResumeCheckpoint(4), -1);
  ASSERT_TRUE(m->Release(4).ok());
  cached = m->Allocate(5, p2, p2.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 2 * kB);
  EXPECT_EQ(m->TakeResumeCheckpoint(5), *s1);
  EXPECT_EQ(m->stats().checkpoints_saved, 5);
  EXPECT_EQ(m->stats().checkpoint_evictions, 3);
}

TEST(KvBlockManagerCheckpointTest, AReusedBlockLosesItsCheckpoint) {
  auto m = MakeWithCheckpoints(2, 4, kB);  // two blocks: every new prompt evicts
  const std::vector<int32_t> p1 = Seq(kB + 1, 0), p2 = Seq(kB + 1, 500);
  ASSERT_TRUE(m->Allocate(1, p1, p1.size()).ok());
  ASSERT_TRUE(m->CheckpointFor(1, kB).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, p1).ok());
  ASSERT_TRUE(m->Release(1).ok());
  ASSERT_TRUE(m->Allocate(2, p2, p2.size()).ok());  // takes p1's blocks
  ASSERT_TRUE(m->Release(2).ok());
  absl::StatusOr<int64_t> cached = m->Allocate(3, p1, p1.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 0);
  EXPECT_EQ(m->TakeResumeCheckpoint(3), -1);
}

// For the kvstore tier: a registered block says which checkpoint it has and
// where it ends, an evicted one hands both to the write-back, a slot pinned
// for a restore is never handed on until unpinned, and a restore of blocks
// the pool still holds without their checkpoint gives them the restored one.
TEST(KvBlockManagerCheckpointTest, CheckpointsTravelWithTheKvstoreTier) {
  auto m0 = KvBlockManager::Create({.num_blocks = 4,
                                    .identity = Identity(),
                                    .max_recorded_registrations = 16,
                                    .state_checkpoints = 2,
                                    .checkpoint_interval = 2 * kB});
  ASSERT_TRUE(m0.ok());
  KvBlockManager& m = **m0;
  const std::vector<int32_t> p1 = Seq(2 * kB + 1, 0), p2 = Seq(4 * kB, 700);
  ASSERT_TRUE(m.Allocate(1, p1, p1.size()).ok());
  absl::StatusOr<int32_t> s = m.CheckpointFor(1, 2 * kB);
  ASSERT_TRUE(s.ok() && *s >= 0);
  ASSERT_TRUE(m.CommitFullBlocks(1, p1).ok());
  const std::vector<BlockId> regs = m.TakeRegistrations();
  ASSERT_EQ(regs.size(), 2u);
  std::optional<KvBlockManager::RegisteredBlock> first = m.Registered(regs[0]);
  std::optional<KvBlockManager::RegisteredBlock> second = m.Registered(regs[1]);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->checkpoint, -1);
  EXPECT_EQ(first->end_position, kB);
  EXPECT_EQ(second->checkpoint, *s);
  EXPECT_EQ(second->end_position, 2 * kB);
  ASSERT_TRUE(m.Release(1).ok());
  // p2 needs all four blocks: p1's two are evicted, the second with its
  // checkpoint.
  ASSERT_TRUE(m.Allocate(2, p2, p2.size()).ok());
  const std::vector<KvBlockManager::Eviction> ev = m.TakeEvictions();
  ASSERT_EQ(ev.size(), 2u);
  int with_checkpoint = 0;
  for (const KvBlockManager::Eviction& e : ev) {
    if (e.checkpoint >= 0) {
      ++with_checkpoint;
      EXPECT_EQ(e.checkpoint, *s);
      EXPECT_EQ(e.end_position, 2 * kB);
    }
  }
  EXPECT_EQ(with_checkpoint, 1);
  // A pinned slot is not handed on: of two slots, one pinned, both
  // checkpoints of lane 2 get the other one.
  absl::StatusOr<int32_t> pinned = m.CheckpointFor(2, 2 * kB, /*pin=*/true);
  ASSERT_TRUE(pinned.ok() && *pinned >= 0);
  absl::StatusOr<int32_t> other = m.CheckpointFor(2, 4 * kB);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *pinned);
  ASSERT_TRUE(m.Release(2).ok());  // nothing committed: both checkpoints dropped
  ASSERT_TRUE(m.Allocate(3, p2, p2.size()).ok());
  absl::StatusOr<int32_t> a = m.CheckpointFor(3, 2 * kB);
  absl::StatusOr<int32_t> b = m.CheckpointFor(3, 4 * kB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *other);
  EXPECT_EQ(*b, *other) << "the pinned slot was handed on";
  m.UnpinCheckpoint(*pinned);
  a = m.CheckpointFor(3, 2 * kB);  // lost its slot to 4B just now
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, *pinned);
  ASSERT_TRUE(m.Release(3).ok());
}

TEST(KvBlockManagerCheckpointTest, ADuplicateCommitGivesItsCheckpointToTheRegisteredBlock) {
  auto m = MakeWithCheckpoints(16, 4, kB);
  const std::vector<int32_t> p = Seq(kB + 1, 0);
  // Lane 1 computes the block without a checkpoint (every slot was busy).
  ASSERT_TRUE(m->Allocate(1, p, p.size()).ok());
  ASSERT_TRUE(m->CommitFullBlocks(1, p).ok());
  ASSERT_TRUE(m->Release(1).ok());
  absl::StatusOr<int64_t> cached = m->Allocate(2, p, p.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 0) << "no checkpoint: no hit";
  // Lane 2 (a restore, or the same prompt again) has one for the same chain.
  ASSERT_TRUE(m->CheckpointFor(2, kB).ok());
  ASSERT_TRUE(m->CommitFullBlocks(2, p).ok());
  ASSERT_TRUE(m->Release(2).ok());
  cached = m->Allocate(3, p, p.size());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, kB);
  EXPECT_GE(m->TakeResumeCheckpoint(3), 0);
  ASSERT_TRUE(m->Release(3).ok());
}

// With a KDA chunk, a block past its lane's chunked prefill (the request's
// prompt in whole chunks) holds KV of positions that ran through the
// recurrence, where a lane with a longer limit runs them chunked: only a
// lane with the same limit finds it, and the kvstore's keys (ChainHashes)
// name the same blocks as the pool's.
TEST(KvBlockManagerCheckpointTest, BlocksPastTheChunkedPrefillMatchOnlyTheSameLimit) {
  auto m = KvBlockManager::Create({.num_blocks = 32,
                                   .identity = Identity(),
                                   .state_checkpoints = 8,
                                   .checkpoint_interval = kB,
                                   .linear_chunk = 2});
  ASSERT_TRUE(m.ok()) << m.status();
  KvBlockManager& kv = **m;
  EXPECT_EQ(kv.ChunkedUntil(9), 8);
  EXPECT_EQ(kv.ChunkedUntil(1), 0);
  // A prompt of 2B + 1 tokens (limit 2B) and 2B - 1 generated tokens fed
  // back: blocks 0 and 1 ran chunked, blocks 2 and 3 did not.
  const std::vector<int32_t> seq = Seq(4 * kB + 1, 500);
  const int64_t limit = kv.ChunkedUntil(2 * kB + 1);
  ASSERT_TRUE(kv.Allocate(1, seq, seq.size(), true, limit).ok());
  for (int b = 1; b <= 4; ++b) ASSERT_TRUE(kv.CheckpointFor(1, b * kB).ok());
  ASSERT_TRUE(kv.CommitFullBlocks(1, absl::MakeConstSpan(seq).first(4 * kB)).ok());
  const std::vector<BlockId> table = Table(kv, 1);
  const std::vector<BlockHash> keys = ChainHashes(Identity(), seq, 4, kv.linear_chunk(), limit);
  ASSERT_EQ(keys.size(), 4u);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(kv.RegisteredHash(table[b]), keys[b]) << "block " << b;
  EXPECT_EQ(ChainHashes(Identity(), seq, 4)[1], keys[1]) << "a chunked block's key has no tag";
  EXPECT_NE(ChainHashes(Identity(), seq, 4)[2], keys[2]);
  ASSERT_TRUE(kv.Release(1).ok());
  // The next turn (all of it prompt: limit 4B) reuses the chunked blocks.
  EXPECT_EQ(kv.MatchPrefix(seq, kv.ChunkedUntil(seq.size())).cached_tokens, 2 * kB);
  absl::StatusOr<int64_t> hit = kv.Allocate(2, seq, seq.size(), true, kv.ChunkedUntil(seq.size()));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 2 * kB);
  ASSERT_TRUE(kv.Release(2).ok());
  // A preempted choice of the first request comes back with the same limit
  // and resumes after all four blocks.
  EXPECT_EQ(kv.MatchPrefix(seq, limit).cached_tokens, 4 * kB);
}

}  // namespace
}  // namespace ringlane::router
