// The router's gRPC front door: the public Generate service
// (proto/ringlane/v1/generate.proto) over a Router, plus the standard health
// service (SERVING while at least one worker group is ready). With API keys,
// every Generate-service call needs `authorization: Bearer KEY` metadata (the
// gateway's rule, router/api/auth.h) and is refused with UNAUTHENTICATED
// before anything is parsed or queued; the health service stays open to
// probes.
#ifndef RINGLANE_ROUTER_API_GENERATE_SERVICE_H_
#define RINGLANE_ROUTER_API_GENERATE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "router/api/auth.h"
#include "router/router.h"

namespace ringlane::router {

// Handlers run on gRPC's sync thread pool and only validate, submit and
// stream: the group threads do the work. A Generate handler polls its
// request's messages and the call's cancellation every few milliseconds, so a
// client that goes away frees its lanes by the next round.
//
// ListModels also returns, in trailing metadata, the router's live state for
// gRPC-only clients and tests (operators read the same from /metrics):
// `ringlane-active-lanes`,
// `ringlane-waiting`, `ringlane-kv-available-blocks` and
// `ringlane-kv-total-blocks`, each summed over ready groups, and
// `ringlane-prefilled-tokens`, prompt tokens fed since start over all groups.
class GenerateServiceImpl final : public ringlane::v1::Generate::Service {
 public:
  // Registers ringlane_grpc_requests_total{method, code} in the router's
  // registry, the gRPC twin of the gateway's per-endpoint counter.
  GenerateServiceImpl(Router* router, ApiKeys keys);

  grpc::Status Generate(grpc::ServerContext* ctx, const ringlane::v1::GenerateRequest* request,
                        grpc::ServerWriter<ringlane::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* ctx, const ringlane::v1::TokenizeRequest* request,
                        ringlane::v1::TokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* ctx, const ringlane::v1::ListModelsRequest* request,
                          ringlane::v1::ListModelsResponse* response) override;

 private:
  grpc::Status RunGenerate(grpc::ServerContext* ctx, const ringlane::v1::GenerateRequest* request,
                           grpc::ServerWriter<ringlane::v1::GenerateResponse>* writer);
  grpc::Status RunTokenize(const ringlane::v1::TokenizeRequest* request,
                           ringlane::v1::TokenizeResponse* response);
  grpc::Status RunListModels(grpc::ServerContext* ctx, ringlane::v1::ListModelsResponse* response);
  // Counts the call's outcome and returns it.
  grpc::Status Counted(const char* method, grpc::Status status);
  // OK, or UNAUTHENTICATED when keys are set and the call's metadata has no
  // accepted one.
  grpc::Status Authenticate(const grpc::ServerContext* ctx) const;

  Router* const router_;
  const ApiKeys keys_;
  prometheus::Family<prometheus::Counter>* requests_;
};

// The gRPC server with the Generate and health services.
class RouterServer {
 public:
  // Listens on `listen` (host:port, port 0 picks one), accepting `keys`
  // (none: every caller). Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(Router* router,
                                                             const std::string& listen,
                                                             ApiKeys keys = ApiKeys());
  ~RouterServer();

  int port() const { return port_; }
  // Stops accepting calls and waits up to `deadline` for running ones.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  RouterServer(Router* router, ApiKeys keys) : service_(router, std::move(keys)), router_(router) {}
  void WatchHealth();

  GenerateServiceImpl service_;
  Router* const router_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;  // Shutdown ran (main, then the destructor)
  absl::Notification stop_;
  std::thread health_thread_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_API_GENERATE_SERVICE_H_
