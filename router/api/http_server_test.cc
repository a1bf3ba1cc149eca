#include "router/api/http_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/http_client.h"

namespace ringlane::router {
namespace {

using services::HttpClient;
using services::HttpRequestSpec;
using services::HttpResponse;

std::unique_ptr<HttpServer> StartOrDie(HttpHandler handler, HttpServerOptions options = {}) {
  options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(std::move(options), std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

std::unique_ptr<HttpClient> ConnectOrDie(const HttpServer& server) {
  absl::StatusOr<std::unique_ptr<HttpClient>> client =
      HttpClient::Connect("127.0.0.1", server.port(), absl::Seconds(5));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

HttpRequestSpec Get(std::string target) {
  HttpRequestSpec spec;
  spec.target = std::move(target);
  return spec;
}

void Ok(const HttpRequest&, HttpResponder& responder) { responder.Send(200, "text/plain", "ok"); }
// What Ok sends on the wire.
constexpr std::string_view kOkResponse =
    "HTTP/1.1 200 OK\r\nServer: ringlane\r\nContent-Type: text/plain\r\n"
    "Content-Length: 2\r\n\r\nok";

// A plain socket, for bytes no HTTP client would send.
int ConnectRaw(int port) {
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

void SendRaw(int fd, std::string_view bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Everything the server sends until it closes; `timeout` bounds the wait.
std::string ReadUntilEof(int fd, absl::Duration timeout) {
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
std::string ReadBytes(int fd, size_t want) {
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
bool Eventually(const std::function<bool()>& done) {
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
std::thread SendInBackground(const HttpServer& server, std::string target) {
  return std::thread([&server, target] {
    auto c = HttpClient::Connect("127.0.0.1", server.port(), absl::Seconds(5));
    ASSERT_TRUE(c.ok()) << c.status();
    auto r = (*c)->Send(Get(target), absl::Seconds(30));
    EXPECT_TRUE(r.ok()) << r.status();
  });
}

TEST(HttpServerTest, StartRejectsBadAddressesAndBusyPorts) {
  HttpServerOptions options;
  options.listen = "no-port-here";
  EXPECT_EQ(HttpServer::Start(options, Ok).status().code(), absl::StatusCode::kInvalidArgument);

  std::unique_ptr<HttpServer> first = StartOrDie(Ok);
  ASSERT_NE(first, nullptr);
  EXPECT_GT(first->port(), 0);
  options.listen = absl::StrCat("127.0.0.1:", first->port());
  EXPECT_EQ(HttpServer::Start(options, Ok).status().code(), absl::StatusCode::kUnavailable);
}

TEST(HttpServerTest, RoundTripCarriesMethodPathQueryHeadersAndBody) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](const HttpRequest& request, HttpResponder& responder) {
        nlohmann::json echo = {
            {"method", request.method},
            {"path", request.path},
            {"query", request.query},
            {"x_test", request.Header("x-test")},
            {"content_type", request.Header("content-type")},
            {"missing", request.Header("x-missing")},
            {"body", request.body},
            {"peer", request.peer},
            {"loopback", request.peer_is_loopback},
            // The client is connected and waiting for this answer.
            {"client_gone", responder.ClientGone()},
        };
        responder.Send(request.method == "POST" ? 201 : 200, "application/json", echo.dump(),
                       {{"X-Echo", "yes"}});
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);

  HttpRequestSpec get = Get("/v1/echo?a=1&b=two");
  get.headers = {{"X-Test", "Mixed Case Value"}};
  absl::StatusOr<HttpResponse> response = client->Send(get, absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers["x-echo"], "yes");
  EXPECT_EQ(response->headers["server"], "ringlane");
  EXPECT_EQ(response->headers["content-type"], "application/json");
  nlohmann::json echo = nlohmann::json::parse(response->body);
  EXPECT_EQ(echo["method"], "GET");
  EXPECT_EQ(echo["path"], "/v1/echo");
  EXPECT_EQ(echo["query"], "a=1&b=two");
  EXPECT_EQ(echo["x_test"], "Mixed Case Value");
  EXPECT_EQ(echo["missing"], "");
  EXPECT_EQ(echo["body"], "");
  EXPECT_EQ(echo["loopback"], true);
  EXPECT_EQ(echo["peer"].get<std::string>().rfind("127.0.0.1:", 0), 0u) << echo["peer"];
  EXPECT_EQ(echo["client_gone"], false);

  HttpRequestSpec post = Get("/v1/chat");
  post.method = "POST";
  post.body = R"({"prompt":"hi"})";
  response = client->Send(post, absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 201);
  echo = nlohmann::json::parse(response->body);
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["path"], "/v1/chat");
  EXPECT_EQ(echo["query"], "");
  EXPECT_EQ(echo["content_type"], "application/json");
  EXPECT_EQ(echo["body"], R"({"prompt":"hi"})");
}

TEST(HttpServerTest, KeepAliveServesRequestsOnOneConnection) {
  std::vector<std::string> peers;  // written by the one connection thread
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](const HttpRequest& request, HttpResponder& responder) {
        peers.push_back(request.peer);
        responder.Send(200, "text/plain", request.path);
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  for (const char* path : {"/one", "/two", "/three"}) {
    absl::StatusOr<HttpResponse> response = client->Send(Get(path), absl::Seconds(5));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->body, path);
  }
  EXPECT_EQ(server->active_connections(), 1);
  ASSERT_EQ(peers.size(), 3u);
  // The same client port each time: one TCP connection.
  EXPECT_EQ(peers[0], peers[1]);
  EXPECT_EQ(peers[1], peers[2]);
}

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](const HttpRequest& request, HttpResponder& responder) {
        responder.Send(200, "text/plain", absl::StrCat("<", request.path, ">"));
      });
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  SendRaw(fd,
          "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
          "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string text = ReadUntilEof(fd, absl::Seconds(5));
  ::close(fd);
  const size_t a = text.find("</a>");
  const size_t b = text.find("</b>");
  ASSERT_NE(a, std::string::npos) << text;
  ASSERT_NE(b, std::string::npos) << text;
  EXPECT_LT(a, b);
}

TEST(HttpServerTest, ExpectContinueGetsInterimResponse) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](const HttpRequest& request, HttpResponder& responder) {
        responder.Send(200, "text/plain", request.body);
      });
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  SendRaw(fd,
          "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n"
          "Connection: close\r\n\r\n");
  const std::string interim = "HTTP/1.1 100 Continue\r\n\r\n";
  EXPECT_EQ(ReadBytes(fd, interim.size()), interim);
  SendRaw(fd, "hello");
  const std::string text = ReadUntilEof(fd, absl::Seconds(5));
  ::close(fd);
  EXPECT_EQ(text.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 5), "hello");
}

