// The gateway's HTTP/1.1 reader (router/api/http_server.h) over arbitrary
// connection bytes: one real HttpServer on loopback for the process, and per
// input one connection that sends the input and then half-closes, as a
// client that sent everything it had would. What must hold: no crash, no
// undefined behaviour, an answer that is HTTP (or none), and the connection
// closed and its thread gone within seconds, whatever the bytes: a server
// that keeps a finished client's connection is a lock-out waiting to happen.
//
// Input: byte 0 = how to send (bit 0: in two writes, split at byte 1's share
// of the rest; 0x0f in the low nibble: never half-close, so only the idle
// timeout ends the connection), then the bytes of the connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "router/api/http_server.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ringlane::router::HttpRequest;
using ringlane::router::HttpResponder;
using ringlane::router::HttpServer;
using ringlane::router::HttpServerOptions;

constexpr std::chrono::milliseconds kIdleTimeout{50};
// Far above anything the server should need after the client half-closed.
constexpr int kCloseDeadlineMs = 5000;

// Answers by path with every way a handler may respond, so the responses the
// server makes after a fuzzed request are exercised too.
void Handle(const HttpRequest& request, HttpResponder& responder) {
  if (request.path == "/stream") {
    if (!responder.StartStream(200, "text/plain", {{"X-Kind", "stream"}})) return;
    for (size_t i = 0; i < request.body.size(); i += 7) {
      if (!responder.Write(std::string_view(request.body).substr(i, 7))) return;
    }
    responder.EndStream();
  } else if (request.path == "/none") {
    return;  // the server answers 500 for it
  } else if (request.path == "/throw") {
    throw std::runtime_error("handler threw");
  } else if (request.path == "/cut") {
    responder.StartStream(200, "text/plain");
    responder.Write("partial");
    return;  // mid-stream: the server closes the connection
  } else {
    responder.Send(200, "text/plain",
                   absl::StrCat(request.method.size(), " ", request.path.size(), " ",
                                request.query.size(), " ", request.headers.size(), " ",
                                request.body.size(), " ", request.Header("content-type").size()));
  }
}

HttpServer& Server() {
  static HttpServer* server = [] {
    HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    options.max_body_bytes = 4096;
    options.max_connections = 16;
    options.idle_timeout = kIdleTimeout;
    absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(options, Handle);
    FUZZ_CHECK(s.ok(), "cannot start the server: %s", s.status().ToString().c_str());
    return s->release();
  }();
  return *server;
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0, "socket: %s", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // libFuzzer's timer signal interrupts blocking calls; an interrupted
    // connect goes on in the background.
    FUZZ_CHECK(errno == EINTR, "connect: %s", std::strerror(errno));
    pollfd p{fd, POLLOUT, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    FUZZ_CHECK(err == 0, "connect: %s", std::strerror(err));
  }
  return fd;
}

// False once the server has closed (or reset) the connection.
bool SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  HttpServer& server = Server();
  ringlane::fuzz::ByteReader in(data, size);
  const uint8_t how = in.Byte();
  const uint8_t split_at = in.Byte();
  const std::string_view bytes = in.Rest();

  const int fd = Connect(server.port());
  bool open = true;
  if ((how & 1) != 0 && bytes.size() > 1) {
    const size_t cut = bytes.size() * split_at / 256;
    open = SendAll(fd, bytes.substr(0, cut));
    // Long enough for the server to read the first part on its own.
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    if (open) open = SendAll(fd, bytes.substr(cut));
  } else {
    open = SendAll(fd, bytes);
  }
  if (open && (how & 0x0f) != 0x0f) ::shutdown(fd, SHUT_WR);

  std::string answer;
  char buf[16384];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kCloseDeadlineMs);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    FUZZ_CHECK(ready > 0,
               "the server kept the connection open for %d ms after the client finished "
               "(%zu bytes sent, %zu received)",
               kCloseDeadlineMs, bytes.size(), answer.size());
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF or reset: closed either way
    // Only the start is checked; the rest is drained.
    if (answer.size() < 64) answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  FUZZ_CHECK(answer.empty() || answer.rfind("HTTP/1.1 ", 0) == 0, "not an HTTP answer: %.64s",
             answer.c_str());

  // The connection's thread must end too, or each input would leave one.
  const auto thread_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.active_connections() != 0) {
    FUZZ_CHECK(std::chrono::steady_clock::now() < thread_deadline,
               "%d connections still counted 5 s after the client closed",
               server.active_connections());
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return 0;
}
