// The one mapping between absl::Status (used inside every component) and
// grpc::Status (on the wire). Both use the same code numbers (OK = 0 through
// UNAUTHENTICATED = 16), so codes map one to one and messages are kept as is.
// absl::Status payloads are not carried; codes outside 0..16 become UNKNOWN.
//
// RPC handlers return ToGrpcStatus(...) of their library call; clients wrap
// FromGrpcStatus(...) around a failed call's status before passing it up.
#ifndef RINGLANE_SERVICES_STATUS_GRPC_H_
#define RINGLANE_SERVICES_STATUS_GRPC_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ringlane::services {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_STATUS_GRPC_H_
