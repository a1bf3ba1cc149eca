// Rotary position embedding frequencies. Shared by every backend so that all
// of them rotate by the same angles.
#ifndef RINGLANE_WORKER_MODEL_ROPE_H_
#define RINGLANE_WORKER_MODEL_ROPE_H_

#include <vector>

#include "worker/model/model.h"

namespace ringlane::worker {

// The head_dim / 2 inverse frequencies theta^(-2i / head_dim), computed in
// float as llama2.c and Hugging Face do, with the config's scaling applied:
// "linear" divides every frequency by the factor; "llama3" divides the low
// frequencies (wavelength above original_max_position / low_freq_factor) by the
// factor, keeps the high ones (wavelength below original_max_position /
// high_freq_factor) and blends in between; "yarn" ramps between the original
// and the interpolated frequencies (rope.cc).
std::vector<float> RopeInverseFrequencies(const ModelConfig& c);

// The factor DeepSeek's latent attention multiplies its softmax scale by twice
// under YaRN: 0.1 * mscale_all_dim * ln(factor) + 1, or 1 when not scaled.
double YarnSoftmaxMscale(const RopeScaling& s);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_ROPE_H_
