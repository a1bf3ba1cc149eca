// A model family's forward pass, written once over the ops of backend/ops.h,
// so that a backend runs whichever graph the checkpoint needs without knowing
// the family: the backend owns the memory (KV pool, scratch) and the kernels,
// the graph owns the order of operations and the layers' cache layout.
//
// A graph is made by graph/factory.h for this rank's shard, owned by one
// backend and driven by its step thread; not thread-safe.
#ifndef RINGLANE_WORKER_GRAPH_GRAPH_H_
#define RINGLANE_WORKER_GRAPH_GRAPH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/ops.h"
#include "worker/model/model.h"
#include "worker/round.h"

namespace ringlane::worker {

class ModelGraph {
 public:
  virtual ~ModelGraph() = default;

  // The family's name as the loader reports it ("llama", ...), for logs.
  virtual std::string family() const = 0;

  // The cache each layer keeps on this rank, one entry per layer; what the
  // backend must allocate and what the worker advertises in GetInfo.
  virtual std::vector<LayerCacheSpec> LayerCaches() const = 0;

  // Runs one round over `ops`, whose cache holds the caches LayerCaches()
  // names. The round is already validated against the pool (token ids,
  // positions and block ids in range, blocks covering the positions). Errors:
  // the group's collectives' (Unavailable when a peer is gone).
  virtual absl::StatusOr<RoundOutput> Forward(const RoundInput& round, ComputeOps* ops) = 0;
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_GRAPH_GRAPH_H_
