#include "worker/dtype.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringlane::worker {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kFP8E4M3:
      return 1;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kFP8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kFP8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unsupported tensor dtype '", std::string(name),
                                                 "' (supported: F32, BF16, F16, F8_E4M3)"));
}

absl::StatusOr<DType> ParseDTypeFlag(std::string_view name) {
  std::string n = absl::AsciiStrToLower(std::string(name));
  if (n == "f32" || n == "fp32" || n == "float32") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "fp16" || n == "float16") return DType::kF16;
  if (n == "fp8" || n == "fp8_e4m3" || n == "f8_e4m3" || n == "e4m3") return DType::kFP8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "' (expected f32, bf16, f16 or fp8)"));
}

uint16_t FloatToBf16(float f) {
  uint32_t b = FloatToBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>((b + rounding) >> 16);
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float.
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000 | (man << 13));
  return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t FloatToF16(float f) {
  uint32_t b = FloatToBits(f);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {
    // Subnormal range: quantum 2^-24; nearbyint rounds half to even.
    float q = std::nearbyint(std::ldexp(a, 24));
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t ab = FloatToBits(a);
  uint32_t exp = (ab >> 23) - 112;
  uint32_t man = ab & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  // may carry into the exponent: correct
  return sign | static_cast<uint16_t>(h);
}

float Fp8E4M3ToFloat(uint8_t v) {
  uint32_t sign = v & 0x80;
  uint32_t exp = (v >> 3) & 0xf;
  uint32_t man = v & 0x7;
  float r;
  if ((v & 0x7f) == 0x7f) {
    r = std::nanf("");
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    r = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -r : r;
}

uint8_t FloatToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  // Smallest normal is 2^-6; below it the quantum is 2^-9.
  if (a < 0.015625f) {
    float q = std::nearbyint(std::ldexp(a, 9));  // 0..8; 8 is the smallest normal 0x08
    return sign | static_cast<uint8_t>(q);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // a = (1 + frac) * 2^(e-1); three fraction bits -> quantum 2^(e-4).
  float q = std::nearbyint(std::ldexp(a, 4 - e));  // in [8, 16]
  int exp = e - 1 + 7;
  int qi = static_cast<int>(q);
  if (qi == 16) {
    qi = 8;
    exp++;
  }
  (void)m;
  uint8_t bits = static_cast<uint8_t>((exp << 3) | (qi - 8));
  if ((bits & 0x7f) == 0x7f) bits = 0x7e;  // 464 would round into the NaN code: saturate
  return sign | bits;
}

float LoadAsFloat(DType t, const void* row, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(row)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(row)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(row)[i]);
    case DType::kFP8E4M3:
      return Fp8E4M3ToFloat(static_cast<const uint8_t*>(row)[i]);
  }
  return 0.0f;
}

}  // namespace ringlane::worker
