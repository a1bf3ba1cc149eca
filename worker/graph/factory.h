// Picks the forward pass for a checkpoint by its ModelConfig::model_type, so
// that backends and the worker's main name no family. A new family adds its
// graph here and nowhere else in the worker. Stateless; safe from any thread.
#ifndef RINGLANE_WORKER_GRAPH_FACTORY_H_
#define RINGLANE_WORKER_GRAPH_FACTORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"
#include "worker/model/model.h"

namespace ringlane::worker {

// The graph of `shard`'s family over this rank's shard (the whole model when
// not sharded). Unimplemented for a model_type no graph runs.
absl::StatusOr<std::unique_ptr<ModelGraph>> CreateGraph(std::shared_ptr<const ModelWeights> shard);

// What CreateGraph(shard)->LayerCaches() would say, from the config and the
// shard alone (before any weights are loaded: a worker sizes its KV blocks
// with it). Unimplemented as CreateGraph.
absl::StatusOr<std::vector<LayerCacheSpec>> GraphLayerCaches(const ModelConfig& config,
                                                             const TpShard& shard);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_GRAPH_FACTORY_H_
