// Makes the compute backend a worker rank runs, by kind, so that the group
// code and main.cc name no backend. "cpu" is always built; "cuda" is
// Unimplemented until a CUDA backend exists. Stateless; safe from any thread.
#ifndef RINGLANE_WORKER_BACKEND_FACTORY_H_
#define RINGLANE_WORKER_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"

namespace ringlane::worker {

class Communicator;

inline constexpr char kCpuBackend[] = "cpu";
inline constexpr char kCudaBackend[] = "cuda";

struct BackendOptions {
  std::string kind = kCpuBackend;
  // The CPU backend's knobs (kind "cpu"); CreateBackend fills in `comm`.
  CpuBackendOptions cpu;
};

// A backend of `options.kind` over `shard` (this rank's shard of the model),
// meeting its tensor-parallel group through `comm` (not owned, must outlive
// the backend; null for an unsharded model). The KV pool is not allocated yet.
// Unimplemented for "cuda" in a build without a CUDA backend; InvalidArgument
// for an unknown kind.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::shared_ptr<const ModelWeights> shard,
                                                       const BackendOptions& options,
                                                       Communicator* comm);

// The bytes of one KV block (the unit of ExportKvBlock/ImportKvBlock) that a
// backend of `kind` would have for this shard and pool spec, computed from
// the backend's layout without allocating anything. InvalidArgument for a bad
// spec or an unknown kind; Unimplemented as CreateBackend.
absl::StatusOr<int64_t> KvBlockBytes(std::string_view kind, const ModelConfig& config,
                                     const TpShard& shard, const KvPoolSpec& spec);

// The cache each layer keeps on a rank of `shard` under a backend of `kind`
// (what Backend::layer_caches() will say), without loading weights: what the
// worker advertises in GetInfo. Errors as KvBlockBytes.
absl::StatusOr<std::vector<LayerCacheSpec>> LayerCaches(std::string_view kind,
                                                        const ModelConfig& config,
                                                        const TpShard& shard);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_BACKEND_FACTORY_H_