TEST(HttpServerTest, BodyOverLimitGets413AndServerKeepsServing) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  std::unique_ptr<HttpServer> server = StartOrDie(
      [&](const HttpRequest& request, HttpResponder& responder) {
        ++calls;
        responder.Send(200, "text/plain", absl::StrCat(request.body.size()));
      },
      options);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);

  HttpRequestSpec big = Get("/v1/big");
  big.method = "POST";
  big.body = std::string(4096, 'x');
  absl::StatusOr<HttpResponse> response = client->Send(big, absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 413);
  EXPECT_EQ(response->headers["content-type"], "application/json");
  const nlohmann::json error = nlohmann::json::parse(response->body);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("1024"), std::string::npos)
      << response->body;
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(error["error"]["code"].is_null());
  EXPECT_EQ(calls, 0);

  // Exactly at the limit is fine; the client reconnects after the 413's
  // Connection: close.
  big.body = std::string(1024, 'x');
  response = client->Send(big, absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "1024");
  EXPECT_EQ(calls, 1);
}

TEST(HttpServerTest, MalformedRequestGets400AndClose) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.error_body = [](int status, std::string_view message) {
    return absl::StrCat("custom ", status, ": ", std::string(message));
  };
  std::unique_ptr<HttpServer> server = StartOrDie(
      [&](const HttpRequest&, HttpResponder& responder) {
        ++calls;
        responder.Send(200, "text/plain", "ok");
      },
      options);
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  SendRaw(fd, "THIS IS NOT HTTP\r\n\r\n");
  const std::string text = ReadUntilEof(fd, absl::Seconds(5));
  ::close(fd);
  EXPECT_EQ(text.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << text;
  EXPECT_NE(text.find("\r\n\r\ncustom 400: malformed HTTP request"), std::string::npos) << text;
  EXPECT_EQ(calls, 0);
}

