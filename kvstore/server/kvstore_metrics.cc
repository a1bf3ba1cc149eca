#include "kvstore/server/kvstore_metrics.h"

#include <string>
#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace ringlane::kvstore {

namespace {

using Labels = std::vector<prometheus::ClientMetric::Label>;

// One family with one sample per label set.
prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type,
                                std::vector<std::pair<Labels, double>> samples) {
  prometheus::MetricFamily f{name, help, type, {}};
  for (auto& [labels, v] : samples) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = v;
    } else {
      m.gauge.value = v;
    }
    f.metric.push_back(std::move(m));
  }
  return f;
}

Labels Tier(const char* t) { return {{"tier", t}}; }

}  // namespace

std::vector<prometheus::MetricFamily> KvStoreCollector::Collect() const {
  const v1::StatsResponse s = store_->Stats();
  using T = prometheus::MetricType;
  auto d = [](int64_t v) { return static_cast<double>(v); };
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Family("ringlane_kvstore_hits_total", "Blocks a Get found, by tier", T::Counter,
                       {{Tier("dram"), d(s.dram().hits())}, {Tier("disk"), d(s.disk().hits())}}));
  out.push_back(Family("ringlane_kvstore_misses_total",
                       "Gets that stopped at a key no tier had (a failed disk check included)",
                       T::Counter, {{{}, d(s.misses())}}));
  out.push_back(Family("ringlane_kvstore_checksum_failures_total",
                       "Blocks whose bytes did not match their XXH64: read from disk (dropped, "
                       "a miss) or received by Put (rejected with DATA_LOSS)",
                       T::Counter,
                       {{{{"where", "disk"}}, d(s.checksum_failures_disk())},
                        {{{"where", "put"}}, d(s.checksum_failures_put())}}));
  out.push_back(Family("ringlane_kvstore_bytes_in_total", "Payload bytes received by Put",
                       T::Counter, {{{}, d(s.bytes_in())}}));
  out.push_back(Family("ringlane_kvstore_bytes_out_total", "Payload bytes sent by Get", T::Counter,
                       {{{}, d(s.bytes_out())}}));
  out.push_back(Family("ringlane_kvstore_blocks_stored_total",
                       "New blocks stored by Put (repeats only refresh recency)", T::Counter,
                       {{{}, d(s.blocks_stored())}}));
  out.push_back(Family(
      "ringlane_kvstore_evictions_total", "Entries pushed out to make room, by tier", T::Counter,
      {{Tier("dram"), d(s.dram().evictions())}, {Tier("disk"), d(s.disk().evictions())}}));
  out.push_back(Family("ringlane_kvstore_demotions_total",
                       "DRAM entries written to the disk tier when evicted", T::Counter,
                       {{{}, d(s.demotions())}}));
  out.push_back(
      Family("ringlane_kvstore_entries", "Entries stored, by tier", T::Gauge,
             {{Tier("dram"), d(s.dram().entries())}, {Tier("disk"), d(s.disk().entries())}}));
  out.push_back(Family("ringlane_kvstore_bytes", "Payload bytes stored, by tier", T::Gauge,
                       {{Tier("dram"), d(s.dram().bytes())}, {Tier("disk"), d(s.disk().bytes())}}));
  out.push_back(Family("ringlane_kvstore_capacity_bytes",
                       "Configured payload byte limit, by tier (0: no disk tier)", T::Gauge,
                       {{Tier("dram"), d(s.dram().capacity_bytes())},
                        {Tier("disk"), d(s.disk().capacity_bytes())}}));
  if (service_ != nullptr) {
    out.push_back(Family("ringlane_kvstore_rejected_calls_total",
                         "Calls refused: busy (over --max_concurrent_calls) or invalid "
                         "(INVALID_ARGUMENT)",
                         T::Counter,
                         {{{{"reason", "busy"}}, d(service_->rejected_busy())},
                          {{{"reason", "invalid"}}, d(service_->rejected_invalid())}}));
  }
  return out;
}

}  // namespace ringlane::kvstore
