#include "router/scheduler.h"

#include <algorithm>
#include <cmath>

namespace ringlane::router {

void RoundCostModel::Observe(int64_t tokens, double round_us) {
  const double x = static_cast<double>(tokens);
  w_ = w_ * decay_ + 1;
  sx_ = sx_ * decay_ + x;
  sy_ = sy_ * decay_ + round_us;
  sxx_ = sxx_ * decay_ + x * x;
  sxy_ = sxy_ * decay_ + x * round_us;
  ++samples_;
}

namespace {
// Below this weighted variance of round sizes the slope is noise.
constexpr double kMinVariance = 0.25;
}  // namespace

bool RoundCostModel::ready() const {
  if (samples_ < 3 || w_ <= 0) return false;
  const double mx = sx_ / w_;
  return sxx_ / w_ - mx * mx >= kMinVariance;
}

double RoundCostModel::per_token_us() const {
  if (!ready()) return 0;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = sxx_ / w_ - mx * mx;
  const double cov = sxy_ / w_ - mx * my;
  return std::max(0.0, cov / var);
}

double RoundCostModel::fixed_us() const {
  if (w_ <= 0) return 0;
  const double mx = sx_ / w_, my = sy_ / w_;
  return std::max(0.0, my - per_token_us() * mx);
}

int64_t PrefillTokenLimit(int64_t num_decode_rows, int64_t round_token_budget, double itl_target_us,
                          const RoundCostModel& model, int64_t min_chunk) {
  const int64_t room = std::max<int64_t>(0, round_token_budget - num_decode_rows);
  if (room == 0) return 0;
  if (num_decode_rows == 0 || itl_target_us <= 0 || !model.ready()) return room;
  const double per_token = model.per_token_us();
  if (per_token <= 0) return room;
  const double total = (itl_target_us - model.fixed_us()) / per_token;
  const int64_t fit =
      std::isfinite(total) ? static_cast<int64_t>(std::floor(total)) - num_decode_rows : room;
  return std::clamp<int64_t>(fit, std::min(min_chunk, room), room);
}

std::optional<size_t> PickPreemptionVictim(absl::Span<const PreemptCandidate> lanes) {
  std::optional<size_t> best;
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (lanes[i].in_plan || !lanes[i].holds_blocks) continue;
    if (!best || lanes[i].admit_seq > lanes[*best].admit_seq) best = i;
  }
  return best;
}

bool AdmitToQueue(int64_t waiting, int64_t num_lanes, int64_t max_waiting) {
  if (waiting == 0) return true;
  return waiting + num_lanes <= max_waiting;
}

}  // namespace ringlane::router
