// The OpenAI-compatible HTTP gateway of the router:
//   POST /v1/completions, POST /v1/chat/completions (JSON or SSE streams),
//   GET /v1/models, POST /tokenize, POST /detokenize (also under /v1/),
//   GET /health (liveness: the process answers), GET /ready (readiness: a
//   worker group serves and the router is not draining), GET /metrics
//   (Prometheus text exposition of every router metric).
//
// Admission, in order: API key (401), per-key concurrency (429), the router's
// waiting queue (429 with Retry-After), a worker group (503). Every response
// is counted in ringlane_http_requests_total{endpoint, status}.
#ifndef RINGLANE_ROUTER_API_GATEWAY_H_
#define RINGLANE_ROUTER_API_GATEWAY_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "router/api/auth.h"
#include "router/api/http_server.h"
#include "router/api/openai_api.h"
#include "router/router.h"

namespace ringlane::router {

struct GatewayOptions {
  std::string listen = "127.0.0.1:8080";
  // Accepted API keys (Authorization: Bearer KEY). Empty: no key required.
  std::set<std::string> api_keys;
  // Whether /metrics needs a key too (when keys are set).
  bool metrics_require_key = false;
  // Choices (prompts x n) of generation requests in progress per API key
  // (per client IP when no keys are set); 0 = no limit.
  // Counting choices, not requests: one request with 16 prompts x n=16 is
  // 256 lanes' worth of work.
  int max_concurrent_per_key = 0;
  // Bounds on request bodies (JSON depth, choices per request, strings).
  openai::RequestLimits limits;
  // Longest X-Request-Id (the router's --max_request_id_bytes).
  size_t max_request_id_bytes = 128;
  // Logprob entries ((top_logprobs + 1) x max_tokens x choices) a
  // non-streamed response may hold; larger requests must stream. Each entry
  // costs about a kilobyte as JSON.
  int64_t max_buffered_logprobs = 1 << 16;
  size_t max_body_bytes = 16 << 20;
  int max_connections = 1024;
  int max_connections_per_peer = 256;
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds first_byte_timeout{10000};
  // Seconds a 429 asks the client to wait (Retry-After).
  int retry_after_s = 1;
};

class Gateway {
 public:
  // Serves `router` (which must outlive the gateway). InvalidArgument or
  // Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(Router* router, GatewayOptions options);
  ~Gateway();

  int port() const { return server_->port(); }
  // Readiness turns false and new generation requests get 503; running ones
  // go on.
  void BeginDrain() { draining_.store(true); }
  // BeginDrain, then keeps serving (readiness 503, new generations 503) until
  // the running generations end or `deadline` passes, so that a load
  // balancer sees the drain; then Shutdown(deadline).
  void Drain(absl::Time deadline);
  // Stops accepting and waits for running exchanges until `deadline` (see
  // HttpServer::Shutdown).
  void Shutdown(absl::Time deadline);

 private:
  Gateway(Router* router, GatewayOptions options);
  void Handle(const HttpRequest& req, HttpResponder& out);
  // Answers /health and /ready, then authenticates and dispatches through
  // routes_; sets the endpoint label and status for metrics.
  void Route(const HttpRequest& req, HttpResponder& out, std::string* endpoint, int* status);
  int Generate(openai::Endpoint endpoint, const HttpRequest& req, HttpResponder& out,
               const std::string& key);
  int Models(HttpResponder& out);
  int Tokenize(const HttpRequest& req, HttpResponder& out);
  int Detokenize(const HttpRequest& req, HttpResponder& out);
  int Metrics(HttpResponder& out);
  int SendError(HttpResponder& out, const openai::ApiError& e);
  // The API key of the request, or Unauthenticated when keys are on and it
  // has none or a wrong one (ApiKeys::Authenticate, shared with gRPC).
  absl::StatusOr<std::string> Authenticate(const HttpRequest& req) const;

  // Every route but /health and /ready (answered before authentication):
  // the method it takes and its handler, given the request's API key.
  using Handler = std::function<int(const HttpRequest&, HttpResponder&, const std::string& key)>;
  struct RouteEntry {
    std::string_view method;
    Handler handle;
  };
  std::map<std::string, RouteEntry, std::less<>> routes_;

  Router* const router_;
  const GatewayOptions options_;
  const ApiKeys keys_;  // options_.api_keys, checked in constant time
  std::unique_ptr<HttpServer> server_;
  std::atomic<bool> draining_{false};
  std::atomic<int> generating_{0};  // generation requests in progress

  absl::Mutex mu_;
  std::map<std::string, int> running_per_key_ ABSL_GUARDED_BY(mu_);

  prometheus::Family<prometheus::Counter>* http_requests_ = nullptr;
  prometheus::Gauge* http_in_flight_ = nullptr;
  prometheus::Counter* client_disconnects_ = nullptr;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_API_GATEWAY_H_
