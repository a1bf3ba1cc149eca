#include "services/grpc_security.h"

#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ringlane::services {

namespace {

// Anything bigger is not a certificate file; reading it whole would let a
// wrong path (a model file, /dev/zero) eat memory before failing.
constexpr std::streamsize kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::string text;
  text.resize(kMaxPemBytes + 1);
  in.read(text.data(), kMaxPemBytes + 1);
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  text.resize(in.gcount());
  if (text.size() > static_cast<size_t>(kMaxPemBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is larger than 1 MiB"));
  }
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, text.empty() ? " is empty" : " is not PEM"));
  }
  return text;
}

absl::Mutex peer_mu(absl::kConstInit);
std::optional<TlsConfig>* peer_tls ABSL_GUARDED_BY(peer_mu) = nullptr;

}  // namespace

absl::StatusOr<std::optional<TlsConfig>> LoadTls(const TlsFiles& f) {
  const int given = !f.ca.empty() + !f.cert.empty() + !f.key.empty();
  if (given == 0) return std::optional<TlsConfig>();
  if (given != 3) {
    std::string missing;
    for (auto [name, v] :
         {std::pair{"--tls_ca", &f.ca}, {"--tls_cert", &f.cert}, {"--tls_key", &f.key}}) {
      if (v->empty()) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_ca, --tls_cert and --tls_key go together (all three or none); missing: ", missing));
  }
  TlsConfig c;
  for (auto [flag, path, out] : {std::tuple{"--tls_ca", &f.ca, &c.ca_pem},
                                 {"--tls_cert", &f.cert, &c.cert_pem},
                                 {"--tls_key", &f.key, &c.key_pem}}) {
    absl::StatusOr<std::string> pem = ReadPem(flag, *path);
    if (!pem.ok()) return pem.status();
    *out = std::move(*pem);
  }
  return std::optional<TlsConfig>(std::move(c));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsConfig>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls->ca_pem;
  o.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::optional<TlsConfig>& tls) {
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls->ca_pem;
  o.pem_private_key = tls->key_pem;
  o.pem_cert_chain = tls->cert_pem;
  return grpc::SslCredentials(o);
}

void SetPeerTls(std::optional<TlsConfig> tls) {
  absl::MutexLock l(&peer_mu);
  delete peer_tls;
  peer_tls = new std::optional<TlsConfig>(std::move(tls));
}

bool PeerTlsEnabled() {
  absl::MutexLock l(&peer_mu);
  return peer_tls != nullptr && peer_tls->has_value();
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials() {
  absl::MutexLock l(&peer_mu);
  return ServerCredentials(peer_tls ? *peer_tls : std::nullopt);
}

std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials() {
  absl::MutexLock l(&peer_mu);
  return ChannelCredentials(peer_tls ? *peer_tls : std::nullopt);
}

std::shared_ptr<grpc::Channel> NewPeerChannel(const std::string& address,
                                              const grpc::ChannelArguments& args) {
  return grpc::CreateCustomChannel(address, PeerChannelCredentials(), args);
}

bool IsLoopbackHost(std::string_view host) {
  return host == "localhost" || host == "::1" || host.substr(0, 4) == "127.";
}

}  // namespace ringlane::services
