// Authentication end to end on real daemons: API keys on the router's gRPC
// Generate API (and the HTTP rule it shares), mutual TLS between router,
// workers and the rendezvous, and the flags that turn them on. Certificates
// come from the real tools/make_certs.sh: CA "a" is the cluster's, CA "b" an
// outsider's.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "ringlane/v1/rendezvous.grpc.pb.h"
#include "ringlane/v1/worker.grpc.pb.h"
#include "router/client/worker_group.h"
#include "services/grpc_security.h"
#include "services/http_client.h"
#include "tests/support/cluster.h"
#include "tests/support/http_probe.h"
#include "tests/support/kvstore.h"
#include "tests/support/lane_runner.h"
#include "tests/support/worker_rpc.h"

namespace ringlane {
namespace {

namespace v1 = ringlane::v1;
using services::HttpRequestSpec;
using services::TlsConfig;
using services::TlsFiles;
using testing::Daemon;
using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunToExit;
using testing::SourcePath;
using testing::WorkerGroup;
using testing::WorkerStub;

const char* kWorker = testing::kWorkerBin;
const char* kRouter = testing::kRouterBin;

std::string Model() { return testing::StoriesModel(); }
std::string Tok() { return testing::StoriesTokenizer(); }
const std::vector<testing::GoldenCase>& Goldens() { return testing::GoldenCases(); }

// The certificate directory of CA `ca` ("a" or "b"), made once per binary.
std::string CertDir(const std::string& ca) {
  static const std::string root = [] {
    const std::string d = absl::StrCat(::testing::TempDir(), "/security_e2e_", getpid());
    for (const char* c : {"a", "b"}) {
      const std::string cmd =
          absl::StrCat(SourcePath("tools/make_certs.sh"), " ", d, "/", c, " 2>/dev/null");
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return d;
  }();
  return root + "/" + ca;
}

std::vector<std::string> TlsFlags(const std::string& ca) {
  const std::string d = CertDir(ca);
  return {"--tls_ca=" + d + "/ca.pem", "--tls_cert=" + d + "/node.pem",
          "--tls_key=" + d + "/node.key"};
}

// Credentials of a client: `leaf_ca`'s client certificate, trusting `trust_ca`.
TlsConfig ClientTls(const std::string& leaf_ca, const std::string& trust_ca) {
  auto t = services::LoadTls({CertDir(trust_ca) + "/ca.pem", CertDir(leaf_ca) + "/client.pem",
                              CertDir(leaf_ca) + "/client.key"});
  EXPECT_TRUE(t.ok() && t->has_value()) << t.status();
  return t.ok() && t->has_value() ? **t : TlsConfig();
}

grpc::Status GetInfo(v1::Worker::Stub& stub, v1::WorkerInfo* info = nullptr) {
  v1::WorkerInfo ignored;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return stub.GetInfo(&ctx, {}, info ? info : &ignored);
}

std::unique_ptr<Daemon> StartRouter(const WorkerGroup& workers,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--connect_timeout_ms=500"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return testing::StartRouter(workers.Workers(), flags);
}

// A Generate-API client that sends `authorization` (none when empty).
struct ApiClient {
  std::unique_ptr<v1::Generate::Stub> stub;
  std::string authorization;

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
  }
  // Token ids of a greedy generation, and the call's status.
  grpc::Status Generate(const std::vector<int32_t>& prompt, int max_tokens,
                        std::vector<int32_t>* ids = nullptr) const {
    const v1::GenerateRequest r = testing::GreedyRequest(prompt, max_tokens);
    grpc::ClientContext ctx;
    Prepare(&ctx);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      if (ids) ids->insert(ids->end(), m.token_ids().begin(), m.token_ids().end());
    }
    return reader->Finish();
  }
  grpc::Status ListModels(std::map<std::string, int64_t>* state = nullptr,
                          v1::ListModelsResponse* resp = nullptr) const {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListModelsResponse ignored;
    grpc::Status st = stub->ListModels(&ctx, {}, resp ? resp : &ignored);
    if (state) *state = testing::TrailingState(ctx);
    return st;
  }
  grpc::Status Tokenize(const std::string& text) const {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::TokenizeRequest req;
    req.set_text(text);
    v1::TokenizeResponse resp;
    return stub->Tokenize(&ctx, req, &resp);
  }
};

ApiClient Api(const Daemon& router, std::string authorization = "") {
  return {v1::Generate::NewStub(
              grpc::CreateChannel(router.address("router"), grpc::InsecureChannelCredentials())),
          std::move(authorization)};
}

bool WaitReady(const ApiClient& api, std::chrono::milliseconds timeout) {
  return testing::WaitFor(
      [&] {
        v1::ListModelsResponse resp;
        return api.ListModels(nullptr, &resp).ok() && resp.models_size() == 1 &&
               resp.models(0).num_ready_groups() == 1;
      },
      timeout);
}

int64_t FileLines(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

TEST(GenerateApiKeysTest, UnauthenticatedCallsAreRefusedAndChangeNothing) {
  const std::string keys = ::testing::TempDir() + "/security_keys.txt";
  std::ofstream(keys) << "# test keys\nsecret-1\nsecret-2\n";
  const std::string rounds = absl::StrCat(::testing::TempDir(), "/security_rounds_", getpid());
  std::remove(rounds.c_str());
  WorkerGroup workers(1);
  ASSERT_TRUE(workers.Start());
  auto router = StartRouter(workers, {"--api_key_file=" + keys, "--round_log=" + rounds});
  ASSERT_NE(router, nullptr);
  const ApiClient good = Api(*router, "Bearer secret-1");
  ASSERT_TRUE(WaitReady(good, std::chrono::seconds(60))) << router->Stderr();

  std::map<std::string, int64_t> before;
  ASSERT_TRUE(good.ListModels(&before).ok());
  const int64_t rounds_before = FileLines(rounds);
  // A long prompt: had it been queued, its prefill would show in the counters.
  std::vector<int32_t> long_prompt(200, 42);
  for (const std::string auth : {"", "Bearer nope", "Bearer secret-", "Bearer secret-11",
                                 "Basic secret-1", "secret-1", "Bearer"}) {
    const ApiClient bad = Api(*router, auth);
    grpc::Status st = bad.Generate(long_prompt, 50);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "'" << auth << "'";
    EXPECT_EQ(bad.Tokenize("Lily").error_code(), grpc::StatusCode::UNAUTHENTICATED) << auth;
    EXPECT_EQ(bad.ListModels().error_code(), grpc::StatusCode::UNAUTHENTICATED) << auth;
    if (auth.empty()) {
      EXPECT_THAT(st.error_message(), HasSubstr("no API key"));
    }
  }
  std::map<std::string, int64_t> after;
  ASSERT_TRUE(good.ListModels(&after).ok());
  EXPECT_EQ(after["ringlane-prefilled-tokens"], before["ringlane-prefilled-tokens"]);
  EXPECT_EQ(after["ringlane-waiting"], 0);
  EXPECT_EQ(after["ringlane-active-lanes"], 0);
  EXPECT_EQ(FileLines(rounds), rounds_before);

  // The scheme in any case, either key: the golden output.
  const testing::GoldenCase& g = Goldens()[0];
  for (const std::string auth : {"Bearer secret-1", "bearer secret-2", "BEARER  secret-1"}) {
    std::vector<int32_t> ids;
    grpc::Status st = Api(*router, auth).Generate(g.prompt, static_cast<int>(g.ids.size()), &ids);
    ASSERT_TRUE(st.ok()) << auth << ": " << st.error_message();
    EXPECT_EQ(ids, g.ids) << auth;
  }
  EXPECT_GT(FileLines(rounds), rounds_before);

  // The HTTP gateway applies the same check.
  auto client = testing::Connect(router->address("http"));
  ASSERT_NE(client, nullptr);
  auto post = [&](const std::string& auth) {
    HttpRequestSpec spec{.method = "POST", .target = "/v1/completions"};
    spec.body = R"({"model":"stories260K","prompt":"Lily","max_tokens":2})";
    if (!auth.empty()) spec.headers.push_back({"Authorization", auth});
    auto r = client->Send(spec, absl::Seconds(60));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->status : 0;
  };
  EXPECT_EQ(post(""), 401);
  EXPECT_EQ(post("Bearer secret-"), 401);
  EXPECT_EQ(post("Basic secret-1"), 401);
  EXPECT_EQ(post("bearer secret-1"), 200);
  EXPECT_EQ(post("Bearer secret-2"), 200);

  // Operators see the refusals: 7 Generate calls answered UNAUTHENTICATED (16).
  auto metrics = client->Send({.target = "/metrics"}, absl::Seconds(10));
  ASSERT_TRUE(metrics.ok() && metrics->status == 200);
  // Labels in name order: code, then method.
  EXPECT_EQ(testing::Metric(metrics->body, "ringlane_grpc_requests_total",
                            "{code=\"16\",method=\"Generate\"}"),
            7)
      << metrics->body;
}

TEST(GenerateApiKeysTest, WithoutKeysTheApiIsOpenOnLoopbackOnly) {
  WorkerGroup workers(1);
  ASSERT_TRUE(workers.Start());
  auto router = StartRouter(workers, {});
  ASSERT_NE(router, nullptr);
  const ApiClient anyone = Api(*router);
  ASSERT_TRUE(WaitReady(anyone, std::chrono::seconds(60)));
  EXPECT_TRUE(anyone.Generate(Goldens()[0].prompt, 4).ok());
  // An Authorization value is ignored when no keys are set.
  EXPECT_TRUE(Api(*router, "Bearer whatever").Generate(Goldens()[0].prompt, 4).ok());

  RunResult open = RunToExit(kRouter, {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(),
                                       "--listen=0.0.0.0:0", "--http_listen=off"});
  EXPECT_EQ(open.code, 2) << open.err;
  EXPECT_THAT(open.err, HasSubstr("--listen=0.0.0.0:0 is reachable from other hosts"));
}

TEST(SecurityFlagsTest, TlsFlagsGoTogetherAndTheirFilesMustBeReadable) {
  const std::string d = CertDir("a");
  const std::vector<std::string> worker = {"--model=" + Model(), "--listen=127.0.0.1:0"};
  const std::vector<std::string> router = {"--workers=127.0.0.1:1", "--tokenizer=" + Tok(),
                                           "--listen=127.0.0.1:0", "--http_listen=off"};
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tls_ca=" + d + "/ca.pem"}, "all three or none); missing: --tls_cert, --tls_key"},
      {{"--tls_ca=" + d + "/ca.pem", "--tls_cert=" + d + "/node.pem"}, "missing: --tls_key"},
      {{"--tls_cert=" + d + "/node.pem", "--tls_key=" + d + "/node.key"}, "missing: --tls_ca"},
      {{"--tls_ca=" + d + "/nope.pem", "--tls_cert=" + d + "/node.pem",
        "--tls_key=" + d + "/node.key"},
       "--tls_ca: cannot read " + d + "/nope.pem"},
      {{"--tls_ca=" + d + "/ca.pem", "--tls_cert=" + d + "/sans.txt",
        "--tls_key=" + d + "/node.key"},
       "--tls_cert: " + d + "/sans.txt is not PEM"},
  };
  for (const Case& c : cases) {
    for (const auto* base : {&worker, &router}) {
      std::vector<std::string> args = *base;
      args.insert(args.end(), c.flags.begin(), c.flags.end());
      RunResult r = RunToExit(base == &worker ? kWorker : kRouter, args);
      EXPECT_EQ(r.code, 2) << c.message << "\n" << r.err;
      EXPECT_THAT(r.err, HasSubstr(c.message));
    }
  }
  // A worker reachable from other hosts needs TLS, or an explicit opt-out.
  RunResult open = RunToExit(kWorker, {"--model=" + Model(), "--listen=0.0.0.0:0"});
  EXPECT_EQ(open.code, 2) << open.err;
  EXPECT_THAT(open.err, HasSubstr("TLS is off"));
  // A key that does not belong to the certificate cannot serve.
  RunResult mismatched =
      RunToExit(kWorker,
                {"--model=" + Model(), "--listen=127.0.0.1:0", "--tls_ca=" + d + "/ca.pem",
                 "--tls_cert=" + d + "/node.pem", "--tls_key=" + d + "/client.key"},
                std::chrono::seconds(30));
  EXPECT_EQ(mismatched.code, 1) << mismatched.err;
  EXPECT_THAT(mismatched.err, HasSubstr("--tls_cert and --tls_key do not match"));
}

