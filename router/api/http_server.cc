#include "router/api/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/buffer.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/string.hpp"
#include "boost/beast/http/chunk_encode.hpp"
#include "boost/beast/http/empty_body.hpp"
#include "boost/beast/http/message.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/serializer.hpp"
#include "boost/beast/http/string_body.hpp"
#include "nlohmann/json.hpp"
#include "services/flags_util.h"
#include "services/log.h"

namespace ringlane::router {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Clock = std::chrono::steady_clock;

std::string ToString(beast::string_view s) { return std::string(s.data(), s.size()); }
beast::string_view BeastView(std::string_view s) { return beast::string_view(s.data(), s.size()); }

// Request headers beyond this get 431; prompts travel in the body.
constexpr size_t kHeaderLimitBytes = 64 << 10;
constexpr size_t kReadBytes = 16 << 10;
// After an error response the server reads and drops what the client is still
// sending for at most this long, so closing does not reset the connection
// (a RST can destroy the response before the client has read it).
constexpr std::chrono::milliseconds kLinger{1000};
// Connections being answered 503 at once; beyond that they are just closed.
constexpr int kMaxRejecting = 64;
// How long a connection over the limits may take to send its request (a
// probe's is one short line) before it is closed unanswered.
constexpr std::chrono::milliseconds kRejectReadTimeout{1000};
// Bytes held unparsed: Beast needs a whole line (a header field, a chunk
// header with its extensions, a trailer field) before it consumes it, and
// the header limit does not cover chunk headers or trailers.
constexpr size_t kMaxBufferedBytes = kHeaderLimitBytes + kReadBytes;
// Framing a body may add on the wire (chunk headers, trailers) beyond twice
// the body itself: legitimate chunks are far larger than their framing.
constexpr size_t kFramingSlackBytes = 128 << 10;

std::string ErrorType(int status) {
  switch (status) {
    case 404:
      return "not_found_error";
    case 503:
      return "unavailable_error";
    default:
      return status < 500 ? "invalid_request_error" : "server_error";
  }
}

std::string DefaultErrorBody(int status, std::string_view message) {
  nlohmann::json body;
  body["error"] = {
      {"message", std::string(message)}, {"type", ErrorType(status)}, {"code", nullptr}};
  return body.dump();
}

int MillisUntil(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Sends all of `data`. Fails when the peer is gone, or when the socket
// accepts nothing for `stall_timeout` (a client that stopped reading).
bool SendAll(int fd, std::string_view data, std::chrono::milliseconds stall_timeout) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(stall_timeout.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

template <typename Buffers>
void AppendBuffers(const Buffers& buffers, std::string& out) {
  for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers);
       ++it) {
    const net::const_buffer b = *it;
    out.append(static_cast<const char*>(b.data()), b.size());
  }
}

// The wire form of `message`, or only its header.
template <typename Body>
std::string Serialize(http::response<Body>& message, bool header_only) {
  http::response_serializer<Body> serializer(message);
  serializer.split(header_only);
  std::string out;
  beast::error_code ec;
  while (header_only ? !serializer.is_header_done() : !serializer.is_done()) {
    serializer.next(ec, [&](beast::error_code& ec, const auto& buffers) {
      ec = {};
      AppendBuffers(buffers, out);
      serializer.consume(net::buffer_size(buffers));
    });
    if (ec) break;
  }
  return out;
}

// Non-blocking: true when the peer closed or reset the connection. Bytes
// waiting to be read (a pipelined request) do not count.
bool PeerGone(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  const int ready = ::poll(&p, 1, 0);
  if (ready <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

// Non-blocking: true when bytes are waiting to be read.
bool BytesPending(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

void PeerAddress(int fd, std::string& peer, bool& loopback) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    peer = services::JoinHostPort(text, ntohs(in->sin_port));
    loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    peer = services::JoinHostPort(text, ntohs(in6->sin6_port));
    loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
  }
}

// The client's IP as text (no port), the key of the per-peer limit.
std::string PeerIp(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text,
                sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

// What a connection's thread needs from the server; fixed for its lifetime.
struct ConnectionEnv {
  const HttpServerOptions* options;
  const HttpHandler* handler;
  // Readable once Shutdown has begun (never drained).
  int wake_fd;
  std::function<bool()> shutting_down;
};

class Connection;

// The handler's view of one exchange on a Connection.
class Responder final : public HttpResponder {
 public:
  Responder(Connection& connection, unsigned version, bool keep_alive)
      : connection_(connection), version_(version), keep_alive_(keep_alive) {}

  void Send(int status, std::string_view content_type, std::string body,
            const HttpHeaders& extra_headers) override;
  bool StartStream(int status, std::string_view content_type,
                   const HttpHeaders& extra_headers) override;
  bool Write(std::string_view data) override;
  void EndStream() override;
  bool ClientGone() override;

  bool responded() const { return state_ != State::kNone; }
  // The connection can carry another request after this exchange.
  bool reusable() const { return keep_alive_ && !failed_ && state_ != State::kStreaming; }

 private:
  enum class State { kNone, kSent, kStreaming, kEnded };

  template <typename Body>
  void PrepareHeader(http::response<Body>& response, int status, std::string_view content_type,
                     const HttpHeaders& extra_headers);

  Connection& connection_;
  const unsigned version_;
  bool keep_alive_;
  State state_ = State::kNone;
  bool chunked_ = false;
  // A write failed: the client is gone or stalled; nothing more is sent.
  bool failed_ = false;
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

template <typename Body>
void Responder::PrepareHeader(http::response<Body>& response, int status,
                              std::string_view content_type, const HttpHeaders& extra_headers) {
  // Beast throws on a status outside 0..999; a handler bug should not kill
  // the connection thread.
  response.result(status >= 100 && status <= 999 ? static_cast<unsigned>(status) : 500u);
  response.version(11);
  response.set(http::field::server, "ringlane");
  if (!content_type.empty()) response.set(http::field::content_type, BeastView(content_type));
  for (const auto& [name, value] : extra_headers) response.insert(name, value);
  // Tell the client not to reuse a connection the server is about to close.
  if (connection_.shutting_down()) keep_alive_ = false;
  response.keep_alive(keep_alive_);
}

void Responder::Send(int status, std::string_view content_type, std::string body,
                     const HttpHeaders& extra_headers) {
  if (state_ != State::kNone) {
    RL_LOG(ERROR) << "HttpResponder::Send after a response was already started; ignored";
    return;
  }
  state_ = State::kSent;
  http::response<http::string_body> response;
  PrepareHeader(response, status, content_type, extra_headers);
  response.body() = std::move(body);
  response.prepare_payload();
  if (!connection_.Send(Serialize(response, /*header_only=*/false))) failed_ = true;
}

bool Responder::StartStream(int status, std::string_view content_type,
                            const HttpHeaders& extra_headers) {
  if (state_ != State::kNone) {
    RL_LOG(ERROR) << "HttpResponder::StartStream after a response was already started; ignored";
    return false;
  }
  state_ = State::kStreaming;
  http::response<http::empty_body> response;
  // An HTTP/1.0 client cannot read chunks: its body ends when we close.
  if (version_ < 11) keep_alive_ = false;
  PrepareHeader(response, status, content_type, extra_headers);
  chunked_ = version_ >= 11;
  response.chunked(chunked_);
  if (!connection_.Send(Serialize(response, /*header_only=*/true))) failed_ = true;
  return !failed_;
}

bool Responder::Write(std::string_view data) {
  if (state_ != State::kStreaming || failed_) return false;
  // An empty chunk would end the body.
  if (data.empty()) return true;
  std::string bytes;
  if (chunked_) {
    AppendBuffers(http::make_chunk(net::const_buffer(data.data(), data.size())), bytes);
  } else {
    bytes.assign(data);
  }
  if (!connection_.Send(bytes)) failed_ = true;
  return !failed_;
}

void Responder::EndStream() {
  if (state_ != State::kStreaming) return;
  state_ = State::kEnded;
  if (failed_ || !chunked_) return;
  std::string bytes;
  AppendBuffers(http::make_chunk_last(), bytes);
  if (!connection_.Send(bytes)) failed_ = true;
}

bool Responder::ClientGone() { return failed_ || PeerGone(connection_.fd()); }

Connection::Wait Connection::WaitReadable(Clock::time_point deadline, bool watch_wake) {
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {env_.wake_fd, POLLIN, 0}};
    const int ready = ::poll(fds, watch_wake ? 2 : 1, MillisUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Wait::kReadable;  // let recv report the error
    if (ready == 0) return Wait::kTimeout;
    // Bytes that arrived with the wake-up are a request, served with 503.
    if (fds[0].revents != 0) return Wait::kReadable;
    return Wait::kWake;
  }
}

Connection::ReadResult Connection::ReadRequest(http::request_parser<http::string_body>& parser,
                                               Clock::time_point first_byte_deadline,
                                               Clock::time_point deadline) {
  bool header_seen = false;
  // Every byte of this request read from the socket, framing included.
  size_t wire_bytes = buffer_.size();
  const size_t max_wire_bytes =
      kHeaderLimitBytes + 2 * env_.options->max_body_bytes + kFramingSlackBytes;
  for (;;) {
    if (buffer_.size() > 0) {
      beast::error_code ec;
      const size_t used = parser.put(buffer_.data(), ec);
      buffer_.consume(used);
      if (!ec) {
        if (parser.is_done()) return ReadResult::kRequest;
        if (!header_seen && parser.is_header_done()) {
          header_seen = true;
          parser.eager(true);
          // curl sends Expect: 100-continue for bodies over 1 KiB and waits a
          // second for this before sending the body.
          const auto& message = parser.get();
          if (message.version() >= 11 &&
              beast::iequals(message[http::field::expect], "100-continue") &&
              !Send("HTTP/1.1 100 Continue\r\n\r\n")) {
            return ReadResult::kClosed;
          }
          continue;
        }
        if (used > 0) continue;
      } else if (ec == http::error::body_limit) {
        return ReadResult::kBodyTooLarge;
      } else if (ec == http::error::header_limit) {
        return ReadResult::kHeaderTooLarge;
      } else if (ec != http::error::need_more) {
        parse_error_ = ec.message();
        return ReadResult::kBadRequest;
      }
    }

    if (buffer_.size() > kMaxBufferedBytes) {
      return header_seen ? ReadResult::kLineTooLong : ReadResult::kHeaderTooLarge;
    }
    if (wire_bytes > max_wire_bytes) return ReadResult::kWireTooLarge;
    // Only a connection with nothing of its next request yet is idle and
    // closed by Shutdown; one partway through a request gets to finish it.
    const bool idle = buffer_.size() == 0 && !parser.got_some();
    switch (WaitReadable(idle ? std::min(first_byte_deadline, deadline) : deadline, idle)) {
      case Wait::kWake:
        return ReadResult::kClosed;
      case Wait::kTimeout:
        RL_LOG(DEBUG) << "http connection " << peer_ << ": idle timeout";
        return ReadResult::kClosed;
      case Wait::kReadable:
        break;
    }
    const auto space = buffer_.prepare(kReadBytes);
    const ssize_t n = ::recv(fd_, space.data(), space.size(), MSG_DONTWAIT);
    if (n > 0) {
      if (idle_ != nullptr) idle_->store(false);
      buffer_.commit(static_cast<size_t>(n));
      wire_bytes += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;
    } else {
      // EOF or reset; a request cut short has nobody left to answer.
      return ReadResult::kClosed;
    }
  }
}

bool Connection::SendError(int status, std::string_view message, bool keep_alive) {
  http::response<http::string_body> response;
  response.result(static_cast<unsigned>(status));
  response.version(11);
  response.set(http::field::server, "ringlane");
  response.set(http::field::content_type, "application/json");
  response.keep_alive(keep_alive);
  response.body() = env_.options->error_body(status, message);
  response.prepare_payload();
  return Send(Serialize(response, /*header_only=*/false));
}

void Connection::LingeringClose() {
  ::shutdown(fd_, SHUT_WR);
  const Clock::time_point deadline = Clock::now() + kLinger;
  char scratch[4096];
  while (WaitReadable(deadline, /*watch_wake=*/true) == Wait::kReadable) {
    const ssize_t n = ::recv(fd_, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return;
  }
}

void Connection::Reject() {
  // Reads the request (briefly) to tell a probe from the flood: a probe gets
  // its real answer, anything else 503.
  http::request_parser<http::string_body> parser;
  parser.header_limit(kHeaderLimitBytes);
  parser.body_limit(env_.options->max_body_bytes);
  const Clock::time_point deadline = Clock::now() + kRejectReadTimeout;
  if (ReadRequest(parser, deadline, deadline) == ReadResult::kRequest) {
    http::request<http::string_body>& message = parser.get();
    const std::string target = ToString(message.target());
    const std::string path = target.substr(0, target.find('?'));
    const auto& probes = env_.options->probe_paths;
    if (message.method() == http::verb::get &&
        std::find(probes.begin(), probes.end(), path) != probes.end()) {
      Dispatch(message, /*keep_alive_allowed=*/false);
      LingeringClose();
      return;
    }
  } else if (buffer_.size() == 0) {
    return;  // it never spoke, or it went away: nobody to answer
  }
  SendError(503, "too many connections; retry later");
  LingeringClose();
}

void Connection::Serve() {
  const HttpServerOptions& options = *env_.options;
  bool first = true;
  for (;;) {
    // Shutdown closes connections idle between requests; one whose next
    // request has begun to arrive reads it and answers 503 instead.
    if (shutting_down() && buffer_.size() == 0 && !BytesPending(fd_)) return;
    http::request_parser<http::string_body> parser;
    parser.header_limit(kHeaderLimitBytes);
    parser.body_limit(options.max_body_bytes);
    if (idle_ != nullptr) idle_->store(buffer_.size() == 0);
    const Clock::time_point now = Clock::now();
    const Clock::time_point deadline = now + options.idle_timeout;
    const Clock::time_point first_byte_deadline =
        first ? now + options.first_byte_timeout : deadline;
    first = false;
    switch (ReadRequest(parser, first_byte_deadline, deadline)) {
      case ReadResult::kRequest:
        break;
      case ReadResult::kClosed:
        return;
      case ReadResult::kBadRequest:
        SendError(400, absl::StrCat("malformed HTTP request: ", parse_error_));
        LingeringClose();
        return;
      case ReadResult::kBodyTooLarge:
        SendError(413, absl::StrCat("request body exceeds ", options.max_body_bytes, " bytes"));
        LingeringClose();
        return;
      case ReadResult::kHeaderTooLarge:
        SendError(431, absl::StrCat("request header exceeds ", kHeaderLimitBytes, " bytes"));
        LingeringClose();
        return;
      case ReadResult::kLineTooLong:
        SendError(400, absl::StrCat("a chunk header or trailer line exceeds ", kMaxBufferedBytes,
                                    " bytes"));
        LingeringClose();
        return;
      case ReadResult::kWireTooLarge:
        SendError(413,
                  absl::StrCat("request exceeds ",
                               kHeaderLimitBytes + 2 * options.max_body_bytes + kFramingSlackBytes,
                               " bytes on the wire (chunk framing and trailer included)"));
        LingeringClose();
        return;
    }
    if (shutting_down()) {
      SendError(503, "server is shutting down");
      return;
    }

    if (!Dispatch(parser.get(), /*keep_alive_allowed=*/true)) return;
  }
}

bool Connection::Dispatch(http::request<http::string_body>& message, bool keep_alive_allowed) {
  HttpRequest request;
  request.method = ToString(message.method_string());
  const std::string target = ToString(message.target());
  const size_t question = target.find('?');
  request.path = target.substr(0, question);
  if (question != std::string::npos) request.query = target.substr(question + 1);
  for (const auto& field : message) {
    request.headers[absl::AsciiStrToLower(ToString(field.name_string()))] = ToString(field.value());
  }
  request.body = std::move(message.body());
  request.peer = peer_;
  request.peer_is_loopback = peer_is_loopback_;

  const bool keep_alive = keep_alive_allowed && message.keep_alive();
  Responder responder(*this, message.version(), keep_alive);
  bool threw = false;
  try {
    (*env_.handler)(request, responder);
  } catch (const std::exception& e) {
    RL_LOG(ERROR) << "http handler for " << request.method << " " << request.path.substr(0, 64)
                  << " threw: " << e.what();
    threw = true;
  } catch (...) {
    RL_LOG(ERROR) << "http handler for " << request.method << " " << request.path.substr(0, 64)
                  << " threw a non-exception";
    threw = true;
  }
  if (!responder.responded()) {
    // A handler that threw may have left shared state half-updated; only
    // one that merely forgot to answer keeps its connection.
    const bool keep = !threw && keep_alive && !shutting_down();
    const bool sent = SendError(
        500, threw ? "internal error: handler failed" : "internal error: handler sent no response",
        keep);
    return sent && keep;
  }
  return !threw && responder.reusable();
}

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

// Threads: Start's caller; one accept thread (AcceptLoop) that registers
// connections and joins finished connection threads; one thread per
// connection; Shutdown's caller. Only `mu` guards shared state.
struct HttpServer::Impl {
  struct Conn {
    // Closed by EndConnection under mu, so Shutdown can shut it down under
    // mu without racing a close (and hitting a reused fd number).
    int fd = -1;
    bool rejecting = false;
    std::string peer_ip;  // counted in per_peer while not rejecting
    // Waiting for the first byte of a request (set by its thread).
    std::atomic<bool> idle{true};
    // Shut down to make room; no longer counted in active or per_peer.
    bool evicted = false;
    std::thread thread;
  };

  Impl(HttpServerOptions options_in, HttpHandler handler_in)
      : options(std::move(options_in)), handler(std::move(handler_in)) {
    env.options = &options;
    env.handler = &handler;
    env.shutting_down = [this] {
      absl::MutexLock lock(&mu);
      return shutting_down;
    };
  }

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void AcceptLoop();
  void RunConnection(uint64_t id, int fd, bool rejecting, std::atomic<bool>* idle);
  // Under pressure: shuts down the oldest connection waiting for a request
  // (of `ip` only, when not empty) and stops counting it. False when every
  // connection is busy.
  bool EvictIdle(const std::string& ip) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EndConnection(uint64_t id) ABSL_LOCKS_EXCLUDED(mu);
  bool NoConnections() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return conns.empty(); }
  std::vector<std::thread> TakeFinished() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    std::vector<std::thread> out;
    out.swap(finished);
    return out;
  }

  // Fixed after Start.
  const HttpServerOptions options;
  const HttpHandler handler;
  ConnectionEnv env;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread accept_thread;

  mutable absl::Mutex mu;
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  bool shutdown_done ABSL_GUARDED_BY(mu) = false;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::unique_ptr<Conn>> conns ABSL_GUARDED_BY(mu);
  // Connections being served (not the ones being answered 503).
  int active ABSL_GUARDED_BY(mu) = 0;
  int rejecting ABSL_GUARDED_BY(mu) = 0;
  // Connections being served, by client IP.
  std::map<std::string, int> per_peer ABSL_GUARDED_BY(mu);
  // Threads of ended connections, joined by the accept loop or Shutdown.
  std::vector<std::thread> finished ABSL_GUARDED_BY(mu);
};

void HttpServer::Impl::AcceptLoop() {
  for (;;) {
    for (std::thread& t : TakeFinished()) t.join();
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (fds[1].revents != 0) return;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    const int fd =
        ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        RL_LOG(WARNING) << "http accept: " << std::strerror(errno);
        // The pending connection stays readable; do not spin on it.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    absl::MutexLock lock(&mu);
    if (shutting_down) {
      ::close(fd);
      return;
    }
    std::string ip = PeerIp(addr);
    auto peer_count = per_peer.find(ip);
    const bool peer_full = options.max_connections_per_peer > 0 && peer_count != per_peer.end() &&
                           peer_count->second >= options.max_connections_per_peer;
    // A flood of connections that never speak must not lock out clients
    // and probes: the oldest connection waiting for a request makes room
    // (of this peer when it is the peer's share that is full). Only when
    // every connection is busy is the new one answered 503.
    bool reject = false;
    if (peer_full) {
      reject = !EvictIdle(ip);
    } else if (active >= options.max_connections) {
      reject = !EvictIdle("");
    }
    if (reject && rejecting >= kMaxRejecting) {
      ::close(fd);
      continue;
    }
    ++(reject ? rejecting : active);
    if (!reject) ++per_peer[ip];
    const uint64_t id = next_id++;
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->rejecting = reject;
    conn->peer_ip = std::move(ip);
    // Started under mu: the thread's EndConnection needs mu, so `thread` is
    // assigned before the thread can move it to `finished`.
    std::atomic<bool>* idle = &conn->idle;
    conn->thread =
        std::thread([this, id, fd, reject, idle] { RunConnection(id, fd, reject, idle); });
    conns.emplace(id, std::move(conn));
  }
}

bool HttpServer::Impl::EvictIdle(const std::string& ip) {
  for (auto& [id, conn] : conns) {  // oldest first
    if (conn->rejecting || conn->evicted || !conn->idle.load()) continue;
    if (!ip.empty() && conn->peer_ip != ip) continue;
    // Its thread sees EOF and ends; the fd is closed there, as always.
    ::shutdown(conn->fd, SHUT_RDWR);
    conn->evicted = true;
    --active;
    auto peer = per_peer.find(conn->peer_ip);
    if (peer != per_peer.end() && --peer->second <= 0) per_peer.erase(peer);
    return true;
  }
  return false;
}

void HttpServer::Impl::RunConnection(uint64_t id, int fd, bool rejecting, std::atomic<bool>* idle) {
  // An exception escaping a thread ends the process; one from Beast or the
  // allocator ends only this connection.
  try {
    Connection connection(fd, env, rejecting ? nullptr : idle);
    if (rejecting) {
      connection.Reject();
    } else {
      connection.Serve();
    }
  } catch (const std::exception& e) {
    RL_LOG(ERROR) << "http connection failed: " << e.what();
  }
  EndConnection(id);
}

void HttpServer::Impl::EndConnection(uint64_t id) {
  absl::MutexLock lock(&mu);
  auto it = conns.find(id);
  Conn& conn = *it->second;
  ::close(conn.fd);
  if (conn.rejecting) {
    --rejecting;
  } else if (!conn.evicted) {
    --active;
    auto peer = per_peer.find(conn.peer_ip);
    if (peer != per_peer.end() && --peer->second <= 0) per_peer.erase(peer);
  }
  finished.push_back(std::move(conn.thread));
  conns.erase(it);
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Shutdown(absl::Now()); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler) {
  absl::StatusOr<std::pair<std::string, int>> host_port = services::ParseHostPort(options.listen);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address: ", host_port.status().message()));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("max_connections must be at least 1");
  }
  if (options.idle_timeout <= std::chrono::milliseconds::zero()) {
    return absl::InvalidArgumentError("idle_timeout must be positive");
  }
  if (options.first_byte_timeout <= std::chrono::milliseconds::zero()) {
    return absl::InvalidArgumentError("first_byte_timeout must be positive");
  }
  if (options.max_connections_per_peer < 0) {
    return absl::InvalidArgumentError("max_connections_per_peer must be >= 0");
  }
  if (!handler) return absl::InvalidArgumentError("no handler");
  if (!options.error_body) options.error_body = DefaultErrorBody;
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port_text = std::to_string(host_port->second);
  if (int rc = ::getaddrinfo(host_port->first.c_str(), port_text.c_str(), &hints, &addrs);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", impl->options.listen, "': ", ::gai_strerror(rc)));
  }
  std::string bind_error = "no address";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      bind_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      bind_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  ::freeaddrinfo(addrs);
  if (impl->listen_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", impl->options.listen, ": ", bind_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  impl->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) {
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  impl->env.wake_fd = impl->wake_fd;
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port; }

int HttpServer::active_connections() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->active;
}

void HttpServer::Shutdown(absl::Time deadline) {
  Impl& impl = *impl_;
  {
    absl::MutexLock lock(&impl.mu);
    if (impl.shutting_down) {
      // Another caller is (or was) shutting down; return when it is done.
      impl.mu.Await(absl::Condition(&impl.shutdown_done));
      return;
    }
    impl.shutting_down = true;
  }
  // The eventfd stays readable, waking the accept loop and every connection
  // waiting for its next request, now and later.
  const uint64_t one = 1;
  if (::write(impl.wake_fd, &one, sizeof(one)) != sizeof(one)) {
    RL_LOG(ERROR) << "http shutdown: eventfd write: " << std::strerror(errno);
  }
  impl.accept_thread.join();
  ::close(impl.listen_fd);
  impl.listen_fd = -1;

  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&impl.mu);
    const absl::Condition drained(&impl, &Impl::NoConnections);
    if (!impl.mu.AwaitWithDeadline(drained, deadline)) {
      // Exchanges still running past the deadline: fail their reads and
      // writes so their handlers see the client as gone.
      for (auto& [id, conn] : impl.conns) ::shutdown(conn->fd, SHUT_RDWR);
      impl.mu.Await(drained);
    }
    threads.swap(impl.finished);
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&impl.mu);
  impl.shutdown_done = true;
}

}  // namespace ringlane::router
