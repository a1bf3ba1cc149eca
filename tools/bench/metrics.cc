#include "tools/bench/metrics.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace ringlane::bench {
namespace {

bool IsNameChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

// Parses `{a="x",b="y"}` starting at text[*pos] == '{'; leaves *pos after '}'.
bool ParseLabels(std::string_view text, size_t* pos, std::map<std::string, std::string>* labels) {
  size_t i = *pos + 1;
  for (;;) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size()) return false;
    if (text[i] == '}') {
      *pos = i + 1;
      return true;
    }
    const size_t name_start = i;
    while (i < text.size() && IsNameChar(text[i], i == name_start)) ++i;
    std::string name(text.substr(name_start, i - name_start));
    if (name.empty() || i + 1 >= text.size() || text[i] != '=' || text[i + 1] != '"') return false;
    i += 2;
    std::string value;
    for (;;) {
      if (i >= text.size()) return false;
      const char c = text[i++];
      if (c == '"') break;
      if (c == '\\' && i < text.size()) {
        const char e = text[i++];
        value.push_back(e == 'n' ? '\n' : e);
      } else {
        value.push_back(c);
      }
    }
    (*labels)[name] = value;
  }
}

}  // namespace

std::vector<MetricSample> ParsePrometheusText(std::string_view text) {
  std::vector<MetricSample> out;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    std::string_view line(raw.data(), raw.size());
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    MetricSample s;
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
    if (i == 0) continue;
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{' && !ParseLabels(line, &i, &s.labels)) continue;
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t value_end = line.find(' ', i);
    const std::string value(line.substr(
        i, value_end == std::string_view::npos ? std::string_view::npos : value_end - i));
    if (value.empty()) continue;
    char* end = nullptr;
    // strtod reads "NaN", "+Inf" and "-Inf" as the format spells them.
    s.value = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size()) continue;
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<double> SumMetric(const std::vector<MetricSample>& samples, std::string_view name,
                                const std::map<std::string, std::string>& labels) {
  std::optional<double> sum;
  for (const MetricSample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) sum = sum.value_or(0) + s.value;
  }
  return sum;
}

CounterValues ReadRinglaneCounters(const std::vector<MetricSample>& samples) {
  CounterValues out;
  for (const ServerCounter& c : kRinglaneCounters) {
    std::map<std::string, std::string> labels;
    if (c.label != nullptr) labels[c.label] = c.value;
    if (std::optional<double> v = SumMetric(samples, c.metric, labels)) out[c.key] = *v;
  }
  return out;
}

CounterValues CounterDelta(const CounterValues& before, const CounterValues& after) {
  CounterValues out;
  for (const auto& [k, v] : after) {
    auto it = before.find(k);
    out[k] = it != before.end() ? v - it->second : v;
  }
  return out;
}

StepStats ComputeStepStats(const CounterValues& delta) {
  auto ratio = [&delta](const char* num, const char* den) -> std::optional<double> {
    auto n = delta.find(num);
    auto d = delta.find(den);
    if (n == delta.end() || d == delta.end() || !(d->second > 0)) return std::nullopt;
    return n->second / d->second;
  };
  StepStats s;
  s.tokens_per_step = ratio("generation_tokens", "sampling_rows");
  s.draft_acceptance = ratio("spec_accepted_tokens", "spec_drafted_tokens");
  s.accepted_per_verify_row = ratio("spec_accepted_tokens", "spec_verify_rows");
  return s;
}

bool CountersWentDown(const CounterValues& before, const CounterValues& after) {
  for (const auto& [k, v] : after) {
    auto it = before.find(k);
    if (it != before.end() && v < it->second) return true;
  }
  return false;
}

}  // namespace ringlane::bench
