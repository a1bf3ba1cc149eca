// FP8 (E4M3, 128x128 block scales) and BF16 weights agree with the F32
// weights they were quantized from, within the precision of their formats.
//
// Tolerances: BF16 keeps 8 significant bits (relative rounding error at most
// 2^-9, about 0.2%), E4M3 keeps 4 (at most 2^-4, 6%, and less than that in
// RMS over a block). Quantization errors of independent weights add like a
// random walk, so the logits' relative RMS error stays within a small multiple
// of the per-weight error after a few layers: the worst position here measured
// 0.0053 (BF16) and 0.072 (FP8), with top-1 agreement 1.0 and 0.875. The bounds
// (0.02 and 0.15; top-1 at least 0.95 and 0.75) leave about 2x room for other
// seeds and shapes while still failing on any real mistake: a wrong block
// scale, a misplaced row or a transposed tensor all give errors of order 1.
#include <cmath>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/lane_runner.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/model/synthetic.h"

namespace ringlane {
namespace {

std::unique_ptr<worker::Backend> Build(worker::DType dt) {
  worker::SyntheticModelOptions o;
  o.out_dir = ::testing::TempDir() + "/rl_dtype_" + std::string(worker::DTypeName(dt));
  o.hidden = 256;
  o.intermediate = 640;
  o.layers = 3;
  o.heads = 8;
  o.kv_heads = 4;
  o.vocab = 512;
  o.max_position = 256;
  o.dtype = dt;
  o.seed = 42;
  auto b = testing::MakeSyntheticBackend(o, {16, 16, worker::DType::kF32});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

struct Agreement {
  double rel_rms = 0;     // worst over positions of ||l - ref|| / ||ref||
  double top1_agree = 0;  // fraction of positions with the same argmax
};

Agreement Compare(worker::DType dt) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back((i * 193 + 11) % 512);
  auto ref = testing::TeacherForcedLogits(Build(worker::DType::kF32).get(), tokens, 16);
  auto got = testing::TeacherForcedLogits(Build(dt).get(), tokens, 16);
  EXPECT_TRUE(ref.ok() && got.ok());
  Agreement a;
  int same = 0;
  for (size_t p = 0; p < ref->size(); ++p) {
    const auto& r = (*ref)[p];
    const auto& g = (*got)[p];
    double num = 0, den = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      num += (g[i] - r[i]) * double(g[i] - r[i]);
      den += r[i] * double(r[i]);
    }
    a.rel_rms = std::max(a.rel_rms, std::sqrt(num / den));
    same += std::max_element(r.begin(), r.end()) - r.begin() ==
            std::max_element(g.begin(), g.end()) - g.begin();
  }
  a.top1_agree = double(same) / ref->size();
  return a;
}

TEST(DtypeAgreement, Bf16WeightsMatchF32) {
  Agreement a = Compare(worker::DType::kBF16);
  std::printf("BF16 vs F32: worst relative RMS logit error %.5f, top-1 agreement %.3f\n", a.rel_rms,
              a.top1_agree);
  EXPECT_LT(a.rel_rms, 0.02);
  EXPECT_GE(a.top1_agree, 0.95);
}

TEST(DtypeAgreement, Fp8WeightsMatchF32) {
  Agreement a = Compare(worker::DType::kFP8E4M3);
  std::printf("FP8 vs F32: worst relative RMS logit error %.5f, top-1 agreement %.3f\n", a.rel_rms,
              a.top1_agree);
  EXPECT_LT(a.rel_rms, 0.15);
  EXPECT_GE(a.top1_agree, 0.75);
}

}  // namespace
}  // namespace ringlane
