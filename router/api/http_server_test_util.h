// Helpers of the HTTP server's tests (http_server_test.cc,
// http_connection_test.cc): a server on a free loopback port, clients that
// speak HTTP or raw bytes, and a handler that blocks on demand.
#ifndef RINGLANE_ROUTER_API_HTTP_SERVER_TEST_UTIL_H_
#define RINGLANE_ROUTER_API_HTTP_SERVER_TEST_UTIL_H_

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "router/api/http_server.h"
#include "services/http_client.h"

namespace ringlane::router::http_test {

using services::HttpClient;
using services::HttpRequestSpec;
using services::HttpResponse;

inline std::unique_ptr<HttpServer> StartOrDie(HttpHandler handler, HttpServerOptions options = {}) {
  options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(std::move(options), std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

inline std::unique_ptr<HttpClient> ConnectOrDie(const HttpServer& server) {
  absl::StatusOr<std::unique_ptr<HttpClient>> client =
      HttpClient::Connect("127.0.0.1", server.port(), absl::Seconds(5));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

inline HttpRequestSpec Get(std::string target) {
  HttpRequestSpec spec;
  spec.target = std::move(target);
  return spec;
}

inline void Ok(const HttpRequest&, HttpResponder& responder) {
  responder.Send(200, "text/plain", "ok");
}
// What Ok sends on the wire.
inline constexpr std::string_view kOkResponse =
    "HTTP/1.1 200 OK\r\nServer: ringlane\r\nContent-Type: text/plain\r\n"
    "Content-Length: 2\r\n\r\nok";

// A plain socket, for bytes no HTTP client would send.
inline int ConnectRaw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline void SendRaw(int fd, std::string_view bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Everything the server sends until it closes; `timeout` bounds the wait.
inline std::string ReadUntilEof(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string text;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0 || ::poll(&p, 1, static_cast<int>(left_ms)) <= 0) {
      ADD_FAILURE() << "no EOF within " << timeout << "; got so far: " << text;
      return text;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return text;
    text.append(buf, static_cast<size_t>(n));
  }
}

// Reads exactly what `want` is long and returns it.
inline std::string ReadBytes(int fd, size_t want) {
  std::string text;
  char buf[4096];
  while (text.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), want - text.size()), 0);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// Polls `done` every few milliseconds for up to five seconds.
inline bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A handler whose "/block" requests wait for `release`: a busy connection.
struct Blocking {
  absl::Notification release;
  std::atomic<int> blocked{0};
  HttpHandler Handler() {
    return [this](const HttpRequest& r, HttpResponder& o) {
      if (r.path == "/block") {
        ++blocked;
        release.WaitForNotification();
      }
      o.Send(200, "text/plain", r.path);
    };
  }
};

// Sends a request on its own thread (it blocks until released).
inline std::thread SendInBackground(const HttpServer& server, std::string target) {
  return std::thread([&server, target] {
    auto c = HttpClient::Connect("127.0.0.1", server.port(), absl::Seconds(5));
    ASSERT_TRUE(c.ok()) << c.status();
    auto r = (*c)->Send(Get(target), absl::Seconds(30));
    EXPECT_TRUE(r.ok()) << r.status();
  });
}

}  // namespace ringlane::router::http_test

#endif  // RINGLANE_ROUTER_API_HTTP_SERVER_TEST_UTIL_H_
