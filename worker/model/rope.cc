#include "worker/model/rope.h"

#include <cmath>
#include <numbers>

namespace ringlane::worker {

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
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
