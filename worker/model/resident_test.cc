#include "worker/model/resident.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/safetensors.h"
#include "worker/model/shard.h"
#include "worker/model/synthetic.h"
#include "worker/testing/models.h"

namespace ringlane::worker {
namespace {

std::vector<const Matrix*> Matrices(const ModelWeights& m) {
  std::vector<const Matrix*> out;
  ForEachMatrix(m, [&](const Matrix& x) { out.push_back(&x); });
  return out;
}

bool Inside(const void* p, const std::vector<std::shared_ptr<MappedFile>>& files) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& f : files) {
    if (b >= f->data() && b < f->data() + f->size()) return true;
  }
  return false;
}

// Every matrix of `copy` holds the elements of the same matrix of `model`, in
// rows of exactly `cols` elements (FP8 ones of whole 128-column blocks in
// interleaved groups and tiles of rows), outside the model's files (the embedding stays in
// place); the views, offsets and scales are the model's.
void ExpectSameMatrices(const ModelWeights& model, const ModelWeights& copy,
                        const std::vector<std::shared_ptr<MappedFile>>& files) {
  const std::vector<const Matrix*> a = Matrices(model), b = Matrices(copy);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(b[0]->data, a[0]->data) << "the embedding is read a row per token: not copied";
  for (size_t i = 0; i < a.size(); ++i) {
    const Matrix& x = *a[i];
    const Matrix& y = *b[i];
    ASSERT_EQ(y.rows, x.rows);
    ASSERT_EQ(y.cols, x.cols);
    EXPECT_EQ(y.dtype, x.dtype);
    EXPECT_EQ(y.scale, x.scale);
    EXPECT_EQ(y.row_offset, x.row_offset);
    EXPECT_EQ(y.col_offset, x.col_offset);
    if (i == 0) continue;
    EXPECT_FALSE(Inside(y.data, files)) << "matrix " << i << " still views the file";
    const int64_t es = static_cast<int64_t>(DTypeSize(x.dtype));
    EXPECT_EQ(y.row_stride_bytes, x.cols * es);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data) % 64, 0u);
    EXPECT_FALSE(x.interleaved);
    EXPECT_EQ(y.interleaved,
              x.dtype == DType::kFP8E4M3 && x.cols % 128 == 0 && x.col_offset % 64 == 0)
        << "matrix " << i;
    EXPECT_EQ(y.row_tile, y.interleaved ? kResidentRowTile : 1) << "matrix " << i;
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t c = 0; c < x.cols; ++c) {
        ASSERT_EQ(std::memcmp(y.Row(r) + y.StoredColumn(c) * es, x.Row(r) + c * es, es), 0)
            << "matrix " << i << " row " << r << " column " << c;
      }
    }
  }
}

std::string WriteModel(const std::string& name, SyntheticModelOptions o) {
  o.out_dir = ::testing::TempDir() + "/resident_" + name;
  std::filesystem::remove_all(o.out_dir);
  const absl::Status st = WriteSyntheticModel(o);
  EXPECT_TRUE(st.ok()) << st;
  return o.out_dir;
}

TEST(Resident, CopiesEveryMatrixOfTheBundledModel) {
  auto model = BundledStories();
  ASSERT_NE(model, nullptr);
  ResidentReport report;
  auto r = MakeResident(model, &report);
  ASSERT_TRUE(r.ok()) << r.status();
  if (!report.huge_pages) GTEST_SKIP() << "transparent huge pages are off on this machine";
  ExpectSameMatrices(*model, **r, model->files);
  // 5 layers x 7 matrices, and the head tied to the embedding (copied once).
  EXPECT_EQ(report.matrices, 5 * 7 + 1);
}

// The FP8 DeepSeek-family model with its MTP layer, whole and as a shard
// (column views of the row-parallel matrices), and the drafter view that
// shares the MTP layer's matrices.
TEST(Resident, CopiesFp8MoeShardsAndTheMtpLayer) {
  SyntheticModelOptions o;
  o.family = "glm_moe_dsa";
  o.dtype = DType::kFP8E4M3;
  o.hidden = 256;
  o.layers = 3;
  o.heads = 4;
  o.mtp_layers = 1;
  const std::string dir = WriteModel("moe", o);
  auto loaded = LoadModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const ModelWeights> full(std::move(*loaded));

  ResidentReport report;
  auto whole = MakeResident(full, &report);
  ASSERT_TRUE(whole.ok()) << whole.status();
  if (!report.huge_pages) GTEST_SKIP() << "transparent huge pages are off on this machine";
  ExpectSameMatrices(*full, **whole, full->files);
  EXPECT_GT(report.interleaved, 0);
  EXPECT_EQ(report.row_tiled, report.interleaved);
  ASSERT_NE((*whole)->mtp, nullptr);
  EXPECT_NE((*whole)->mtp, full->mtp) << "the MTP layer's matrices are copied too";

  // Independent of the visitor: every 2-D tensor of the file except the
  // embedding and the block scales is a matrix the copy holds.
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  int64_t expected = 0;
  for (const SafetensorsTensor& t : file->tensors()) {
    if (t.shape.size() != 2 || t.name.find("embed_tokens") != std::string::npos ||
        t.name.find("scale_inv") != std::string::npos) {
      continue;
    }
    expected += static_cast<int64_t>(t.size_bytes);
  }
  EXPECT_EQ(report.bytes, expected);

  for (int rank = 0; rank < 2; ++rank) {
    auto shard = ShardModel(full, rank, 2);
    ASSERT_TRUE(shard.ok()) << shard.status();
    auto copy = MakeResident(*shard);
    ASSERT_TRUE(copy.ok()) << copy.status();
    ExpectSameMatrices(**shard, **copy, full->files);
  }

  auto drafter = MtpDrafter(full);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ResidentReport dr;
  auto dcopy = MakeResident(*drafter, &dr);
  ASSERT_TRUE(dcopy.ok()) << dcopy.status();
  ExpectSameMatrices(**drafter, **dcopy, full->files);
  // Its layer is the MTP layer: one copy serves both views.
  EXPECT_EQ((*dcopy)->layers[0].mla.wo.data, (*dcopy)->mtp->layer.mla.wo.data);
}

}  // namespace
}  // namespace ringlane::worker
