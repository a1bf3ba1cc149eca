#include "router/sched/scheduler.h"

#include <algorithm>
#include <cmath>

#include "nlohmann/json.hpp"

namespace ringlane::router {

void RoundCostModel::Observe(int64_t tokens, double round_us, double attended, double worker_us) {
  const double x1 = static_cast<double>(tokens), x2 = attended, y = round_us;
  auto add = [this](double& acc, double v) { acc = acc * decay_ + v; };
  add(w_, 1);
  add(s1_, x1);
  add(s2_, x2);
  add(sy_, y);
  add(s11_, x1 * x1);
  add(s12_, x1 * x2);
  add(s22_, x2 * x2);
  add(s1y_, x1 * y);
  add(s2y_, x2 * y);
  ++samples_;
  if (tokens >= 1 && tokens <= kTableTokens) {
    // The first rounds of a size set its mean; later ones move it by the
    // size's own decay (not every round's: a size seen rarely keeps its mean).
    int64_t& n = size_count_[tokens];
    const double keep = std::min(decay_, static_cast<double>(n) / static_cast<double>(n + 1));
    if (tokens == 1) one_token_mean_ = one_token_mean_ * keep + y * (1 - keep);
    const double w = worker_us < 0 ? y : std::min(worker_us, y);
    size_worker_mean_[tokens] = size_worker_mean_[tokens] * keep + w * (1 - keep);
    ++n;
  }
}

double RoundCostModel::SmallRoundUs(int64_t tokens) const {
  bool any = false;
  for (int64_t t = 1; t <= kTableTokens && !any; ++t) any = size_count_[t] >= kTableMinSamples;
  if (!any) return PredictUs(tokens);
  const double one = size_count_[1] >= kTableMinSamples ? one_token_mean_ : PredictUs(1);
  return one + std::max(0.0, WorkerUs(tokens) - WorkerUs(1));
}

double RoundCostModel::WorkerUs(int64_t tokens) const {
  const std::array<double, kTableTokens + 1>& mean = size_worker_mean_;
  auto measured = [this](int64_t t) { return size_count_[t] >= kTableMinSamples; };
  int64_t lo = 0, hi = 0;
  for (int64_t t = std::min(tokens, kTableTokens); t >= 1 && lo == 0; --t) {
    if (measured(t)) lo = t;
  }
  for (int64_t t = std::max<int64_t>(tokens, 1); t <= kTableTokens && hi == 0; ++t) {
    if (measured(t)) hi = t;
  }
  const double slope = per_token_us();
  if (lo != 0 && lo == hi) return mean[lo];
  // Above a measured size: the slope just below it continued (the fit's
  // without a second measured size), and no more than the chord to the next
  // measured size. Optimistic on purpose: costs of n rows are flat and then
  // steep, so a chord across the bend overstates the sizes inside it, and a
  // depth whose size was never measured would never be tried; tried, its
  // size is measured.
  double local = slope;
  for (int64_t t = lo - 1; t >= 1 && lo != 0; --t) {
    if (measured(t)) {
      local = std::max(0.0, (mean[lo] - mean[t]) / static_cast<double>(lo - t));
      break;
    }
  }
  if (lo != 0 && hi != 0) {
    const double f = static_cast<double>(tokens - lo) / static_cast<double>(hi - lo);
    return std::min(mean[lo] + f * (mean[hi] - mean[lo]),
                    mean[lo] + local * static_cast<double>(tokens - lo));
  }
  // Past the last measured size the cheaper of that slope and the fit's (a
  // noisy pair of sizes must not bar the depths beyond them).
  if (lo != 0) return mean[lo] + std::min(local, slope) * static_cast<double>(tokens - lo);
  if (hi != 0) return std::max(0.0, mean[hi] - slope * static_cast<double>(hi - tokens));
  return PredictUs(tokens);
}

namespace {
// Below this weighted variance of round sizes the slope is noise.
constexpr double kMinVariance = 0.25;
}  // namespace

bool RoundCostModel::ready() const {
  if (samples_ < 3 || w_ <= 0) return false;
  const double m1 = s1_ / w_;
  return s11_ / w_ - m1 * m1 >= kMinVariance;
}

RoundCostModel::Coefficients RoundCostModel::Fit() const {
  Coefficients c;
  if (w_ <= 0) return c;
  const double m1 = s1_ / w_, m2 = s2_ / w_, my = sy_ / w_;
  c.fixed = std::max(0.0, my);
  if (!ready()) return c;
  const double v11 = s11_ / w_ - m1 * m1, v22 = s22_ / w_ - m2 * m2;
  const double v12 = s12_ / w_ - m1 * m2;
  const double c1 = s1y_ / w_ - m1 * my, c2 = s2y_ / w_ - m2 * my;
  // Both slopes, when the rounds separate them (the two inputs not nearly
  // collinear) and both come out non-negative.
  const double det = v11 * v22 - v12 * v12;
  if (v22 > 0 && det > 1e-6 * v11 * v22) {
    const double b = (c1 * v22 - c2 * v12) / det, a2 = (c2 * v11 - c1 * v12) / det;
    if (b >= 0 && a2 >= 0) {
      c.per_token = b;
      c.per_attended = a2;
      c.fixed = std::max(0.0, my - b * m1 - a2 * m2);
      return c;
    }
  }
  c.per_token = std::max(0.0, c1 / v11);
  c.fixed = std::max(0.0, my - c.per_token * m1);
  return c;
}

int64_t PrefillTokenLimit(int64_t num_decode_rows, int64_t round_token_budget, double itl_target_us,
                          const RoundCostModel& model, int64_t min_chunk, double decode_attended,
                          int64_t prefill_start) {
  const int64_t room = std::max<int64_t>(0, round_token_budget - num_decode_rows);
  if (room == 0) return 0;
  if (num_decode_rows == 0 || itl_target_us <= 0) return room;
  const int64_t floor_chunk = std::min(min_chunk, room);
  if (!model.ready()) return floor_chunk;
  auto fits = [&](int64_t chunk) {
    return model.PredictUs(num_decode_rows + chunk,
                           decode_attended + AttendedPairs(prefill_start, chunk)) <= itl_target_us;
  };
  // Predicted time grows with the chunk: the largest chunk that fits.
  int64_t lo = 0, hi = room;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return std::max(lo, floor_chunk);
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

int64_t TokensAfterPlannedRounds(int64_t generated_before, int64_t prompt_len, int64_t fed) {
  if (fed < prompt_len) return generated_before;
  return generated_before + (fed - prompt_len) + 1;
}

double RoundBusyUs(double sent_us, double previous_done_us, double done_us) {
  return std::max(0.0, done_us - std::max(sent_us, previous_done_us));
}

std::string FormatRoundLog(const RoundLogEntry& entry) {
  nlohmann::json rows = nlohmann::json::array();
  int64_t tokens = 0;
  for (const RoundLogRow& r : entry.rows) {
    const char* kind = r.kind == RoundLogRow::Kind::kPrefill  ? "prefill"
                       : r.kind == RoundLogRow::Kind::kDecode ? "decode"
                                                              : "release";
    rows.push_back({{"lane", r.lane_id},
                    {"kind", kind},
                    {"start", r.start_position},
                    {"tokens", r.tokens},
                    {"sample", r.sample},
                    {"request", r.request_id}});
    tokens += r.tokens;
  }
  nlohmann::json j = {
      {"round", entry.round_id},      {"group", entry.group}, {"budget", entry.token_budget},
      {"in_flight", entry.in_flight}, {"tokens", tokens},     {"rows", std::move(rows)}};
  // Request ids come from clients: replace bad UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ringlane::router
