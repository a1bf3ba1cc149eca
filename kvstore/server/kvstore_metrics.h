// The kvstore's Prometheus series, read from Store::Stats() at every scrape
// (a Collectable registered with the exposer), so /metrics and the Stats RPC
// can never disagree and the store keeps one set of counters. Thread-safe:
// Collect runs on the exposer's thread and only calls Stats().
//
//   ringlane_kvstore_hits_total{tier}            blocks a Get found, by tier
//   ringlane_kvstore_misses_total                Gets that stopped at a key no tier had
//   ringlane_kvstore_checksum_failures_total{where}  disk (entry dropped) or put (rejected)
//   ringlane_kvstore_bytes_in_total / _bytes_out_total  payload bytes put / sent
//   ringlane_kvstore_blocks_stored_total         new blocks put
//   ringlane_kvstore_evictions_total{tier}       entries pushed out for room
//   ringlane_kvstore_demotions_total             DRAM entries written to disk
//   ringlane_kvstore_entries{tier}, ringlane_kvstore_bytes{tier},
//   ringlane_kvstore_capacity_bytes{tier}         occupancy and limits
//   ringlane_kvstore_rejected_calls_total{reason}  busy (over the call limit) or invalid
#ifndef RINGLANE_KVSTORE_SERVER_KVSTORE_METRICS_H_
#define RINGLANE_KVSTORE_SERVER_KVSTORE_METRICS_H_

#include <vector>

#include "kvstore/server/kvstore_service.h"
#include "kvstore/store.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace ringlane::kvstore {

class KvStoreCollector : public prometheus::Collectable {
 public:
  // Both must outlive the collector (unregister it from the exposer first).
  KvStoreCollector(const Store* store, const KvStoreService* service)
      : store_(store), service_(service) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Store* const store_;
  const KvStoreService* const service_;
};

}  // namespace ringlane::kvstore

#endif  // RINGLANE_KVSTORE_SERVER_KVSTORE_METRICS_H_
