#include "services/health_port.h"

#include <grpcpp/health_check_service_interface.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::services {

absl::StatusOr<std::unique_ptr<HealthPort>> HealthPort::Start(const std::string& listen,
                                                              std::vector<std::string> services) {
  // The default health service comes with every server built while this is
  // on; the daemons turn it on for their main server anyway.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (in use?)"));
  }
  auto h =
      std::unique_ptr<HealthPort>(new HealthPort(std::move(server), std::move(services), port));
  h->Set(false);
  return h;
}

void HealthPort::Set(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  for (const std::string& s : services_) health->SetServingStatus(s, serving);
}

HealthPort::~HealthPort() { server_->Shutdown(); }

}  // namespace ringlane::services
