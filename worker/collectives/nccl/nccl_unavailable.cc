// The NCCL factories of a build without CUDA or NCCL: callers link the same
// names in every build and learn at run time.
#include "absl/status/status.h"
#include "worker/collectives/nccl_communicator.h"

namespace ringlane::worker {

bool NcclAvailable() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions&) {
  return absl::UnimplementedError("NCCL communicator: built without CUDA/NCCL");
}

absl::StatusOr<std::string> ExchangeNcclUniqueId(const NcclOptions&) {
  return absl::UnimplementedError("NCCL unique id: built without CUDA/NCCL");
}

}  // namespace ringlane::worker
