// The Gloo context behind CreateGlooCommunicator, for tools that compare with
// Gloo's own algorithms (tools/collectives_bench.cc), and the transport choice
// behind GlooOptions::transport. The engine uses the Communicator interface
// only.
#ifndef RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_
#define RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/context.h"
#include "worker/collectives/communicator.h"

namespace ringlane::worker {

enum class GlooTransport { kTcp, kIbverbs };

// "tcp" or "ibverbs".
const char* GlooTransportName(GlooTransport transport);

// The names of this machine's RDMA devices, sorted; empty when there are none
// or the build has no rdma-core (RINGLANE_HAVE_IBVERBS unset).
std::vector<std::string> RdmaDeviceNames();

// What `options.transport` means on this machine. "auto" without any RDMA
// device is TCP, logged once per process. FailedPrecondition when "ibverbs"
// is forced without a device or rdma-core, or when the named
// `ibverbs_device` is absent while others exist; InvalidArgument for a name
// other than auto/tcp/ibverbs.
absl::StatusOr<GlooTransport> ResolveGlooTransport(const GlooOptions& options);

// A connected full mesh (FileStore or gRPC rendezvous) over the transport
// ResolveGlooTransport picks; its errors, or Unavailable on failure. Over
// ibverbs only Gloo's registered-buffer algorithms (AllgatherRing,
// BroadcastOneToAll, Barrier*) run: its transport has no unbound buffers, so
// gloo::allgather(AllgatherOptions) and friends throw there.
absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> ConnectGloo(const GlooOptions& options);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_
