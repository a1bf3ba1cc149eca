#include "router/request/stop_matcher.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ringlane::router {
namespace {

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
// The boundary argument in the class comment needs the stop strings to be
// valid; proto3 strings should already be, but the gateway may build them.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (b0 < 0x80) {
      ++i;
      continue;
    } else if ((b0 & 0xe0) == 0xc0) {
      len = 2;
      cp = b0 & 0x1f;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3;
      cp = b0 & 0x0f;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4;
      cp = b0 & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

std::vector<int> FailureTable(const std::string& p) {
  std::vector<int> f(p.size(), 0);
  int k = 0;
  for (size_t i = 1; i < p.size(); ++i) {
    while (k > 0 && p[i] != p[k]) k = f[k - 1];
    if (p[i] == p[k]) ++k;
    f[i] = k;
  }
  return f;
}

}  // namespace

absl::StatusOr<StopMatcher> StopMatcher::Create(std::vector<std::string> stop_strings,
                                                int max_stop_strings) {
  if (static_cast<int64_t>(stop_strings.size()) > max_stop_strings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", max_stop_strings, " stop strings are allowed, got ", stop_strings.size()));
  }
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is empty"));
    }
    if (!IsValidUtf8(stop_strings[i])) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is not valid UTF-8"));
    }
  }
  return StopMatcher(std::move(stop_strings));
}

StopMatcher::StopMatcher(std::vector<std::string> stops)
    : stops_(std::move(stops)), matched_(stops_.size(), 0) {
  failure_.reserve(stops_.size());
  for (const std::string& s : stops_) failure_.push_back(FailureTable(s));
}

StopMatcher::Output StopMatcher::Feed(std::string_view increment) {
  Output out;
  if (stopped() || finished_) return out;
  const size_t first_new = held_.size();
  held_.append(increment);
  // Byte by byte, so that of two stop strings completing in one increment the
  // one completing first wins, as it would have with one token per increment.
  for (size_t i = first_new; i < held_.size(); ++i) {
    const char c = held_[i];
    int winner = -1;
    for (size_t s = 0; s < stops_.size(); ++s) {
      const std::string& p = stops_[s];
      int k = matched_[s];
      while (k > 0 && p[k] != c) k = failure_[s][k - 1];
      if (p[k] == c) ++k;
      matched_[s] = k;
      if (k == static_cast<int>(p.size()) && (winner < 0 || p.size() > stops_[winner].size())) {
        winner = static_cast<int>(s);
      }
    }
    if (winner >= 0) {
      // held_ holds at least the stop string: it kept every partial match
      // and grew by one byte per step of matched_.
      out.text = held_.substr(0, i + 1 - stops_[winner].size());
      out.matched_stop = winner;
      matched_stop_ = winner;
      held_.clear();
      return out;
    }
  }
  const size_t keep = stops_.empty() ? 0 : *std::max_element(matched_.begin(), matched_.end());
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Finish() {
  // Empty after a stop or an earlier Finish: both leave nothing held.
  finished_ = true;
  std::string rest = std::move(held_);
  held_.clear();
  return rest;
}

absl::StatusOr<StopTokens> StopTokens::Create(absl::Span<const int32_t> stop_token_ids,
                                              absl::Span<const int32_t> eos_token_ids,
                                              bool ignore_eos, int32_t vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be positive, got ", vocab_size));
  }
  StopTokens t;
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    t.stop_ids_.push_back(id);
  }
  if (!ignore_eos) t.eos_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
  for (std::vector<int32_t>* v : {&t.stop_ids_, &t.eos_ids_}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  return t;
}

StopTokens::Kind StopTokens::Check(int32_t token_id) const {
  if (std::binary_search(stop_ids_.begin(), stop_ids_.end(), token_id)) return Kind::kStopTokenId;
  if (std::binary_search(eos_ids_.begin(), eos_ids_.end(), token_id)) return Kind::kEos;
  return Kind::kNone;
}

}  // namespace ringlane::router
