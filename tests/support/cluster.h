// A ringlane cluster on loopback for the end-to-end tests: worker groups of
// the bundled model (stories260K) and a router in front of them, every daemon
// a real child process on a free port (tests/support/daemon.h), plus the
// gRPC Generate calls a client makes. Used from the test's main thread; the
// call helpers may run on several threads at once.
#ifndef RINGLANE_TESTS_SUPPORT_CLUSTER_H_
#define RINGLANE_TESTS_SUPPORT_CLUSTER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ringlane/v1/generate.grpc.pb.h"
#include "services/http_client.h"
#include "tests/support/daemon.h"

namespace ringlane::testing {

// The bundled model, its tokenizer, and the id the router serves it under.
std::string StoriesModel();
std::string StoriesTokenizer();
inline constexpr char kStoriesModelId[] = "stories260K";

// The daemons' binaries (the test targets define where they are built).
inline constexpr char kWorkerBin[] = RINGLANE_WORKER_BIN;
inline constexpr char kRouterBin[] = RINGLANE_ROUTER_BIN;

// The ranks of one worker group of the bundled model, one compute thread
// each, every rank started with `flags` (kept, so that a rank can be started
// again). Ranks > 0 join rank 0's address as their rendezvous. Owns the
// daemons; not thread-safe.
class WorkerGroup {
 public:
  // `names`: the LISTENING lines to wait for ("metrics" with --metrics_port).
  explicit WorkerGroup(int world, std::vector<std::string> flags = {},
                       std::vector<std::string> names = {"worker"});

  // Ranks 0..world-1 on free ports; false, after a failed expectation, when
  // one does not come up.
  bool Start();
  // (Re)starts rank `r` listening on `listen`, replacing the daemon there.
  bool StartRank(int r, const std::string& listen = "127.0.0.1:0");
  // Starts rank `r` again where it listened before (its peers and the
  // router find it at the same address).
  bool Restart(int r);

  int world() const { return world_; }
  // How many ranks run (started, and not replaced by a failed start).
  int started() const;
  Daemon& rank(int r) { return *ranks_[r]; }
  std::vector<std::unique_ptr<Daemon>>& ranks() { return ranks_; }
  // The ranks' gRPC addresses, in rank order, and joined for --workers.
  std::vector<std::string> Addresses() const;
  std::string Workers() const;
  // A metric summed over the ranks' /metrics (needs --metrics_port).
  double RankMetric(const std::string& name);

 private:
  const int world_;
  const std::vector<std::string> flags_;
  const std::vector<std::string> names_;
  std::vector<std::string> addresses_;  // where each rank last listened
  std::vector<std::unique_ptr<Daemon>> ranks_;
};

// Starts a router over `workers` (its --workers value: a group's ranks
// comma-separated, groups separated by ';'), gRPC and HTTP on free ports,
// the bundled tokenizer; `flags` come after those. Null, after a failed
// expectation, when it does not come up.
std::unique_ptr<Daemon> StartRouter(const std::string& workers,
                                    const std::vector<std::string>& flags = {});

// One worker group and a router in front of it.
struct Cluster {
  std::unique_ptr<WorkerGroup> workers;  // null when started without workers
  std::unique_ptr<Daemon> router;
  std::unique_ptr<v1::Generate::Stub> stub;  // the router's gRPC API

  // The gateway's host:port, and a new connection to it.
  const std::string& http() const { return router->address("http"); }
  std::unique_ptr<services::HttpClient> Client() const;
};

struct ClusterOptions {
  int world = 1;  // TP degree; 0: no workers, the router points at 127.0.0.1:1
  std::vector<std::string> worker_flags;
  std::vector<std::string> router_flags;
  // What "up" means: the gRPC API lists one ready group, or the gateway's
  // /ready says 200, or only that the daemons listen.
  enum class Ready { kGrpc, kHttp, kListening } ready = Ready::kGrpc;
};

// Null, after a failed expectation naming the router's log, when the
// cluster is not up within a minute.
std::unique_ptr<Cluster> StartCluster(const ClusterOptions& options);

// True once ListModels lists one model with `groups` ready groups.
bool HasReadyGroups(v1::Generate::Stub& stub, int groups = 1);

// A greedy request for `max_tokens` ids after `prompt`, past EOS.
v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens);

// Everything a client sees of one choice of a Generate call. Logprobs are
// kept as floats, to be compared bit for bit.
struct ChoiceOut {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  // Per token: the alternatives' ids and logprobs, flattened.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  std::string stop_string;
  int messages = 0;  // responses that carried this choice
};

struct CallOut {
  grpc::Status status;
  std::map<int, ChoiceOut> choices;  // by choice index
  v1::Usage usage;
  bool has_usage = false;
  int completion_tokens() const { return has_usage ? usage.completion_tokens() : -1; }
};

// Runs one Generate call to its end.
CallOut Call(v1::Generate::Stub& stub, const v1::GenerateRequest& req,
             std::chrono::seconds deadline = std::chrono::seconds(120));

// The router's live state, from a finished call's trailing metadata
// ("ringlane-active-lanes" and the like).
std::map<std::string, int64_t> TrailingState(const grpc::ClientContext& ctx);

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_CLUSTER_H_
