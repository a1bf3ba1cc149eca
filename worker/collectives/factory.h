// Makes the communicator a rank's backend meets its tensor-parallel group
// through, so that the group code names no transport: the no-op one for a
// group of one, Gloo (TCP or ibverbs) for host-memory backends, NCCL for CUDA
// ones where the build has it. Stateless; safe from any thread.
#ifndef RINGLANE_WORKER_COLLECTIVES_FACTORY_H_
#define RINGLANE_WORKER_COLLECTIVES_FACTORY_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/collectives/communicator.h"

namespace ringlane::worker {

inline constexpr char kGlooCollectives[] = "gloo";
inline constexpr char kNcclCollectives[] = "nccl";

// The collectives a backend of `backend_kind` works with: NCCL for "cuda"
// (device memory), Gloo for everything else (host memory).
std::string CollectivesForBackend(std::string_view backend_kind);

struct CommunicatorOptions {
  // kGlooCollectives or kNcclCollectives; not looked at when world_size is 1.
  std::string kind = kGlooCollectives;
  int rank = 0;
  int world_size = 1;
  // The gRPC Rendezvous service (host:port) and the name, fresh for each
  // formation, under which this formation's ranks find each other.
  std::string rendezvous_address;
  std::string group = "default";
  // Longest wait inside one collective (and to connect).
  std::chrono::milliseconds timeout{30000};
  // Gloo: the address to bind and advertise, the transport ("auto", "tcp",
  // "ibverbs") and how TCP ranks wait (GlooOptions has the meanings).
  std::string host = "127.0.0.1";
  std::string transport = "auto";
  std::string tcp_wait = "blocking";
  // Gloo TCP: the listening port's range (GlooOptions::port_min/port_max).
  int port_min = 0;
  int port_max = 0;
};

// A connected communicator for rank `options.rank`: the single-rank no-op
// when world_size is 1, else one of `options.kind`. Errors are the
// transport's (CreateGlooCommunicator, CreateNcclCommunicator: Unavailable
// when peers do not arrive, Unimplemented for NCCL in a build without it);
// InvalidArgument for an unknown kind.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_FACTORY_H_