// One TLS worker: outsiders are refused at the handshake and its KV pool is
// what the authorized client left there.
// Probes that cannot present a client certificate (the kubelet's) get a
// plaintext port with the health service alone: it says SERVING once the
// group is formed, and serves nothing else.
TEST(WorkerMutualTlsTest, TheHealthPortIsPlaintextAndServesOnlyHealth) {
  WorkerGroup ranks(1,
                    [] {
                      std::vector<std::string> f = TlsFlags("a");
                      f.push_back("--health_listen=127.0.0.1:0");
                      return f;
                    }(),
                    {"worker", "health"});
  ASSERT_TRUE(ranks.Start());
  auto ch =
      grpc::CreateChannel(ranks.rank(0).address("health"), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(ch);
  auto status = [&](const std::string& service) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = health->Check(&ctx, req, &resp);
    return st.ok() ? static_cast<int>(resp.status()) : -static_cast<int>(st.error_code());
  };
  EXPECT_TRUE(testing::PollUntil([&] {
    return status("ringlane.v1.Worker") == grpc::health::v1::HealthCheckResponse::SERVING;
  })) << status("ringlane.v1.Worker");
  EXPECT_EQ(status(""), grpc::health::v1::HealthCheckResponse::SERVING);
  // The Worker service is not there: only behind mutual TLS.
  auto plain = WorkerStub(ranks.rank(0).address("health"), grpc::InsecureChannelCredentials());
  EXPECT_EQ(GetInfo(*plain).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(WorkerMutualTlsTest, PlaintextAndForeignPeersAreRefusedAndTheKvIsUnchanged) {
  WorkerGroup ranks(1, [] {
    std::vector<std::string> f = TlsFlags("a");
    f.push_back("--kv_blocks=16");
    f.push_back("--block_size=16");
    return f;
  }());
  ASSERT_TRUE(ranks.Start());
  const std::string addr = ranks.rank(0).address();

  auto plain = WorkerStub(addr, grpc::InsecureChannelCredentials());
  EXPECT_EQ(GetInfo(*plain).error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ClientTls("a", "a").ca_pem;
  auto anonymous = WorkerStub(addr, grpc::SslCredentials(no_cert));
  EXPECT_EQ(GetInfo(*anonymous).error_code(), grpc::StatusCode::UNAVAILABLE);
  // Another CA's certificate, from a client that does trust the worker.
  auto foreign = WorkerStub(addr, services::ChannelCredentials(ClientTls("b", "a")));
  EXPECT_EQ(GetInfo(*foreign).error_code(), grpc::StatusCode::UNAVAILABLE);

  // The authorized driver: this process dials peers as CA a's client.
  services::SetPeerTls(ClientTls("a", "a"));
  auto group = router::WorkerGroupClient::Connect({addr}, std::chrono::seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  const testing::GoldenCase& gold = Goldens()[3];  // one-token prompt, 200 generated
  std::vector<int32_t> prompt = gold.prompt;
  prompt.insert(prompt.end(), gold.ids.begin(), gold.ids.begin() + 40);
  auto first = (*group)->Run(testing::OneRowPlan(1, 0, prompt, {0, 1, 2}));
  ASSERT_TRUE(first.ok() && first->error().code() == 0) << first.status();
  EXPECT_EQ(first->outputs(0).tokens(0).token_id(), gold.ids[40]);

  const v1::ExportKvBlocksRequest ereq = testing::ExportRequest({0, 1});
  auto export_blocks = [&](v1::Worker::Stub& stub, std::vector<v1::KvBlockChunk>* out) {
    return testing::ExportKv(stub, ereq, out, std::chrono::seconds(10));
  };
  auto authorized = WorkerStub(addr, services::PeerChannelCredentials());
  std::vector<v1::KvBlockChunk> kv_before;
  ASSERT_TRUE(export_blocks(*authorized, &kv_before).ok());
  ASSERT_FALSE(kv_before.empty());

  // The outsider tries to read the blocks, overwrite them and run a round.
  for (v1::Worker::Stub* stub : {plain.get(), foreign.get()}) {
    std::vector<v1::KvBlockChunk> stolen;
    EXPECT_EQ(export_blocks(*stub, &stolen).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(stolen.empty());
    {
      std::vector<v1::KvBlockChunk> flipped = kv_before;
      for (v1::KvBlockChunk& c : flipped) {
        for (char& b : *c.mutable_data()) b = static_cast<char>(~b);
      }
      v1::ImportKvBlocksResponse resp;
      EXPECT_EQ(testing::ImportKv(*stub, flipped, &resp, std::chrono::seconds(10)).error_code(),
                grpc::StatusCode::UNAVAILABLE);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      auto s = stub->Rounds(&ctx);
      s->Write(testing::OneRowPlan(9, 0, {1, 2, 3}, {0}));
      s->WritesDone();
      v1::RoundResult r;
      EXPECT_FALSE(s->Read(&r));
      EXPECT_EQ(s->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
    }
  }

  std::vector<v1::KvBlockChunk> kv_after;
  ASSERT_TRUE(export_blocks(*authorized, &kv_after).ok());
  ASSERT_EQ(kv_after.size(), kv_before.size());
  for (size_t i = 0; i < kv_before.size(); ++i) {
    EXPECT_EQ(kv_after[i].SerializeAsString(), kv_before[i].SerializeAsString()) << i;
  }
  // A new lane over the first two blocks goes on as if from position 32.
  std::vector<int32_t> rest(prompt.begin() + 32, prompt.end());
  auto second = (*group)->Run(testing::OneRowPlan(2, 32, rest, {0, 1, 3}));
  ASSERT_TRUE(second.ok() && second->error().code() == 0) << second.status();
  EXPECT_EQ(second->outputs(0).tokens(0).token_id(), gold.ids[40]);
  EXPECT_EQ(second->outputs(0).tokens(0).logprob(), first->outputs(0).tokens(0).logprob());
  group->reset();
  services::SetPeerTls(std::nullopt);
}

// The whole cluster over mutual TLS: rank 1 joins rank 0's rendezvous, the
// router drives the group; outsiders can neither join nor drive it.
TEST(TlsClusterTest, Tp2GroupAndRouterServeGoldenOutputAndOutsidersCannotJoin) {
  WorkerGroup ranks(2, TlsFlags("a"));
  ASSERT_TRUE(ranks.Start());
  auto router = StartRouter(ranks, TlsFlags("a"));
  ASSERT_NE(router, nullptr);
  const ApiClient api = Api(*router);
  ASSERT_TRUE(WaitReady(api, std::chrono::seconds(60))) << router->Stderr();

  // Plaintext at the rendezvous: refused before the service sees a request.
  auto rendezvous = v1::Rendezvous::NewStub(
      grpc::CreateChannel(ranks.rank(0).address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::RendezvousJoinRequest req;
    req.set_group("default");
    req.set_rank(1);
    req.set_world_size(2);
    v1::RendezvousJoinResponse resp;
    EXPECT_EQ(rendezvous->Join(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // A rank with another CA's certificate tries to take rank 1's place.
  std::vector<std::string> intruder_args = {"--model=" + Model(),
                                            "--threads=1",
                                            "--rank=1",
                                            "--world_size=2",
                                            "--listen=127.0.0.1:0",
                                            "--join_timeout_ms=1000",
                                            "--rendezvous=" + ranks.rank(0).address()};
  for (const std::string& f : TlsFlags("b")) intruder_args.push_back(f);
  auto intruder = Daemon::Start(kWorker, intruder_args);
  ASSERT_TRUE(intruder.ok()) << intruder.status();
  // A router without TLS never gets the group.
  auto plain_router = StartRouter(ranks, {});
  ASSERT_NE(plain_router, nullptr);

  for (const testing::GoldenCase& g : Goldens()) {
    std::vector<int32_t> ids;
    grpc::Status st = api.Generate(g.prompt, static_cast<int>(g.ids.size()), &ids);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(ids, g.ids);
  }
  EXPECT_FALSE(WaitReady(Api(*plain_router), std::chrono::seconds(2)));
  // The group is the one that formed first: epoch 1 on both ranks.
  services::SetPeerTls(ClientTls("a", "a"));
  for (const auto& r : ranks.ranks()) {
    v1::WorkerInfo info;
    auto stub = WorkerStub(r->address(), services::PeerChannelCredentials());
    ASSERT_TRUE(GetInfo(*stub, &info).ok());
    EXPECT_TRUE(info.group_ready());
    EXPECT_EQ(info.group_epoch(), 1);
  }
  services::SetPeerTls(std::nullopt);
  EXPECT_THAT(ranks.rank(0).Stderr(), HasSubstr("mutual TLS"));
}

}  // namespace
}  // namespace ringlane
