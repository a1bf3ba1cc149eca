// NCCL collectives for CUDA ranks, behind the Communicator interface.
//
// Declared in every build so callers need no #ifdef: without CUDA and NCCL
// (RINGLANE_WITH_CUDA=OFF, or no toolkit) NcclAvailable() is false and the
// factories return Unimplemented.
//
// Unlike the Gloo and single-rank communicators, an NCCL communicator works
// on DEVICE pointers: every float* passed to AllReduceSum, AllGather and
// Broadcast lies in the memory of the communicator's CUDA device, and must be
// ready when the call is made (written by finished work, or by work queued
// earlier on the communicator's stream). Each call returns once its collective
// has finished on that stream, so its Status is the collective's and the
// results may be read from any stream afterwards.
//
// AllReduceSum keeps the batch-invariant definition of communicator.h: NCCL
// all-gathers every rank's buffer into a scratch buffer, then a kernel adds
// the parts element by element in rank order, bit for bit what
// SumInRankOrder computes on the host. NCCL's own all-reduce is never used
// for data: its ring and tree orders depend on the message size.
//
// Failures (a peer gone, a hang past the timeout, a CUDA or NCCL error) abort
// the NCCL communicator and return Unavailable; every later call returns
// Unavailable too, as the group must be formed again.
#ifndef RINGLANE_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define RINGLANE_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/collectives/communicator.h"

// cudaStream_t is a CUstream_st*; naming the struct keeps CUDA's headers out
// of every file that includes this one.
struct CUstream_st;

namespace ringlane::worker {

// The Rendezvous key under which rank 0 publishes the group's ncclUniqueId.
inline constexpr char kNcclUniqueIdKey[] = "nccl_unique_id";

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  // The rank's CUDA device; -1: rank % the number of visible devices.
  int device = -1;
  // The gRPC Rendezvous service (host:port) through which rank 0 publishes
  // the NCCL unique id, under `group` and key kNcclUniqueIdKey. A group whose
  // members may re-form must use a fresh group name per formation (the
  // epoch), or a rank could read the id of an earlier one.
  std::string rendezvous_address;
  std::string group = "default";
  // Bounds the rendezvous, NCCL's initialization and every collective.
  std::chrono::milliseconds timeout{30000};
  // When rendezvous_address is empty: a directory shared by the ranks, where
  // rank 0 writes the id (tests, single-machine runs). Not needed for one rank.
  std::string file_store_dir;
  // The cudaStream_t to run on, owned by the caller, of `device`; null: the
  // communicator creates and owns a non-blocking stream.
  CUstream_st* stream = nullptr;
};

// True when this build has the NCCL communicator.
bool NcclAvailable();

// Connects rank `options.rank` of the group. InvalidArgument for a bad rank,
// size or device, or a missing rendezvous; FailedPrecondition "no CUDA
// device" when the CUDA runtime reports none (or fails, as without a driver);
// Unavailable when a peer does not arrive within the timeout or NCCL fails;
// Unimplemented in a build without CUDA/NCCL.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options);

// The group's ncclUniqueId (NCCL_UNIQUE_ID_BYTES bytes): rank 0 creates and
// publishes it, the other ranks wait for it. Needs no GPU. Unavailable when
// the rendezvous fails or the id does not appear within the timeout;
// Unimplemented without NCCL. CreateNcclCommunicator calls it.
absl::StatusOr<std::string> ExchangeNcclUniqueId(const NcclOptions& options);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_
