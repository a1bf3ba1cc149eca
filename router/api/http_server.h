// The gateway's HTTP/1.1 server (Boost.Beast over Asio): a thread per
// connection doing blocking reads and writes.
//
// Why threads and not Asio's async model: a request handler blocks on the
// router's ResponseQueue while its lane generates, which takes seconds; with
// one thread per connection the handler is plain sequential code, and the
// number of connections is small (a few hundred clients per router, bounded by
// max_connections), so the cost of the threads is not what limits us.
#ifndef RINGLANE_ROUTER_API_HTTP_SERVER_H_
#define RINGLANE_ROUTER_API_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringlane::router {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query: "/v1/models"
  std::string query;   // after '?', "" when none
  // Lower-cased names; a repeated header keeps its last value.
  std::map<std::string, std::string> headers;
  std::string body;
  std::string peer;  // "ip:port" of the client
  bool peer_is_loopback = false;

  // The header's value, "" when absent. `name` in lower case.
  std::string Header(std::string_view name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The handler's side of one exchange. Either Send once, or StartStream, then
// Write any number of times, then EndStream. Used only by the thread that
// runs the handler. A handler that returns without responding gets a 500
// sent for it; one that returns mid-stream (no EndStream) has its connection
// closed, so the client sees a cut-off body rather than a complete one.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;

  // A whole response with Content-Length.
  virtual void Send(int status, std::string_view content_type, std::string body,
                    const HttpHeaders& extra_headers = {}) = 0;

  // Sends the status and headers of a streamed response (chunked transfer
  // encoding, no buffering). False when the client is gone.
  virtual bool StartStream(int status, std::string_view content_type,
                           const HttpHeaders& extra_headers = {}) = 0;
  // Writes one chunk and flushes it to the socket. False once the client is
  // gone (write failed, or the socket took nothing for idle_timeout because
  // the client stopped reading); later calls do nothing and return false.
  // An empty `data` writes nothing (an empty chunk would end the body).
  virtual bool Write(std::string_view data) = 0;
  // The terminating chunk.
  virtual void EndStream() = 0;

  // Does not block: true when the client has closed or reset the
  // connection (seen as EOF or an error on a non-blocking peek). A client
  // that merely sends nothing is not gone. Lets a handler that is waiting
  // for tokens notice a disconnect before it has anything to write.
  virtual bool ClientGone() = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpServerOptions {
  // host:port; port 0 picks a free one (see HttpServer::port).
  std::string listen = "127.0.0.1:8080";
  // Larger bodies get 413 without the handler being called.
  size_t max_body_bytes = 8 << 20;
  // Connections open at once; one more is answered 503 and closed (after
  // its request is read, briefly, so that probes still get answered: see
  // probe_paths).
  int max_connections = 1024;
  // Connections open at once from one client address (IP, any port); 0 = no
  // limit. Beyond it the client's next connection is treated as over
  // max_connections.
  int max_connections_per_peer = 256;
  // How long a connection may sit idle between requests (keep-alive), or
  // take to send one request's header and body, before it is closed.
  std::chrono::milliseconds idle_timeout{60000};
  // How long a new connection may take to send the first byte of its first
  // request. Short, because a connection that never speaks holds a slot:
  // 1,024 of them would lock every client (and the probes) out.
  std::chrono::milliseconds first_byte_timeout{10000};
  // GET paths answered even on a connection over the limits (liveness and
  // readiness probes must not be locked out by a flood). Their handler must
  // be cheap and never block.
  std::vector<std::string> probe_paths = {"/health", "/ready"};
  // The body (JSON) of responses the server makes itself: 400 for
  // unparseable HTTP, 413 for a body over the limit, 431 for a request
  // header over 64 KiB, 500 for a handler that threw or sent nothing, 503
  // for too many connections or while shutting down; 400 also for a chunk
  // header or trailer line over 64 KiB, 413 for a request whose bytes on the
  // wire (framing included) exceed twice max_body_bytes plus 128 KiB. Default:
  // {"error":{"message":...,"type":...,"code":null}}.
  std::function<std::string(int status, std::string_view message)> error_body;
};

class HttpServer {
 public:
  // Binds and starts accepting. InvalidArgument for a bad listen address,
  // Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler);
  ~HttpServer();  // Shutdown(now)

  int port() const;
  // Connections open now (for metrics and tests).
  int active_connections() const;

  // Stops accepting; connections idle between requests are closed; exchanges
  // in progress may finish until `deadline`, after which their sockets are
  // shut down (their handlers' writes then fail). Returns once every
  // connection thread has ended. Idempotent.
  void Shutdown(absl::Time deadline);

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_API_HTTP_SERVER_H_
