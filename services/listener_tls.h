// The TLS a daemon's gRPC listener and its peer channels use, from its
// --tls_ca/--tls_cert/--tls_key flags, with the one policy the worker and
// the kvstore share: a listener other hosts can reach needs TLS unless
// --allow_plaintext says otherwise. Header-only, for the daemons' main.cc.
#ifndef RINGLANE_SERVICES_LISTENER_TLS_H_
#define RINGLANE_SERVICES_LISTENER_TLS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/grpc_security.h"

namespace ringlane::services {

// The loaded files (nullopt: plaintext), or InvalidArgument with the usage
// message: a file that cannot be used, or TLS off on a listener `listen_flag`
// whose host is not loopback without `allow_plaintext`.
inline absl::StatusOr<std::optional<TlsConfig>> ListenerTls(const TlsFiles& files,
                                                            const std::string& listen_host,
                                                            const std::string& listen_flag,
                                                            bool allow_plaintext) {
  absl::StatusOr<std::optional<TlsConfig>> tls = LoadTls(files);
  if (!tls.ok()) return absl::InvalidArgumentError(tls.status().message());
  if (!tls->has_value() && !IsLoopbackHost(listen_host) && !allow_plaintext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", listen_flag,
        " is reachable from other hosts but TLS is off: give --tls_ca, --tls_cert and --tls_key "
        "(tools/make_certs.sh makes them), or pass --allow_plaintext"));
  }
  return tls;
}

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_LISTENER_TLS_H_
