// Talking to a daemon the way a client, an operator or an attacker does, for
// the end-to-end tests: HTTP requests to the gateway (whole, or streamed as
// server-sent events), Prometheus text read back as numbers, raw TCP bytes,
// and what /proc says about the process. Free functions; each opens its own
// connections, so threads may call them at once.
#ifndef RINGLANE_TESTS_SUPPORT_HTTP_PROBE_H_
#define RINGLANE_TESTS_SUPPORT_HTTP_PROBE_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "services/http_client.h"
#include "tests/support/lane_runner.h"

namespace ringlane::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

// A keep-alive connection to `address` (host:port); null, after a failed
// expectation, when it cannot connect.
std::unique_ptr<services::HttpClient> Connect(const std::string& address);

// One request on `c`. A transport failure is a failed expectation and an
// empty response (status 0), so that a test goes on to report what it sees.
services::HttpResponse Post(services::HttpClient& c, const std::string& path,
                            const std::string& body, Headers headers = {},
                            absl::Duration timeout = absl::Seconds(120));
services::HttpResponse Get(services::HttpClient& c, const std::string& path, Headers headers = {},
                           absl::Duration timeout = absl::Seconds(30));

// One request on a connection of its own, for callers that expect the
// daemon to be down or slow: Unavailable when it cannot connect.
absl::StatusOr<services::HttpResponse> GetOnce(const std::string& address, const std::string& path,
                                               absl::Duration timeout = absl::Seconds(10));
absl::StatusOr<services::HttpResponse> PostOnce(const std::string& address, const std::string& path,
                                                const std::string& body,
                                                absl::Duration timeout = absl::Seconds(60));

// Polls GET `path` (fresh connections) until it answers `status`; false
// after `timeout`.
bool WaitForHttpStatus(const std::string& address, const std::string& path, int status,
                       std::chrono::milliseconds timeout);

// Calls `done` every `interval` until it returns true; false after `timeout`.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval = std::chrono::milliseconds(100));

// The body as JSON; a body that is not JSON is a failed expectation (and a
// discarded value).
nlohmann::json Json(const services::HttpResponse& r);

// A greedy /v1/completions body that echoes golden case `g`'s prompt text
// and asks for as many tokens as the reference made.
nlohmann::json GoldenEchoBody(const GoldenCase& g);

// A POST answered with server-sent events.
struct SseStream {
  absl::Status transport;  // of the exchange, not of the generation
  int status = 0;
  std::vector<nlohmann::json> events;           // the JSON ones, in order
  int malformed = 0;                            // events that were neither JSON nor [DONE]
  bool done = false;                            // [DONE] came
  std::chrono::steady_clock::time_point first;  // the first piece of body
  std::chrono::steady_clock::time_point end;    // the exchange returned
};

// Posts `body` to `path` on `c` and reads the event stream to its end;
// `on_first` runs (on this thread) when the first piece arrives.
SseStream PostSse(services::HttpClient& c, const std::string& path, const std::string& body,
                  const std::function<void()>& on_first = nullptr,
                  absl::Duration timeout = absl::Seconds(120));

// A long stream of the bundled model on its own connection to the gateway
// at `address`: counts itself in `started` at its first chunk and hangs up
// once `release` is set, so it holds a lane (or a place in the queue, or a
// per-key slot) for as long as a test needs.
void HoldStream(const std::string& address, std::atomic<int>* started,
                const std::atomic<bool>* release);

// The value of Prometheus metric `name` in `text`, summed over its label
// sets whose text contains `labels` (all when empty); 0 when absent.
double Metric(const std::string& text, const std::string& name, const std::string& labels = "");

// Resident memory of a process in MiB (VmRSS); -1 when unknown.
double RssMiB(pid_t pid);
// Open file descriptors of a process; -1 when unknown.
int OpenFds(pid_t pid);

// A plain TCP connection to 127.0.0.1:`port`; -1 when refused.
int ConnectLoopback(int port);
// Sends `bytes` on a new connection (as much as the server takes) and
// returns what it answers until it closes or stays silent for `quiet`.
std::string RawExchange(int port, const std::string& bytes,
                        std::chrono::milliseconds quiet = std::chrono::seconds(10));
// "HTTP/1.1 400 Bad Request" of a raw response.
std::string StatusLine(const std::string& response);

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_HTTP_PROBE_H_
