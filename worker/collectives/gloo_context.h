// The Gloo context behind CreateGlooCommunicator, for tools that compare with
// Gloo's own algorithms (tools/collectives_bench.cc). The engine uses the
// Communicator interface only.
#ifndef RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_
#define RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/context.h"
#include "worker/collectives/communicator.h"

namespace ringlane::worker {

// A connected full mesh (FileStore rendezvous, TCP). Unavailable on failure.
absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> ConnectGloo(const GlooOptions& options);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_GLOO_CONTEXT_H_
