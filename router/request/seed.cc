#include "router/request/seed.h"

#include <xxhash.h>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringlane::router {
namespace {

// Changing this tag (or anything DeriveSeed writes) changes every derived
// seed; see the contract in seed.h.
constexpr std::string_view kEncodingTag = "ringlane-seed-v1";

// Writes bytes in little-endian order by shifting, so the encoding does not
// depend on the host's byte order.
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutFloat(std::string& out, float v) {
  if (v == 0.0f) v = 0.0f;  // -0.0 compares equal to 0.0 and samples the same
  PutU32(out, std::bit_cast<uint32_t>(v));
}

}  // namespace

uint64_t DeriveSeed(absl::Span<const int32_t> prompt_token_ids, const SeedParams& params) {
  std::string bytes;
  bytes.reserve(kEncodingTag.size() + 8 + 4 * prompt_token_ids.size() + 6 * 4);
  bytes.append(kEncodingTag);
  PutU64(bytes, prompt_token_ids.size());
  for (int32_t id : prompt_token_ids) PutU32(bytes, static_cast<uint32_t>(id));
  PutFloat(bytes, params.temperature);
  PutFloat(bytes, params.top_p);
  PutFloat(bytes, params.min_p);
  PutFloat(bytes, params.presence_penalty);
  PutFloat(bytes, params.frequency_penalty);
  PutU32(bytes, static_cast<uint32_t>(params.top_k > 0 ? params.top_k : 0));
  return XXH3_64bits(bytes.data(), bytes.size());
}

absl::StatusOr<SeedPolicy> ParseSeedPolicy(std::string_view name) {
  if (name == "derived") return SeedPolicy::kDerived;
  if (name == "random") return SeedPolicy::kRandom;
  return absl::InvalidArgumentError("seed policy must be \"derived\" or \"random\", got \"" +
                                    std::string(name) + "\"");
}

std::string SeedPolicyName(SeedPolicy policy) {
  switch (policy) {
    case SeedPolicy::kDerived:
      return "derived";
    case SeedPolicy::kRandom:
      return "random";
  }
  return "unknown";
}

uint64_t ResolveSeed(std::optional<uint64_t> explicit_seed, SeedPolicy policy,
                     absl::Span<const int32_t> prompt_token_ids, const SeedParams& params,
                     absl::FunctionRef<uint64_t()> random_source) {
  if (explicit_seed.has_value()) return *explicit_seed;
  if (policy == SeedPolicy::kRandom) return random_source();
  return DeriveSeed(prompt_token_ids, params);
}

}  // namespace ringlane::router
