#include "worker/collectives/factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/collectives/nccl_communicator.h"

namespace ringlane::worker {

std::string CollectivesForBackend(std::string_view backend_kind) {
  return backend_kind == "cuda" ? kNcclCollectives : kGlooCollectives;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options) {
  if (options.world_size == 1) return CreateSingleRankCommunicator();
  if (options.kind == kGlooCollectives) {
    GlooOptions g;
    g.rank = options.rank;
    g.world_size = options.world_size;
    g.host = options.host;
    g.port_min = options.port_min;
    g.port_max = options.port_max;
    g.timeout = options.timeout;
    g.rendezvous_address = options.rendezvous_address;
    g.group = options.group;
    g.transport = options.transport;
    g.tcp_wait = options.tcp_wait;
    return CreateGlooCommunicator(g);
  }
  if (options.kind == kNcclCollectives) {
    NcclOptions n;
    n.rank = options.rank;
    n.world_size = options.world_size;
    n.rendezvous_address = options.rendezvous_address;
    n.group = options.group;
    n.timeout = options.timeout;
    return CreateNcclCommunicator(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collectives '", options.kind, "' (gloo, nccl)"));
}

}  // namespace ringlane::worker
