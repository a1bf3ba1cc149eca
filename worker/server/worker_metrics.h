// The Prometheus metrics of a worker rank (served on --metrics_port). Every
// metric carries the labels group and rank.
#ifndef RINGLANE_WORKER_SERVER_WORKER_METRICS_H_
#define RINGLANE_WORKER_SERVER_WORKER_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ringlane::worker {

struct WorkerMetrics {
  // Registers the metrics in `registry` (which must outlive this).
  WorkerMetrics(prometheus::Registry& registry, const std::string& model, const std::string& group,
                int rank);

  prometheus::Counter* rounds_ok;
  prometheus::Counter* rounds_rejected;
  prometheus::Counter* rounds_failed;
  prometheus::Counter* tokens_fed;
  prometheus::Counter* tokens_sampled;
  prometheus::Counter* drafts_accepted;
  // Pipelined rows (LaneStep.assume_accepted) that turned out void.
  prometheus::Counter* rows_voided;
  // The draft model on rank 0 (DraftRunner): tokens it proposed, and time in
  // it (also inside compute_seconds).
  prometheus::Counter* drafts_proposed;
  prometheus::Counter* draft_model_seconds;
  // Cached prefix tokens fed to the draft model because its entries of
  // them were stale (restored, imported or never fed).
  prometheus::Counter* draft_prefix_tokens;
  prometheus::Histogram* compute_seconds;
  prometheus::Histogram* collective_seconds;
  prometheus::Gauge* lanes;
  prometheus::Gauge* group_ready;
  prometheus::Gauge* group_epoch;
  prometheus::Counter* group_formations;
  prometheus::Gauge* kv_pool_blocks;
  // Models with recurrent layers: state slots (lanes holding one are
  // counted by `lanes`) and the bytes they take (0 for other models).
  prometheus::Gauge* state_slots;
  prometheus::Gauge* state_bytes;
  // Tokens fed again to rewind lanes' states past rejected drafts.
  prometheus::Counter* state_replayed_tokens;
  prometheus::Counter* kv_blocks_exported;
  prometheus::Counter* kv_blocks_imported;
  // The kvstore link (kv_offload.h): blocks offloaded by outcome, blocks
  // restored, restores that stopped early by reason, bytes each way, the
  // upload queue, and whether the last call to the store succeeded.
  prometheus::Counter* kvstore_offload_stored;
  prometheus::Counter* kvstore_offload_dropped;  // queue full
  prometheus::Counter* kvstore_offload_failed;   // the store refused or was unreachable
  prometheus::Counter* kvstore_blocks_restored;
  prometheus::Counter* kvstore_restore_stopped_miss;
  prometheus::Counter* kvstore_restore_stopped_error;
  // Models with recurrent layers: state checkpoints offloaded and restored
  // with their blocks, and offloads skipped because the checkpoint had been
  // handed on before the copy.
  prometheus::Counter* kvstore_checkpoints_offloaded;
  prometheus::Counter* kvstore_checkpoints_restored;
  prometheus::Counter* kvstore_checkpoints_unavailable;
  prometheus::Counter* kvstore_checksum_failures;
  prometheus::Counter* kvstore_bytes_out;
  prometheus::Counter* kvstore_bytes_in;
  prometheus::Gauge* kvstore_queued_bytes;
  prometheus::Gauge* kvstore_up;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_SERVER_WORKER_METRICS_H_
