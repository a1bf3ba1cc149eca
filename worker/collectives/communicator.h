// The collectives a tensor-parallel group meets in. One interface, several
// transports: Gloo over TCP or ibverbs for CPU ranks (this file's factory),
// NCCL for CUDA ranks (nccl_communicator.h), and a single-rank no-op.
//
// Batch invariance needs every element's sum taken in the same order whatever
// the message size; ring and tree all-reduce split the buffer by size, so
// beyond two ranks the order of an element's additions shifts with the number
// of rows in the round. AllReduceSum here is defined as: gather every rank's
// buffer, then add them element by element in rank order, ((r0 + r1) + r2) +
// ... — it only moves bytes across the network and sums locally.
//
// A communicator is used by one thread at a time: in the worker, the step
// loop's (worker/server/step_loop.h), which owns it with the backend.
#ifndef RINGLANE_WORKER_COLLECTIVES_COMMUNICATOR_H_
#define RINGLANE_WORKER_COLLECTIVES_COMMUNICATOR_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringlane::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;

  // data[i] = sum over ranks r, in rank order, of rank r's data[i].
  // Unavailable when a peer is gone or the timeout passes; the group is then
  // unusable.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // out[r * count + i] = rank r's in[i].
  virtual absl::Status AllGather(const float* in, size_t count, float* out) = 0;
  // Every rank's data becomes root's.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
  virtual absl::Status Barrier() = 0;
};

// The no-op communicator of a group of one.
std::unique_ptr<Communicator> CreateSingleRankCommunicator();

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Rendezvous through files in this directory (shared by the ranks)...
  std::string file_store_dir;
  // Address to bind and advertise.
  std::string host = "127.0.0.1";
  // TCP transport: the port range [port_min, port_max] the device's listening
  // socket binds in (the first free one), so a firewall can allow it; 0, 0:
  // the kernel picks. A range of two or more lets a re-formation bind while
  // the previous formation's socket is still open.
  int port_min = 0;
  int port_max = 0;
  std::chrono::milliseconds timeout{30000};
  // ...or, when set, through the gRPC Rendezvous service at this host:port,
  // under `group` (worker/rendezvous/rendezvous.h).
  std::string rendezvous_address;
  std::string group = "default";
  // "auto": ibverbs when an RDMA device is present (and the build has
  // rdma-core), else TCP with one log line per process saying so. "tcp" or
  // "ibverbs" force one; a forced "ibverbs" without a device (or without
  // rdma-core in the build) is FailedPrecondition rather than a silent TCP.
  // Every rank must arrive at the same transport: where some machines of a
  // group have RDMA and some do not, force "tcp".
  std::string transport = "auto";
  // The RDMA device (empty: the first in sorted order), its port (from 1) and
  // its GID index. RoCE v2 usually needs the index of the IPv4-mapped GID,
  // which `show_gids` lists; InfiniBand works with 0.
  std::string ibverbs_device;
  int ibverbs_port = 1;
  int ibverbs_index = 0;
  // Runs the collectives that the ibverbs transport supports (Gloo's
  // registered-buffer algorithms) over whichever transport is chosen, so that
  // this path is exercised on machines without RDMA hardware.
  bool bound_buffers_for_testing = false;
  // TCP only: how a rank waits for its peers' bytes. "blocking" (default):
  // the waiting thread reads its socket itself. "async" (Gloo's own default):
  // a device thread per process reads the sockets and wakes the waiting
  // thread; measured 10x slower per decode round (README, "Worker groups").
  // "busy_poll": the waiting thread spins on the socket, for ranks that each
  // own a core (it burns that core while it waits). "blocking" and
  // "busy_poll" run Gloo's registered-buffer algorithms.
  std::string tcp_wait = "blocking";
};

// Connects a full mesh of `world_size` ranks over the transport that
// `options.transport` selects. Unavailable (with the reason) when the peers do
// not arrive within the timeout; FailedPrecondition when "ibverbs" is forced
// where it cannot run; InvalidArgument for an unknown transport name.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options);

// The rank-order sum of AllReduceSum: out[i] = ((parts[0][i] + parts[1][i]) +
// ...) over `ranks` buffers laid out as parts[r * count + i].
void SumInRankOrder(const float* parts, int ranks, size_t count, float* out);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_COMMUNICATOR_H_
