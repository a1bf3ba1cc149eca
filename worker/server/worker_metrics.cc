#include "worker/server/worker_metrics.h"

#include "prometheus/family.h"

namespace ringlane::worker {

namespace {

// Seconds, from 100 µs to 10 s: rounds of a small model on a CPU take well
// under a millisecond, a long prefill chunk of a large one seconds.
prometheus::Histogram::BucketBoundaries RoundBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const std::string& model,
                             const std::string& group, int rank) {
  const prometheus::Labels l = {{"model", model}, {"group", group}, {"rank", std::to_string(rank)}};
  auto& rounds = prometheus::BuildCounter()
                     .Name("ringlane_worker_rounds_total")
                     .Help(
                         "Round plans by outcome: ok, rejected (invalid plan), failed "
                         "(collective or device error; the group re-forms)")
                     .Register(r);
  auto with = [&l](std::initializer_list<std::pair<const std::string, std::string>> extra) {
    prometheus::Labels x = l;
    for (const auto& [k, v] : extra) x[k] = v;
    return x;
  };
  rounds_ok = &rounds.Add(with({{"result", "ok"}}));
  rounds_rejected = &rounds.Add(with({{"result", "rejected"}}));
  rounds_failed = &rounds.Add(with({{"result", "failed"}}));
  tokens_fed = &prometheus::BuildCounter()
                    .Name("ringlane_worker_tokens_fed_total")
                    .Help("Tokens fed through the model (prefill, decode and draft positions)")
                    .Register(r)
                    .Add(l);
  tokens_sampled = &prometheus::BuildCounter()
                        .Name("ringlane_worker_tokens_sampled_total")
                        .Help("Tokens sampled inside the group")
                        .Register(r)
                        .Add(l);
  drafts_accepted = &prometheus::BuildCounter()
                         .Name("ringlane_worker_drafts_accepted_total")
                         .Help("Speculative draft tokens accepted by verification")
                         .Register(r)
                         .Add(l);
  rows_voided = &prometheus::BuildCounter()
                     .Name("ringlane_worker_rows_voided_total")
                     .Help("Rows planned behind a verify row that rejected a draft, so never run")
                     .Register(r)
                     .Add(l);
  drafts_proposed =
      &prometheus::BuildCounter()
           .Name("ringlane_worker_drafts_proposed_total")
           .Help("Draft tokens the draft model (--draft_model, --draft_layers) proposed")
           .Register(r)
           .Add(l);
  draft_prefix_tokens =
      &prometheus::BuildCounter()
           .Name("ringlane_worker_draft_prefix_tokens_total")
           .Help(
               "Cached prefix tokens fed to the draft model to catch up entries it lacked "
               "(blocks restored from the kvstore, imported, or of lanes never fed)")
           .Register(r)
           .Add(l);
  draft_model_seconds = &prometheus::BuildCounter()
                             .Name("ringlane_worker_draft_model_seconds_total")
                             .Help(
                                 "Time in the draft model (feeding rounds and proposing), part "
                                 "of the round compute time")
                             .Register(r)
                             .Add(l);
  compute_seconds = &prometheus::BuildHistogram()
                         .Name("ringlane_worker_round_compute_seconds")
                         .Help(
                             "Time per round in the forward pass and sampling, excluding "
                             "collectives")
                         .Register(r)
                         .Add(l, RoundBuckets());
  collective_seconds = &prometheus::BuildHistogram()
                            .Name("ringlane_worker_round_collective_seconds")
                            .Help(
                                "Time per round inside collectives, waiting for the slowest "
                                "rank included")
                            .Register(r)
                            .Add(l, RoundBuckets());
  lanes = &prometheus::BuildGauge()
               .Name("ringlane_worker_lanes")
               .Help("Lanes whose sampler state this rank holds")
               .Register(r)
               .Add(l);
  group_ready = &prometheus::BuildGauge()
                     .Name("ringlane_worker_group_ready")
                     .Help("1 while the group is formed and serves rounds")
                     .Register(r)
                     .Add(l);
  group_epoch = &prometheus::BuildGauge()
                     .Name("ringlane_worker_group_epoch")
                     .Help("Epoch of the current group formation (0 when not formed)")
                     .Register(r)
                     .Add(l);
  group_formations = &prometheus::BuildCounter()
                          .Name("ringlane_worker_group_formations_total")
                          .Help(
                              "Times the group formed; more than one means it re-formed and "
                              "lost its KV contents")
                          .Register(r)
                          .Add(l);
  kv_pool_blocks = &prometheus::BuildGauge()
                        .Name("ringlane_worker_kv_pool_blocks")
                        .Help("Blocks in this rank's KV pool")
                        .Register(r)
                        .Add(l);
  state_slots = &prometheus::BuildGauge()
                     .Name("ringlane_worker_state_slots")
                     .Help(
                         "Recurrent state slots (one per lane) of a model with linear-attention "
                         "layers; 0 for other models")
                     .Register(r)
                     .Add(l);
  state_bytes = &prometheus::BuildGauge()
                     .Name("ringlane_worker_state_bytes")
                     .Help("Bytes of this rank's recurrent state slots")
                     .Register(r)
                     .Add(l);
  state_replayed_tokens = &prometheus::BuildCounter()
                               .Name("ringlane_worker_state_replayed_tokens_total")
                               .Help(
                                   "Tokens fed again to rewind recurrent states past rejected "
                                   "draft tokens (the price of speculation on such a model)")
                               .Register(r)
                               .Add(l);
  auto& kv = prometheus::BuildCounter()
                 .Name("ringlane_worker_kv_blocks_moved_total")
                 .Help("KV blocks exported from or imported into the pool")
                 .Register(r);
  kv_blocks_exported = &kv.Add(with({{"direction", "export"}}));
  kv_blocks_imported = &kv.Add(with({{"direction", "import"}}));
  auto& off = prometheus::BuildCounter()
                  .Name("ringlane_worker_kvstore_offload_blocks_total")
                  .Help(
                      "Blocks the router asked to offload, by outcome: stored (or already "
                      "there), dropped (upload queue full), failed (store down or refused)")
                  .Register(r);
  kvstore_offload_stored = &off.Add(with({{"outcome", "stored"}}));
  kvstore_offload_dropped = &off.Add(with({{"outcome", "dropped"}}));
  kvstore_offload_failed = &off.Add(with({{"outcome", "failed"}}));
  kvstore_blocks_restored = &prometheus::BuildCounter()
                                 .Name("ringlane_worker_kvstore_restored_blocks_total")
                                 .Help("Blocks read from the kvstore into the pool")
                                 .Register(r)
                                 .Add(l);
  auto& stop = prometheus::BuildCounter()
                   .Name("ringlane_worker_kvstore_restore_stops_total")
                   .Help(
                       "Restores that ended before the last block asked for: miss (not "
                       "stored), error (store down, slow past the deadline, or a block failed "
                       "its checksum)")
                   .Register(r);
  kvstore_restore_stopped_miss = &stop.Add(with({{"reason", "miss"}}));
  kvstore_restore_stopped_error = &stop.Add(with({{"reason", "error"}}));
  kvstore_checkpoints_offloaded =
      &prometheus::BuildCounter()
           .Name("ringlane_worker_kvstore_state_checkpoints_offloaded_total")
           .Help("Recurrent-state checkpoints copied to the kvstore with their blocks")
           .Register(r)
           .Add(l);
  kvstore_checkpoints_restored =
      &prometheus::BuildCounter()
           .Name("ringlane_worker_kvstore_state_checkpoints_restored_total")
           .Help("Recurrent-state checkpoints read from the kvstore with their blocks")
           .Register(r)
           .Add(l);
  kvstore_checkpoints_unavailable =
      &prometheus::BuildCounter()
           .Name("ringlane_worker_kvstore_state_checkpoints_unavailable_total")
           .Help(
               "Blocks not offloaded because their state checkpoint no longer held the "
               "state of the block's end (handed on before the copy)")
           .Register(r)
           .Add(l);
  kvstore_checksum_failures = &prometheus::BuildCounter()
                                   .Name("ringlane_worker_kvstore_checksum_failures_total")
                                   .Help(
                                       "Blocks from the kvstore that failed verification "
                                       "(never written into the pool)")
                                   .Register(r)
                                   .Add(l);
  auto& bytes = prometheus::BuildCounter()
                    .Name("ringlane_worker_kvstore_bytes_total")
                    .Help("Payload bytes moved to (out) and from (in) the kvstore")
                    .Register(r);
  kvstore_bytes_out = &bytes.Add(with({{"direction", "out"}}));
  kvstore_bytes_in = &bytes.Add(with({{"direction", "in"}}));
  kvstore_queued_bytes = &prometheus::BuildGauge()
                              .Name("ringlane_worker_kvstore_queued_bytes")
                              .Help("Offloaded payload bytes waiting to be uploaded")
                              .Register(r)
                              .Add(l);
  kvstore_up = &prometheus::BuildGauge()
                    .Name("ringlane_worker_kvstore_up")
                    .Help(
                        "1 when the last call to the kvstore succeeded, 0 after a failure "
                        "(no kvstore configured: 0)")
                    .Register(r)
                    .Add(l);
}

}  // namespace ringlane::worker
