#ifndef RINGLANE_ROUTER_REQUEST_SEED_H_
#define RINGLANE_ROUTER_REQUEST_SEED_H_

// The seed a request samples with when the client gave none.
//
// DESIGN.md's second invariant: a request without a seed gets one derived from
// its prompt and sampling parameters, so an identical resend reproduces its
// output, unless the operator chose random seeds. Users keep such outputs and
// expect a resend to give them again after an upgrade, so DeriveSeed's result
// is part of the public contract: the byte encoding below (and XXH3-64 over it)
// must never change for the same inputs. seed_test.cc pins a golden value;
// a deliberate change needs a new encoding version and a release note.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringlane::router {

// The sampling parameters that decide which token is picked, after the
// server's defaults are applied (an absent temperature is the configured
// default, an absent top_p is 1). Fields that do not change the choice of
// token (top_logprobs, max_tokens, stop conditions) are left out on purpose,
// so a resend asking for more tokens or for logprobs continues the same text.
// The choice index is not an input either: the generator keys on it
// separately, which is what makes the n choices of one request differ.
struct SeedParams {
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1;
  float min_p = 0;
  float presence_penalty = 0;
  float frequency_penalty = 0;
};

// XXH3-64 (seed 0) of this little-endian encoding, the same on every platform:
//   "ringlane-seed-v1" (16 ASCII bytes)
//   u64 number of prompt tokens, then each token id as u32 (two's complement)
//   temperature, top_p, min_p, presence_penalty, frequency_penalty as the u32
//   bits of the IEEE-754 float, -0.0 written as +0.0 (they sample alike)
//   top_k as u32, every value <= 0 written as 0 (they all mean "off")
// NaN is not normalized; validated parameters never contain it.
uint64_t DeriveSeed(absl::Span<const int32_t> prompt_token_ids, const SeedParams& params);

// How the router picks the seed of a request that has none (a flag).
enum class SeedPolicy {
  kDerived,  // DeriveSeed: a resend reproduces (the default)
  kRandom,   // a fresh random seed per request
};

// "derived" or "random"; InvalidArgument naming the value otherwise.
absl::StatusOr<SeedPolicy> ParseSeedPolicy(std::string_view name);
std::string SeedPolicyName(SeedPolicy policy);

// The seed a request runs with: its explicit seed when it has one (always
// honoured, whatever the policy), otherwise per `policy`. `random_source` is
// called only for kRandom without an explicit seed; the caller owns the
// generator (tests pass a fixed one).
uint64_t ResolveSeed(std::optional<uint64_t> explicit_seed, SeedPolicy policy,
                     absl::Span<const int32_t> prompt_token_ids, const SeedParams& params,
                     absl::FunctionRef<uint64_t()> random_source);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_SEED_H_
