// Element types the engine stores weights and KV in, and exact scalar
// conversions between them and float. These scalar routines are the reference
// the vector kernels are tested against; they are exact where the format allows
// (every BF16, F16 and E4M3 value is a float) and round to nearest even when
// narrowing.
#ifndef RINGLANE_WORKER_DTYPE_H_
#define RINGLANE_WORKER_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringlane::worker {

enum class DType { kF32, kBF16, kF16, kFP8E4M3 };

// Bytes per element.
size_t DTypeSize(DType t);
// "F32", "BF16", "F16", "F8_E4M3" (the safetensors spelling).
std::string_view DTypeName(DType t);
// Parses a safetensors dtype name; other names are an InvalidArgument error.
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);
// Parses a user-facing name: "f32"/"fp32", "bf16", "f16"/"fp16", "fp8"/"fp8_e4m3".
absl::StatusOr<DType> ParseDTypeFlag(std::string_view name);

// FP8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN, max 448).
inline constexpr float kFp8E4M3Max = 448.0f;
// FP8 checkpoints and the KV cache quantize in blocks of this many rows/columns.
inline constexpr int kFp8BlockSize = 128;

inline float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN.
uint16_t FloatToBf16(float f);

float F16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);

float Fp8E4M3ToFloat(uint8_t v);
// Round to nearest even, saturating to +-448; NaN maps to 0x7f.
uint8_t FloatToFp8E4M3(float f);

// Converts element i of a row stored in `t` to float.
float LoadAsFloat(DType t, const void* row, size_t i);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_DTYPE_H_