TEST(HttpServerTest, IdleConnectionIsClosedAfterIdleTimeout) {
  HttpServerOptions options;
  options.idle_timeout = std::chrono::milliseconds(100);
  std::unique_ptr<HttpServer> server = StartOrDie(Ok, options);
  ASSERT_NE(server, nullptr);
  // Before connecting: the server's clock starts later, at accept.
  const absl::Time start = absl::Now();
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  // Half a request, then nothing: slow clients time out like idle ones.
  SendRaw(fd, "GET / HTTP/1.1\r\n");
  EXPECT_EQ(ReadUntilEof(fd, absl::Seconds(5)), "");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  ::close(fd);
  EXPECT_TRUE(Eventually([&] { return server->active_connections() == 0; }));
}

// Sends what the socket takes; a server that answered early and closed may
// take less.
void SendSome(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

constexpr char kChunkedHead[] = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

TEST(HttpServerTest, ChunkExtensionThatNeverEndsGets400NotAGrowingBuffer) {
  std::atomic<int> calls{0};
  std::unique_ptr<HttpServer> server = StartOrDie([&](const HttpRequest& r, HttpResponder& o) {
    ++calls;
    Ok(r, o);
  });
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  // The header limit does not cover a chunk header: before the bound, the
  // server kept every byte of a line that never ends.
  SendSome(fd, absl::StrCat(kChunkedHead, "5;ext=", std::string(1 << 20, 'a')));
  const std::string text = ReadUntilEof(fd, absl::Seconds(10));
  EXPECT_EQ(text.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << text.substr(0, 200);
  EXPECT_NE(text.find("chunk header or trailer"), std::string::npos) << text.substr(0, 400);
  EXPECT_EQ(calls, 0);
  ::close(fd);
}

TEST(HttpServerTest, TrailerThatNeverEndsGets400) {
  std::unique_ptr<HttpServer> server = StartOrDie(Ok);
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  SendSome(fd, absl::StrCat(kChunkedHead, "1\r\nx\r\n0\r\nX-Trailer: ", std::string(1 << 20, 'b')));
  const std::string text = ReadUntilEof(fd, absl::Seconds(10));
  EXPECT_EQ(text.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << text.substr(0, 200);
  ::close(fd);
}

TEST(HttpServerTest, EndlessTrailerFieldsAreBoundedToo) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  std::unique_ptr<HttpServer> server = StartOrDie(Ok, options);
  ASSERT_NE(server, nullptr);
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  std::string fields;
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&fields, "X-T", i, ": v\r\n");
  SendSome(fd, absl::StrCat(kChunkedHead, "1\r\nx\r\n0\r\n", fields));
  const std::string text = ReadUntilEof(fd, absl::Seconds(10));
  // Beast's own limit (431/400) or ours (413) may come first; never 200.
  ASSERT_GE(text.size(), 12u);
  EXPECT_TRUE(text.rfind("HTTP/1.1 4", 0) == 0) << text.substr(0, 200);
  ::close(fd);
}

TEST(HttpServerTest, SilentConnectionIsClosedAfterFirstByteTimeout) {
  HttpServerOptions options;
  options.first_byte_timeout = std::chrono::milliseconds(100);
  options.idle_timeout = std::chrono::milliseconds(30000);
  std::unique_ptr<HttpServer> server = StartOrDie(Ok, options);
  ASSERT_NE(server, nullptr);
  const absl::Time start = absl::Now();
  const int fd = ConnectRaw(server->port());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ReadUntilEof(fd, absl::Seconds(5)), "");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ::close(fd);
  EXPECT_TRUE(Eventually([&] { return server->active_connections() == 0; }));
}

