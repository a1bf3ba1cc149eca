// Mutual TLS between ringlane's daemons: the one place that turns certificate
// files into gRPC server and channel credentials. Every daemon takes
// --tls_ca, --tls_cert and --tls_key (all three or none); with them, each of
// its gRPC servers for peers (Worker, Rendezvous) requires and verifies a
// client certificate signed by the CA, and each channel it opens to a peer
// presents its own certificate and verifies the server's against the same CA
// (and the address it dials against the certificate's SANs). Without them
// everything is plaintext, as before.
//
// The daemon's identity is process-wide (SetPeerTls, once in main before any
// server or channel exists): a daemon talks to all its peers as one node, and
// threading credentials through every layer that dials a peer (the router's
// worker groups, the rendezvous client, the Gloo store, the NCCL id exchange)
// would make each of them carry a parameter only main sets. Tests that need
// a different identity per call build credentials from a TlsConfig directly.
//
// Not covered: the collectives' own connections between ranks (Gloo TCP or
// ibverbs, NCCL), /metrics, and the router's public Generate API, which API
// keys guard (router/api/auth.h).
#ifndef RINGLANE_SERVICES_GRPC_SECURITY_H_
#define RINGLANE_SERVICES_GRPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringlane::services {

// The three flags as given: file paths, empty when not set.
struct TlsFiles {
  std::string ca;    // --tls_ca: PEM of the CA that signs every peer's certificate
  std::string cert;  // --tls_cert: PEM certificate chain of this daemon
  std::string key;   // --tls_key: PEM private key of --tls_cert
};

// The PEM contents, read once at start-up.
struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

// Reads the files: nullopt when none is given (plaintext); InvalidArgument
// naming the flag when only some are given, or a file is missing,
// unreadable, empty or not PEM. Whether the key matches the certificate is
// found when a server or channel first uses them.
absl::StatusOr<std::optional<TlsConfig>> LoadTls(const TlsFiles& files);

// Server credentials that require and verify a client certificate from the
// CA; insecure ones for nullopt.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsConfig>& tls);
// Channel credentials that present the certificate and verify the server;
// insecure ones for nullopt.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::optional<TlsConfig>& tls);

// The process-wide identity toward peers. Thread-safe; set it before the
// first server or channel, since those made earlier keep what they got.
void SetPeerTls(std::optional<TlsConfig> tls);
bool PeerTlsEnabled();
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials();
std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials();
// A channel to a peer daemon at `address` with PeerChannelCredentials().
std::shared_ptr<grpc::Channel> NewPeerChannel(
    const std::string& address, const grpc::ChannelArguments& args = grpc::ChannelArguments());

// True for addresses only this machine can reach (localhost, 127.0.0.0/8,
// ::1): a listener on one needs neither keys nor TLS; one on any other
// address (wildcards included) is refused without them unless the operator
// says otherwise.
bool IsLoopbackHost(std::string_view host);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_GRPC_SECURITY_H_
