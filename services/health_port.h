// A plaintext port that serves only grpc.health.v1.Health, mirroring a
// daemon's own health status: for probes that cannot speak mutual TLS (the
// kubelet's gRPC probes) while every real service stays behind it. It
// answers nothing but health, so it leaks no more than "up or not".
// Thread-safe.
#ifndef RINGLANE_SERVICES_HEALTH_PORT_H_
#define RINGLANE_SERVICES_HEALTH_PORT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::services {

class HealthPort {
 public:
  // Serves health on `listen` (host:port; port 0 picks one) for "" and each
  // of `services`, NOT_SERVING until Set(true). Unavailable when it cannot
  // listen.
  static absl::StatusOr<std::unique_ptr<HealthPort>> Start(const std::string& listen,
                                                           std::vector<std::string> services);
  ~HealthPort();  // shuts the server down

  void Set(bool serving);
  int port() const { return port_; }

 private:
  HealthPort(std::unique_ptr<grpc::Server> server, std::vector<std::string> services, int port)
      : server_(std::move(server)), services_(std::move(services)), port_(port) {}
  std::unique_ptr<grpc::Server> server_;
  const std::vector<std::string> services_;
  const int port_;
};

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_HEALTH_PORT_H_
