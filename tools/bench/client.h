// The benchmark's view of an OpenAI-compatible server: request bodies built
// the same way for every server (ringlane extensions only where the server
// takes them), one streamed request timed and read into a RequestSample, and
// the side endpoints (model list, ringlane's /tokenize, Prometheus
// /metrics). All HTTP goes through services::HttpClient.
#ifndef RINGLANE_TOOLS_BENCH_CLIENT_H_
#define RINGLANE_TOOLS_BENCH_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/http_client.h"
#include "tools/bench/sample.h"
#include "tools/bench/workload.h"

namespace ringlane::bench {

enum class ServerKind {
  // ringlane's gateway: takes ignore_eos and loop_watchdog in the body,
  // serves /tokenize and /metrics at the root, rejects unknown fields.
  kRinglane,
  // Anything else: only standard OpenAI fields (plus --extra_body).
  kGeneric,
};

struct ServerOptions {
  std::string base_url;  // "http://127.0.0.1:8080/v1"
  ServerKind kind = ServerKind::kGeneric;
  std::string model;
  std::string api_key;  // sent as "Authorization: Bearer ..." when set
  // Ask for logprobs (completions: "logprobs": 1, chat: "logprobs": true)
  // so the stream's tokens can be counted.
  bool request_logprobs = false;
  std::string metrics_url;   // "" : no server metrics
  std::string tokenize_url;  // "" : prompt lengths approximated by words
  // A JSON object merged into every request body (e.g. another server's
  // own ignore_eos), applied last.
  std::string extra_body;
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Seconds(300);
};

struct ChatMessage {
  std::string role;
  std::string content;
};

struct RequestSpec {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string prompt;                 // kCompletions
  std::vector<ChatMessage> messages;  // kChat
  int max_tokens = 16;
  double temperature = 0;
  bool ignore_eos = false;    // sent only to ringlane, and only when true
  bool loop_watchdog = true;  // sent only to ringlane, and only when false
};

// The JSON body for `spec`. InvalidArgument when extra_body is not a JSON
// object.
absl::StatusOr<std::string> BuildRequestBody(const ServerOptions& server, const RequestSpec& spec);

// One connection's worth of client. Not thread-safe: each of the runner's
// threads owns one.
class ApiClient {
 public:
  // InvalidArgument for a bad URL; connects lazily.
  static absl::StatusOr<std::unique_ptr<ApiClient>> Create(const ServerOptions& server);

  // Sends one streamed request and reads the response into `sample`
  // (timing from the moment the request is handed to the socket). Failures
  // of any kind land in sample->error; sample->connection_failed tells a
  // server that could not be reached from one that answered badly.
  void Complete(const RequestSpec& spec, RequestSample* sample);

  // The token count of `text` from the server's tokenizer (tokenize_url).
  absl::StatusOr<int64_t> CountTokens(const std::string& text);
  // GET {base}/models: the model ids.
  absl::StatusOr<std::vector<std::string>> ListModels();
  // GET metrics_url: the Prometheus text.
  absl::StatusOr<std::string> ScrapeMetrics();

  const ServerOptions& server() const { return server_; }

 private:
  ApiClient(ServerOptions server, services::HttpUrl base)
      : server_(std::move(server)), base_(std::move(base)) {}

  // A connection to `url`'s host and port, reused while they stay the same.
  absl::StatusOr<services::HttpClient*> ConnectionFor(const services::HttpUrl& url);
  absl::StatusOr<services::HttpResponse> Send(const std::string& url, const std::string& method,
                                              const std::string& body);

  const ServerOptions server_;
  const services::HttpUrl base_;
  std::unique_ptr<services::HttpClient> conn_;
  std::string conn_host_;
  int conn_port_ = -1;
};

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_CLIENT_H_