TEST(HttpServerTest, PerPeerLimitGets503ButProbesAreStillAnswered) {
  Blocking b;
  HttpServerOptions options;
  options.max_connections_per_peer = 2;
  std::unique_ptr<HttpServer> server = StartOrDie(b.Handler(), options);
  ASSERT_NE(server, nullptr);
  // Two busy connections fill this client's share.
  std::thread t1 = SendInBackground(*server, "/block");
  std::thread t2 = SendInBackground(*server, "/block");
  ASSERT_TRUE(Eventually([&] { return b.blocked.load() == 2; }));

  std::unique_ptr<HttpClient> c = ConnectOrDie(*server);
  ASSERT_NE(c, nullptr);
  absl::StatusOr<HttpResponse> response = c->Send(Get("/v1/models"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 503);
  for (const char* path : {"/health", "/ready"}) {
    std::unique_ptr<HttpClient> probe = ConnectOrDie(*server);
    ASSERT_NE(probe, nullptr);
    response = probe->Send(Get(path), absl::Seconds(5));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200) << path;
    EXPECT_EQ(response->body, path);
  }
  b.release.Notify();
  t1.join();
  t2.join();
  ASSERT_TRUE(Eventually([&] { return server->active_connections() == 0; }));
  std::unique_ptr<HttpClient> d = ConnectOrDie(*server);
  ASSERT_NE(d, nullptr);
  response = d->Send(Get("/v1/models"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
}

TEST(HttpServerTest, StreamedPiecesArriveAsTheyAreWritten) {
  absl::Notification first_arrived;
  std::atomic<bool> first_arrived_before_rest{false};
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](const HttpRequest&, HttpResponder& responder) {
        ASSERT_TRUE(responder.StartStream(200, "text/plain", {{"Cache-Control", "no-cache"}}));
        responder.Write("one");
        // Only the client's on_data sets this: if the server held "one" back
        // until more was written (or until the end), the wait would time out.
        first_arrived_before_rest = first_arrived.WaitForNotificationWithTimeout(absl::Seconds(5));
        absl::SleepFor(absl::Milliseconds(50));
        responder.Write("two");
        absl::SleepFor(absl::Milliseconds(50));
        responder.Write("three");
        responder.EndStream();
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> pieces;
  std::vector<absl::Time> arrivals;
  absl::StatusOr<HttpResponse> response = client->Stream(
      Get("/stream"),
      [&](std::string_view data) {
        pieces.emplace_back(data);
        arrivals.push_back(absl::Now());
        if (!first_arrived.HasBeenNotified()) first_arrived.Notify();
        return true;
      },
      absl::Seconds(10));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(first_arrived_before_rest);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(response->headers["cache-control"], "no-cache");
  EXPECT_EQ(response->headers["content-type"], "text/plain");
  EXPECT_EQ(response->body, "onetwothree");
  ASSERT_EQ(pieces, (std::vector<std::string>{"one", "two", "three"}));
  // "three" was written at least 100 ms after "one" arrived.
  EXPECT_GE(arrivals[2] - arrivals[0], absl::Milliseconds(90));

  // The connection is reusable after the terminating chunk.
  response = client->Stream(
      Get("/stream"), [](std::string_view) { return true; }, absl::Seconds(10));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "onetwothree");
  EXPECT_EQ(server->active_connections(), 1);
}

TEST(HttpServerTest, ServerSentEventsParseThroughTheStream) {
  std::unique_ptr<HttpServer> server = StartOrDie([](const HttpRequest&, HttpResponder& responder) {
    responder.StartStream(200, "text/event-stream");
    // Events split across writes, comments, multi-line data, CRLF.
    for (const char* piece : {
             ": ping\n\n",
             "data: {\"i\":0}\n\ndata: li",
             "ne one\r\ndata: line two\r",
             "\n\r\nevent: x\nid: 3\ndata:tight\n",
             "\n",
             "data: [DONE]\n\n",
         }) {
      responder.Write(piece);
    }
    responder.EndStream();
  });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  services::SseParser parser;
  std::vector<std::string> events;
  absl::StatusOr<HttpResponse> response = client->Stream(
      Get("/v1/completions"),
      [&](std::string_view data) {
        parser.Feed(data, [&](std::string_view event) { events.emplace_back(event); });
        return true;
      },
      absl::Seconds(10));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->headers["content-type"], "text/event-stream");
  EXPECT_EQ(events,
            (std::vector<std::string>{R"({"i":0})", "line one\nline two", "tight", "[DONE]"}));
}

