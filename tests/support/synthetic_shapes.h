// Synthetic model shapes that several engine tests share. Header-only.
#ifndef RINGLANE_TESTS_SUPPORT_SYNTHETIC_SHAPES_H_
#define RINGLANE_TESTS_SUPPORT_SYNTHETIC_SHAPES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "worker/dtype.h"
#include "worker/model/synthetic.h"

namespace ringlane::testing {

// Two layers of 8 query heads over 2 KV heads at hidden 256, FP8
// block-scaled weights: GQA with KV heads that TP4 must replicate, and FP8
// kernels past their 128-wide blocks. The MLP width, vocabulary and seed are
// the caller's (tails of the kernels, sizes of the sampler).
inline worker::SyntheticModelOptions Fp8GqaModel(std::string out_dir, int intermediate, int vocab,
                                                 uint64_t seed) {
  worker::SyntheticModelOptions o;
  o.out_dir = std::move(out_dir);
  o.hidden = 256;
  o.intermediate = intermediate;
  o.layers = 2;
  o.heads = 8;
  o.kv_heads = 2;
  o.vocab = vocab;
  o.dtype = worker::DType::kFP8E4M3;
  o.seed = seed;
  return o;
}

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_SYNTHETIC_SHAPES_H_
