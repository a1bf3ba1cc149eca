#include "services/grpc_security.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

using ::testing::HasSubstr;

// Two independent CAs made by the real script, once per test binary.
const std::string& CertDir(const std::string& name) {
  static const std::string root = [] {
    std::string d = absl::StrCat(::testing::TempDir(), "/grpc_security_test_", getpid());
    for (const char* ca : {"a", "b"}) {
      const std::string cmd =
          absl::StrCat(RINGLANE_SOURCE_DIR, "/tools/make_certs.sh ", d, "/", ca, " 2>/dev/null");
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return d;
  }();
  static std::string a = root + "/a", b = root + "/b";
  return name == "a" ? a : b;
}

TlsFiles Files(const std::string& ca_dir, const std::string& leaf, const std::string& leaf_dir) {
  return {CertDir(ca_dir) + "/ca.pem", CertDir(leaf_dir) + "/" + leaf + ".pem",
          CertDir(leaf_dir) + "/" + leaf + ".key"};
}

TlsConfig Load(const TlsFiles& f) {
  auto t = LoadTls(f);
  EXPECT_TRUE(t.ok() && t->has_value()) << t.status();
  return t.ok() && t->has_value() ? **t : TlsConfig();
}

TEST(LoadTlsTest, NoneMeansPlaintext) {
  auto t = LoadTls({});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
}

TEST(LoadTlsTest, AllThreeOrNone) {
  TlsFiles f = Files("a", "node", "a");
  f.key.clear();
  auto t = LoadTls(f);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("missing: --tls_key"));
  auto only_ca = LoadTls({.ca = f.ca});
  EXPECT_THAT(only_ca.status().message(), HasSubstr("missing: --tls_cert, --tls_key"));
}

TEST(LoadTlsTest, MissingEmptyOrNonPemFilesNameTheirFlag) {
  TlsFiles f = Files("a", "node", "a");
  f.cert = "/nonexistent/node.pem";
  auto t = LoadTls(f);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("--tls_cert: cannot read /nonexistent/node.pem"));

  const std::string empty = ::testing::TempDir() + "/grpc_security_empty.pem";
  std::ofstream(empty).close();
  f = Files("a", "node", "a");
  f.key = empty;
  EXPECT_THAT(LoadTls(f).status().message(), HasSubstr("--tls_key: " + empty + " is empty"));

  const std::string junk = ::testing::TempDir() + "/grpc_security_junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  f = Files("a", "node", "a");
  f.ca = junk;
  EXPECT_THAT(LoadTls(f).status().message(), HasSubstr("--tls_ca: " + junk + " is not PEM"));

  f = Files("a", "node", "a");
  f.ca = CertDir("a");  // a directory reads as nothing
  EXPECT_FALSE(LoadTls(f).ok());
}

TEST(IsLoopbackHostTest, OnlyThisMachine) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.5"));
  EXPECT_FALSE(IsLoopbackHost("127example.com"));
}

// Answers every health check; counts the calls that reached it.
class CountingHealth final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* resp) override {
    ++calls;
    resp->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

// A real server over mutual TLS from CA "a".
class MutualTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", ServerCredentials(Load(Files("a", "node", "a"))), &port_);
    b.RegisterService(&health_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ > 0);
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status Check(std::shared_ptr<grpc::ChannelCredentials> creds,
                     const std::string& host = "127.0.0.1") {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(absl::StrCat(host, ":", port_), std::move(creds)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    return stub->Check(&ctx, req, &resp);
  }

  CountingHealth health_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(MutualTlsTest, APeerWithACertificateOfTheCaIsServed) {
  EXPECT_TRUE(Check(ChannelCredentials(Load(Files("a", "client", "a")))).ok());
  EXPECT_TRUE(Check(ChannelCredentials(Load(Files("a", "node", "a")))).ok());
  EXPECT_TRUE(Check(ChannelCredentials(Load(Files("a", "node", "a"))), "localhost").ok());
}

TEST_F(MutualTlsTest, PlaintextNoCertificateAndForeignCertificatesAreRefused) {
  EXPECT_EQ(Check(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // Trusts the server but shows no certificate of its own.
  grpc::SslCredentialsOptions server_only;
  server_only.pem_root_certs = Load(Files("a", "node", "a")).ca_pem;
  EXPECT_EQ(Check(grpc::SslCredentials(server_only)).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A certificate of another CA, even while trusting the server's CA.
  TlsConfig foreign = Load(Files("b", "client", "b"));
  foreign.ca_pem = Load(Files("a", "node", "a")).ca_pem;
  EXPECT_EQ(Check(ChannelCredentials(foreign)).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client of another CA does not trust this server either.
  EXPECT_EQ(Check(ChannelCredentials(Load(Files("b", "client", "b")))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(health_.calls.load(), 0);  // refused at the handshake, before any handler
}

TEST_F(MutualTlsTest, TheProcessIdentityIsUsedByPeerChannels) {
  SetPeerTls(std::nullopt);
  EXPECT_FALSE(PeerTlsEnabled());
  EXPECT_EQ(Check(PeerChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  SetPeerTls(Load(Files("a", "node", "a")));
  EXPECT_TRUE(PeerTlsEnabled());
  auto stub = grpc::health::v1::Health::NewStub(NewPeerChannel(absl::StrCat("127.0.0.1:", port_)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(stub->Check(&ctx, {}, &resp).ok());
  SetPeerTls(std::nullopt);
}

}  // namespace
}  // namespace ringlane::services
