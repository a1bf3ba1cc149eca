// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel Random
// Numbers: As Easy as 1, 2, 3" (SC11), and the one uniform draw the sampler
// takes from it.
//
// Sampling keys the generator by (seed, choice index, absolute position) rather
// than advancing a stream (DESIGN.md, "Determinism with a knob"): the random
// number for position p of choice i is a pure function of those values, so it
// does not depend on batching, on preemption and replay, or on how many draft
// tokens speculative decoding verified before it. Pure functions; safe to call
// from any thread.
#ifndef RINGLANE_WORKER_PHILOX_H_
#define RINGLANE_WORKER_PHILOX_H_

#include <array>
#include <cstdint>

namespace ringlane::worker {

namespace philox_internal {

inline constexpr uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
// Weyl sequence increments for the key schedule (golden ratio and sqrt(3)-1).
inline constexpr uint32_t kKeyBump0 = 0x9E3779B9u;
inline constexpr uint32_t kKeyBump1 = 0xBB67AE85u;
inline constexpr int kRounds = 10;

// One S-box/P-box round: two 32x32->64 multiplies, the high halves XORed with
// the other words and the key, the words permuted as in Random123.
inline constexpr std::array<uint32_t, 4> Round(const std::array<uint32_t, 4>& x,
                                               const std::array<uint32_t, 2>& key) {
  const uint64_t p0 = static_cast<uint64_t>(kMultiplier0) * x[0];
  const uint64_t p1 = static_cast<uint64_t>(kMultiplier1) * x[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
  const uint32_t lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
  const uint32_t lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ x[1] ^ key[0], lo1, hi0 ^ x[3] ^ key[1], lo0};
}

}  // namespace philox_internal

// Philox4x32 with 10 rounds: maps a 128-bit counter and a 64-bit key to 128
// pseudo-random bits. Matches Random123's philox4x32_R(10, ctr, key) word for
// word, so its published known-answer vectors apply.
inline constexpr std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                                    std::array<uint32_t, 2> key) {
  for (int round = 0; round < philox_internal::kRounds; ++round) {
    if (round > 0) {
      // Unsigned wrap-around is the intended key schedule.
      key[0] += philox_internal::kKeyBump0;
      key[1] += philox_internal::kKeyBump1;
    }
    counter = philox_internal::Round(counter, key);
  }
  return counter;
}

// A uniform float in [0, 1) for choice `choice_index` at absolute token
// position `position` of a request seeded with `seed`. The key is the seed
// (low half first); the counter is {position low, position high, choice index,
// 0}. The top 24 bits of the first output word are scaled by 2^-24, so every
// value is exactly representable and the largest is 1 - 2^-24 < 1.
inline float UniformFloat(uint64_t seed, uint32_t choice_index, int64_t position) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const std::array<uint32_t, 4> out =
      Philox4x32({static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), choice_index, 0u},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  constexpr float kTwoPowMinus24 = 1.0f / 16777216.0f;
  return static_cast<float>(out[0] >> 8) * kTwoPowMinus24;
}

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_PHILOX_H_
