#include "router/api/http_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/buffer.hpp"
#include "boost/beast/core/string.hpp"
#include "boost/beast/http/chunk_encode.hpp"
#include "boost/beast/http/empty_body.hpp"
#include "boost/beast/http/serializer.hpp"
#include "nlohmann/json.hpp"
#include "services/log.h"

namespace ringlane::router::http_internal {
namespace {

namespace net = boost::asio;

std::string ToString(beast::string_view s) { return std::string(s.data(), s.size()); }
beast::string_view BeastView(std::string_view s) { return beast::string_view(s.data(), s.size()); }

// Request headers beyond this get 431; prompts travel in the body.
constexpr size_t kHeaderLimitBytes = 64 << 10;
constexpr size_t kReadBytes = 16 << 10;
// After an error response the server reads and drops what the client is still
// sending for at most this long, so closing does not reset the connection
// (a RST can destroy the response before the client has read it).
constexpr std::chrono::milliseconds kLinger{1000};
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

}  // namespace

std::string DefaultErrorBody(int status, std::string_view message) {
  nlohmann::json body;
  body["error"] = {
      {"message", std::string(message)}, {"type", ErrorType(status)}, {"code", nullptr}};
  return body.dump();
}

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

}  // namespace ringlane::router::http_internal
