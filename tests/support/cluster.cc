#include "tests/support/cluster.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/support/http_probe.h"
#include "tests/support/lane_runner.h"

namespace ringlane::testing {

std::string StoriesModel() { return SourcePath("deploy/models/stories260K/stories260K.bin"); }
std::string StoriesTokenizer() { return SourcePath("deploy/models/stories260K/tok512.bin"); }

WorkerGroup::WorkerGroup(int world, std::vector<std::string> flags, std::vector<std::string> names)
    : world_(world),
      flags_(std::move(flags)),
      names_(std::move(names)),
      addresses_(world),
      ranks_(world) {}

bool WorkerGroup::Start() {
  for (int r = 0; r < world_; ++r) {
    if (!StartRank(r)) return false;
  }
  return true;
}

bool WorkerGroup::StartRank(int r, const std::string& listen) {
  // The old daemon goes first: a restart on its address needs the port.
  ranks_[r].reset();
  std::vector<std::string> a = {"--model=" + StoriesModel(), "--threads=1",
                                absl::StrCat("--rank=", r), absl::StrCat("--world_size=", world_),
                                "--listen=" + listen};
  if (r > 0) a.push_back("--rendezvous=" + addresses_[0]);
  a.insert(a.end(), flags_.begin(), flags_.end());
  auto d = Daemon::Start(kWorkerBin, a, names_);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return false;
  ranks_[r] = std::move(*d);
  addresses_[r] = ranks_[r]->address();
  return true;
}

bool WorkerGroup::Restart(int r) { return StartRank(r, addresses_[r]); }

int WorkerGroup::started() const {
  int n = 0;
  for (const auto& d : ranks_) n += d != nullptr;
  return n;
}

std::vector<std::string> WorkerGroup::Addresses() const { return addresses_; }

std::string WorkerGroup::Workers() const { return absl::StrJoin(addresses_, ","); }

double WorkerGroup::RankMetric(const std::string& name) {
  double sum = 0;
  for (auto& d : ranks_) {
    auto r = GetOnce(d->address("metrics"), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) sum += Metric(r->body, name);
  }
  return sum;
}

std::unique_ptr<Daemon> StartRouter(const std::string& workers,
                                    const std::vector<std::string>& flags) {
  std::vector<std::string> a = {"--workers=" + workers, "--tokenizer=" + StoriesTokenizer(),
                                "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0"};
  a.insert(a.end(), flags.begin(), flags.end());
  auto r = Daemon::Start(kRouterBin, a, {"router", "http"});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

std::unique_ptr<services::HttpClient> Cluster::Client() const { return Connect(http()); }

std::unique_ptr<Cluster> StartCluster(const ClusterOptions& o) {
  auto c = std::make_unique<Cluster>();
  // Port 0 everywhere: a cluster from `make serve` may hold the default ports.
  std::string workers = "127.0.0.1:1";
  if (o.world > 0) {
    // Ranks given a metrics port announce it, and RankMetric reads it.
    std::vector<std::string> names = {"worker"};
    for (const std::string& f : o.worker_flags) {
      if (f.rfind("--metrics_port=", 0) == 0) names.push_back("metrics");
    }
    c->workers = std::make_unique<WorkerGroup>(o.world, o.worker_flags, names);
    if (!c->workers->Start()) return nullptr;
    workers = c->workers->Workers();
  }
  c->router = StartRouter(workers, o.router_flags);
  if (c->router == nullptr) return nullptr;
  c->stub = v1::Generate::NewStub(
      grpc::CreateChannel(c->router->address("router"), grpc::InsecureChannelCredentials()));
  bool up = true;
  switch (o.ready) {
    case ClusterOptions::Ready::kGrpc:
      up = WaitFor([&] { return HasReadyGroups(*c->stub); }, std::chrono::seconds(60));
      break;
    case ClusterOptions::Ready::kHttp:
      up = WaitForHttpStatus(c->http(), "/ready", 200, std::chrono::seconds(60));
      break;
    case ClusterOptions::Ready::kListening:
      break;
  }
  if (!up) {
    ADD_FAILURE() << "the router never became ready: " << c->router->Stderr();
    return nullptr;
  }
  return c;
}

bool HasReadyGroups(v1::Generate::Stub& stub, int groups) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse resp;
  return stub.ListModels(&ctx, {}, &resp).ok() && resp.models_size() == 1 &&
         resp.models(0).num_ready_groups() == groups;
}

v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

CallOut Call(v1::Generate::Stub& stub, const v1::GenerateRequest& req,
             std::chrono::seconds deadline) {
  CallOut out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ChoiceOut& c = out.choices[m.index()];
    c.ids.insert(c.ids.end(), m.token_ids().begin(), m.token_ids().end());
    for (const v1::LogprobEntry& e : m.logprobs()) {
      c.logprobs.push_back(e.logprob());
      for (const v1::TokenLogprob& a : e.top_logprobs()) {
        c.top_ids.push_back(a.token_id());
        c.top_logprobs.push_back(a.logprob());
      }
    }
    c.text += m.text();
    ++c.messages;
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) c.finish = m.finish_reason();
    if (m.has_stop_string()) c.stop_string = m.stop_string();
    if (m.has_usage()) {
      out.usage = m.usage();
      out.has_usage = true;
    }
  }
  out.status = reader->Finish();
  return out;
}

std::map<std::string, int64_t> TrailingState(const grpc::ClientContext& ctx) {
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    out[std::string(k.data(), k.size())] = std::stoll(std::string(v.data(), v.size()));
  }
  return out;
}

}  // namespace ringlane::testing
