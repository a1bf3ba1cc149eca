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
  auto& kv = prometheus::BuildCounter()
                 .Name("ringlane_worker_kv_blocks_moved_total")
                 .Help("KV blocks exported from or imported into the pool")
                 .Register(r);
  kv_blocks_exported = &kv.Add(with({{"direction", "export"}}));
  kv_blocks_imported = &kv.Add(with({{"direction", "import"}}));
}

}  // namespace ringlane::worker
