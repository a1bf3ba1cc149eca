#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/testing/models.h"

namespace ringlane::worker {
namespace {

using ::testing::HasSubstr;

// Fails the test (and returns null) when the backend cannot be made.
std::unique_ptr<Backend> MakeBackend(const CpuBackendOptions& o) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCpuBackend(BundledStories(), o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::vector<uint8_t> Snapshot(const Backend& b) {
  std::vector<uint8_t> all, one;
  for (int i = 0; i < b.kv_pool().num_blocks; ++i) {
    EXPECT_TRUE(b.ExportKvBlock(i, &one).ok());
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

SeqStep Seq(int64_t start, std::vector<int32_t> tokens, std::vector<int32_t> blocks) {
  SeqStep s;
  s.start_position = start;
  s.tokens = std::move(tokens);
  s.block_ids = std::move(blocks);
  s.logit_offsets = {static_cast<int32_t>(s.tokens.size()) - 1};
  return s;
}

TEST(CpuBackend, StepBeforePoolIsFailedPrecondition) {
  auto b = MakeBackend({});
  RoundInput in;
  in.seqs.push_back(Seq(0, {1, 2}, {0}));
  EXPECT_EQ(b->Step(in).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Each bad round is refused with InvalidArgument naming the problem, writes
// nothing, and the backend serves a good round right after.
TEST(CpuBackend, BadRoundsAreRefusedWithoutSideEffects) {
  auto b = MakeBackend({});
  ASSERT_TRUE(b->AllocateKvPool({4, 4, DType::kF32}).ok());
  struct Case {
    const char* name;
    RoundInput round;
    const char* message;
  };
  auto one = [](SeqStep s) {
    RoundInput r;
    r.seqs.push_back(std::move(s));
    return r;
  };
  std::vector<Case> cases;
  cases.push_back({"token above vocab", one(Seq(0, {1, 512}, {0})), "outside vocabulary"});
  cases.push_back({"negative token", one(Seq(0, {-3}, {0})), "outside vocabulary"});
  cases.push_back({"no tokens", one(Seq(0, {}, {0})), "no tokens"});
  cases.push_back({"negative start", one(Seq(-1, {1}, {0})), "negative start"});
  cases.push_back({"blocks too few", one(Seq(2, {1, 2, 3}, {0})), "need 2 blocks"});
  // Found by round_plan_fuzz: start + tokens overflowed before the check.
  cases.push_back({"start past the pool", one(Seq(std::numeric_limits<int64_t>::max(), {1}, {0})),
                   "past the KV pool"});
  cases.push_back({"block out of pool", one(Seq(0, {1}, {9})), "outside pool"});
  SeqStep bad_offset = Seq(0, {1, 2}, {0});
  bad_offset.logit_offsets = {2};
  cases.push_back({"logit offset", one(bad_offset), "logit offset"});
  RoundInput clash;
  clash.seqs.push_back(Seq(0, {1, 2}, {1}));
  clash.seqs.push_back(Seq(1, {5}, {1}));
  cases.push_back({"two writers of one slot", clash, "written by two sequences"});

  const std::vector<uint8_t> before = Snapshot(*b);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = b->Step(c.round);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_EQ(Snapshot(*b), before);
  }
  auto good = b->Step(one(Seq(0, {1, 403, 407}, {0})));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->logits[0].size(), 512u);
}

TEST(CpuBackend, KvBlockExportImportRoundTrip) {
  auto b = MakeBackend({});
  ASSERT_TRUE(b->AllocateKvPool({3, 4, DType::kFP8E4M3}).ok());
  RoundInput in;
  in.seqs.push_back(Seq(0, {1, 403, 407, 261}, {2}));
  ASSERT_TRUE(b->Step(in).ok());
  std::vector<uint8_t> blk;
  ASSERT_TRUE(b->ExportKvBlock(2, &blk).ok());
  EXPECT_EQ(static_cast<int64_t>(blk.size()), b->kv_block_bytes());
  ASSERT_TRUE(b->ImportKvBlock(0, blk).ok());
  std::vector<uint8_t> copy;
  ASSERT_TRUE(b->ExportKvBlock(0, &copy).ok());
  EXPECT_EQ(copy, blk);
  EXPECT_EQ(b->ImportKvBlock(0, absl::MakeConstSpan(blk.data(), blk.size() - 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ImportKvBlock(7, blk).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ExportKvBlock(-1, &copy).code(), absl::StatusCode::kInvalidArgument);
}

// A resumed prefix: logits after importing a prefix's blocks into other block
// ids equal the logits computed straight through.
TEST(CpuBackend, ImportedPrefixContinuesIdentically) {
  auto b = MakeBackend({});
  ASSERT_TRUE(b->AllocateKvPool({8, 4, DType::kBF16}).ok());
  std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261};
  RoundInput full;
  full.seqs.push_back(Seq(0, toks, {0, 1, 2}));
  auto want = b->Step(full);
  ASSERT_TRUE(want.ok());
  std::vector<uint8_t> blk;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(b->ExportKvBlock(i, &blk).ok());
    ASSERT_TRUE(b->ImportKvBlock(5 + i, blk).ok());
  }
  RoundInput rest;
  rest.seqs.push_back(Seq(8, {toks[8]}, {5, 6, 3}));
  auto got = b->Step(rest);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::memcmp(got->logits[0].data(), want->logits[0].data(), 512 * sizeof(float)), 0);
}

// The traps: a prompt chunked any way, K/V read back from the cache in the
// stored dtype, FP8 scales per token: the logits at every position are the
// same bits whether the prompt came in one round or one token at a time.
class ChunkingTest : public ::testing::TestWithParam<DType> {};

TEST_P(ChunkingTest, LogitsIndependentOfPrefillChunking) {
  auto b = MakeBackend({.threads = 2});
  ASSERT_TRUE(b->AllocateKvPool({8, 16, GetParam()}).ok());
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 61 + 5) % 512);
  auto run = [&](int chunk) {
    std::vector<std::vector<float>> rows;
    for (int at = 0; at < 40; at += chunk) {
      const int n = std::min(chunk, 40 - at);
      SeqStep s =
          Seq(at, std::vector<int32_t>(toks.begin() + at, toks.begin() + at + n), {0, 1, 2});
      s.logit_offsets.clear();
      for (int i = 0; i < n; ++i) s.logit_offsets.push_back(i);
      RoundInput in;
      in.seqs.push_back(s);
      auto out = b->Step(in);
      EXPECT_TRUE(out.ok());
      for (int i = 0; i < n; ++i)
        rows.emplace_back(out->logits[0].begin() + i * 512, out->logits[0].begin() + (i + 1) * 512);
    }
    return rows;
  };
  const auto whole = run(40);
  for (int chunk : {1, 3, 16}) {
    const auto parts = run(chunk);
    ASSERT_EQ(parts.size(), whole.size());
    for (size_t p = 0; p < whole.size(); ++p) {
      ASSERT_EQ(std::memcmp(parts[p].data(), whole[p].data(), 512 * sizeof(float)), 0)
          << "chunk " << chunk << " position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, ChunkingTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kFP8E4M3),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace ringlane::worker
