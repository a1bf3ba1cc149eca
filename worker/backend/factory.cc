#include "worker/backend/factory.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/graph/factory.h"

namespace ringlane::worker {

namespace {

absl::Status UnknownKind(std::string_view kind) {
  if (kind == kCudaBackend) {
    return absl::UnimplementedError("backend 'cuda': this build has no CUDA backend yet");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", std::string(kind), "' (cpu)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::shared_ptr<const ModelWeights> shard,
                                                       const BackendOptions& options,
                                                       Communicator* comm) {
  if (options.kind != kCpuBackend) return UnknownKind(options.kind);
  CpuBackendOptions cpu = options.cpu;
  cpu.comm = comm;
  return CreateCpuBackend(std::move(shard), cpu);
}

absl::StatusOr<int64_t> KvBlockBytes(std::string_view kind, const ModelConfig& config,
                                     const TpShard& shard, const KvPoolSpec& spec) {
  if (kind != kCpuBackend) return UnknownKind(kind);
  return CpuKvBlockBytes(config, shard, spec);
}

absl::StatusOr<std::vector<LayerCacheSpec>> LayerCaches(std::string_view kind,
                                                        const ModelConfig& config,
                                                        const TpShard& shard) {
  if (kind != kCpuBackend) return UnknownKind(kind);
  // The CPU backend keeps exactly what the graph asks for.
  return GraphLayerCaches(config, shard);
}

}  // namespace ringlane::worker
