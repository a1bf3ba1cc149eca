// One connection of the gateway's HTTP server (http_server.h): reads
// requests off the socket through Beast's parser (bodies in Content-Length or
// chunked framing, each bounded: header, body, chunk lines, bytes on the
// wire), runs the handler on each, and writes its responses. Internal to
// http_server.cc, which accepts connections and owns their fds and threads.
#ifndef RINGLANE_ROUTER_API_HTTP_CONNECTION_H_
#define RINGLANE_ROUTER_API_HTTP_CONNECTION_H_

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http/message.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/string_body.hpp"
#include "router/api/http_server.h"
#include "router/api/http_socket.h"

namespace ringlane::router::http_internal {

namespace beast = boost::beast;
namespace http = beast::http;

// The default HttpServerOptions::error_body:
// {"error":{"message":...,"type":...,"code":null}}.
std::string DefaultErrorBody(int status, std::string_view message);

// What a connection's thread needs from the server; fixed for its lifetime.
struct ConnectionEnv {
  const HttpServerOptions* options;
  const HttpHandler* handler;
  // Readable once Shutdown has begun (never drained).
  int wake_fd;
  std::function<bool()> shutting_down;
};

// One accepted socket, served by its own thread. The fd is owned and closed
// by the server (under its mutex), not by this object.
class Connection {
 public:
  // `idle` (may be null) is kept true while the connection waits for the
  // first byte of a request: the server may evict it then, under pressure.
  Connection(int fd, const ConnectionEnv& env, std::atomic<bool>* idle)
      : fd_(fd), env_(env), idle_(idle) {
    PeerAddress(fd, peer_, peer_is_loopback_);
  }

  // Reads requests and runs the handler until the connection should close.
  void Serve();
  // Answers 503 without reading a request (too many connections).
  void Reject();

  int fd() const { return fd_; }
  bool Send(std::string_view bytes) { return SendAll(fd_, bytes, env_.options->idle_timeout); }
  bool shutting_down() const { return env_.shutting_down(); }

 private:
  enum class ReadResult {
    kRequest,
    kClosed,
    kBadRequest,
    kBodyTooLarge,
    kHeaderTooLarge,
    kLineTooLong,
    kWireTooLarge
  };
  enum class Wait { kReadable, kTimeout, kWake };

  // Reads one request. Its first byte must arrive by `first_byte_deadline`,
  // all of it by `deadline`.
  ReadResult ReadRequest(http::request_parser<http::string_body>& parser,
                         Clock::time_point first_byte_deadline, Clock::time_point deadline);
  // Runs the handler on a parsed request. False when the connection must
  // close afterwards.
  bool Dispatch(http::request<http::string_body>& message, bool keep_alive_allowed);
  Wait WaitReadable(Clock::time_point deadline, bool watch_wake);
  // A response made by the server itself, body from options.error_body.
  // False when it could not be sent.
  bool SendError(int status, std::string_view message, bool keep_alive = false);
  // Half-closes, then drops what the client still sends (see kLinger).
  void LingeringClose();

  const int fd_;
  const ConnectionEnv& env_;
  std::atomic<bool>* const idle_;
  std::string peer_;
  bool peer_is_loopback_ = false;
  // Bytes read but not yet parsed (the start of a pipelined request).
  beast::flat_buffer buffer_;
  std::string parse_error_;
};

}  // namespace ringlane::router::http_internal

#endif  // RINGLANE_ROUTER_API_HTTP_CONNECTION_H_