TEST(HttpServerTest, ClientGoneTurnsTrueAfterClientHangsUp) {
  absl::Notification gone;
  std::atomic<bool> gone_at_start{true};
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](const HttpRequest&, HttpResponder& responder) {
        responder.StartStream(200, "text/event-stream");
        gone_at_start = responder.ClientGone();
        responder.Write("data: first\n\n");
        // Nothing more is written: the disconnect must be seen by ClientGone
        // alone, as when a handler waits for its first token.
        const absl::Time deadline = absl::Now() + absl::Seconds(5);
        while (absl::Now() < deadline) {
          if (responder.ClientGone()) {
            gone.Notify();
            return;
          }
          absl::SleepFor(absl::Milliseconds(10));
        }
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<HttpResponse> response = client->Stream(
      Get("/v1/completions"), [](std::string_view) { return false; }, absl::Seconds(10));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "data: first\n\n");
  EXPECT_TRUE(gone.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_FALSE(gone_at_start);
}

TEST(HttpServerTest, HandlerWithoutResponseGets500) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](const HttpRequest& request, HttpResponder& responder) {
        if (request.path == "/ok") responder.Send(200, "text/plain", "fine");
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<HttpResponse> response = client->Send(Get("/silent"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 500);
  const nlohmann::json error = nlohmann::json::parse(response->body);
  EXPECT_EQ(error["error"]["message"], "internal error: handler sent no response");
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_EQ(response->headers.count("connection"), 0u);  // kept alive
  response = client->Send(Get("/ok"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "fine");
  EXPECT_EQ(server->active_connections(), 1);
}

TEST(HttpServerTest, HandlerThatThrowsGets500AndClose) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](const HttpRequest& request, HttpResponder& responder) {
        if (request.path == "/throw") throw std::runtime_error("boom");
        responder.Send(200, "text/plain", "fine");
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<HttpResponse> response = client->Send(Get("/throw"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 500);
  EXPECT_EQ(response->headers["connection"], "close");
  response = client->Send(Get("/ok"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "fine");
}

TEST(HttpServerTest, ConnectionOverMaxConnectionsGets503WhenAllAreBusy) {
  Blocking b;
  HttpServerOptions options;
  options.max_connections = 1;
  std::unique_ptr<HttpServer> server = StartOrDie(b.Handler(), options);
  ASSERT_NE(server, nullptr);
  std::thread busy = SendInBackground(*server, "/block");
  ASSERT_TRUE(Eventually([&] { return b.blocked.load() == 1; }));

  std::unique_ptr<HttpClient> second = ConnectOrDie(*server);
  ASSERT_NE(second, nullptr);
  absl::StatusOr<HttpResponse> response = second->Send(Get("/"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(nlohmann::json::parse(response->body)["error"]["type"], "unavailable_error");
  EXPECT_EQ(server->active_connections(), 1);
  // Probes are answered all the same.
  std::unique_ptr<HttpClient> probe = ConnectOrDie(*server);
  ASSERT_NE(probe, nullptr);
  response = probe->Send(Get("/ready"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "/ready");

  // Once the busy one is done there is room again.
  b.release.Notify();
  busy.join();
  ASSERT_TRUE(Eventually([&] { return server->active_connections() == 0; }));
  response = second->Send(Get("/"), absl::Seconds(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
}

TEST(HttpServerTest, ConnectionsWaitingForARequestMakeRoomUnderPressure) {
  HttpServerOptions options;
  options.max_connections = 4;
  std::unique_ptr<HttpServer> server = StartOrDie(Ok, options);
  ASSERT_NE(server, nullptr);
  // A kept-alive client and silent sockets fill every slot...
  std::unique_ptr<HttpClient> kept = ConnectOrDie(*server);
  ASSERT_NE(kept, nullptr);
  ASSERT_EQ(kept->Send(Get("/"), absl::Seconds(5))->status, 200);
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(ConnectRaw(server->port()));
  // ...yet a new client is served: the oldest idle connection gave way.
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<HttpClient> c = ConnectOrDie(*server);
    ASSERT_NE(c, nullptr);
    absl::StatusOr<HttpResponse> response = c->Send(Get("/"), absl::Seconds(5));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200);
  }
  EXPECT_LE(server->active_connections(), 4);
  for (int fd : silent) ::close(fd);
}

TEST(HttpServerTest, ShutdownCutsStreamsStillRunningAtTheDeadline) {
  absl::Notification first_piece;
  absl::Notification handler_done;
  std::atomic<bool> write_failed{false};
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](const HttpRequest&, HttpResponder& responder) {
        responder.StartStream(200, "text/plain");
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        while (absl::Now() < deadline) {
          if (!responder.Write("x")) {
            write_failed = true;
            break;
          }
          absl::SleepFor(absl::Milliseconds(10));
        }
        handler_done.Notify();
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  absl::Status client_status;
  std::thread reader([&] {
    client_status = client
                        ->Stream(
                            Get("/stream"),
                            [&](std::string_view) {
                              if (!first_piece.HasBeenNotified()) first_piece.Notify();
                              return true;
                            },
                            absl::Seconds(20))
                        .status();
  });
  // EXPECT, not ASSERT: the reader thread must be joined either way, and the
  // Shutdown below is what ends its stream.
  EXPECT_TRUE(first_piece.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server->Shutdown(start + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  reader.join();
  EXPECT_TRUE(handler_done.HasBeenNotified());
  EXPECT_TRUE(write_failed);
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(client_status.code(), absl::StatusCode::kUnavailable) << client_status;
  EXPECT_EQ(server->active_connections(), 0);
  server->Shutdown(absl::Now());  // idempotent
}

TEST(HttpServerTest, ShutdownClosesIdleKeptAliveConnectionsPromptly) {
  std::unique_ptr<HttpServer> server = StartOrDie(Ok);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<HttpClient> client = ConnectOrDie(*server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Send(Get("/"), absl::Seconds(5)).ok());
  EXPECT_EQ(server->active_connections(), 1);
  const absl::Time start = absl::Now();
  server->Shutdown(start + absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(server->active_connections(), 0);
  // The server is gone: the kept-alive connection is closed and nothing
  // listens any more.
  EXPECT_EQ(client->Send(Get("/"), absl::Seconds(2)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(HttpServerTest, RequestArrivingDuringShutdownGets503) {
  std::unique_ptr<HttpServer> server = StartOrDie(Ok);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const int fd = ConnectRaw(port);
  ASSERT_GE(fd, 0);
  // One whole exchange first, so the server has surely accepted the
  // connection (Shutdown resets connections still in the listen backlog).
  SendRaw(fd, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string first = ReadBytes(fd, kOkResponse.size());
  ASSERT_EQ(first, kOkResponse);
  // Part of a request: the connection is no longer idle, so Shutdown lets
  // it finish the request (and answers it 503).
  SendRaw(fd, "GET /late HTTP/1.1\r\nHost: x\r\n");
  std::thread stopper([&] { server->Shutdown(absl::Now() + absl::Seconds(5)); });
  // Shutdown closes the listener after it has started refusing requests.
  EXPECT_TRUE(Eventually([&] {
    const int probe = ConnectRaw(port);
    if (probe >= 0) ::close(probe);
    return probe < 0;
  }));
  SendRaw(fd, "\r\n");
  const std::string text = ReadUntilEof(fd, absl::Seconds(5));
  ::close(fd);
  stopper.join();
  EXPECT_EQ(text.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << text;
  EXPECT_NE(text.find("shutting down"), std::string::npos) << text;
}

}  // namespace
}  // namespace ringlane::router
