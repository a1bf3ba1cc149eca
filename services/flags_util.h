// Checks for daemon flags. main() validates every flag before building
// anything and exits with a usage error on the first bad one:
//
//   if (absl::Status s = ValidatePort(absl::GetFlag(FLAGS_port)); !s.ok()) {
//     ExitWithUsageError(absl::StrCat("--port: ", s.message()));
//   }
#ifndef RINGLANE_SERVICES_FLAGS_UTIL_H_
#define RINGLANE_SERVICES_FLAGS_UTIL_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringlane::services {

// OK for 0..65535 (0 means "pick a free port"); InvalidArgument otherwise.
absl::Status ValidatePort(int port);

// Splits "host:port" into its parts. The host is a name, an IPv4 address, or
// an IPv6 address in brackets ("[::1]:50061", returned without brackets). The
// port is decimal digits only, 0..65535. InvalidArgument for an empty host, a
// missing or malformed port, or an unbracketed IPv6 address.
absl::StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view host_port);

// The inverse of ParseHostPort: brackets a host that contains ':'.
std::string JoinHostPort(std::string_view host, int port);

// Prints "error: <msg>" to stderr and exits with status 2 (the conventional
// code for command-line usage errors).
[[noreturn]] void ExitWithUsageError(std::string_view msg);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_FLAGS_UTIL_H_
