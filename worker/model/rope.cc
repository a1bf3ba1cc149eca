#include "worker/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ringlane::worker {

namespace {

// YaRN (Peng et al. 2023, as transformers and DeepSeek-V3 compute it): the
// dimensions that rotate more than beta_fast times over the original context
// keep their frequency, those under beta_slow are interpolated by `factor`,
// and a linear ramp blends the ones between.
std::vector<float> YarnInverseFrequencies(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  const int dim = c.head_dim, half = dim / 2;
  const double base = c.rope_theta;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(s.original_max_position / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(correction_dim(s.beta_fast)));
  double high = std::min(dim - 1.0, std::ceil(correction_dim(s.beta_slow)));
  if (high == low) high += 0.001;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const double extrapolated = 1.0 / std::pow(base, 2.0 * i / dim);
    const double interpolated = extrapolated / s.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // the share that keeps its frequency
    inv[i] = static_cast<float>(interpolated * (1.0 - keep) + extrapolated * keep);
  }
  return inv;
}

}  // namespace

double YarnSoftmaxMscale(const RopeScaling& s) {
  if (s.type != "yarn" || s.mscale_all_dim == 0.0f || s.factor <= 1.0f) return 1.0;
  return 0.1 * s.mscale_all_dim * std::log(static_cast<double>(s.factor)) + 1.0;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  if (c.rope_scaling.type == "yarn") return YarnInverseFrequencies(c);
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // As llama2.c and Hugging Face compute it, in float.
    float f =
        1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
    const RopeScaling& s = c.rope_scaling;
    if (s.type == "linear") {
      f = f / s.factor;
    } else if (s.type == "llama3") {
      const float old_len = static_cast<float>(s.original_max_position);
      const float low_wavelen = old_len / s.low_freq_factor;
      const float high_wavelen = old_len / s.high_freq_factor;
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        float smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = f;
  }
  return inv;
}

}  // namespace ringlane::worker
