// One connection's side: requests read (keep-alive, pipelining, Expect,
// chunked bodies and their bounds, timeouts), responses and streams written,
// handlers that fail. Limits and shutdown are http_server_test.cc.

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
#include "router/api/http_server.h"
#include "router/api/http_server_test_util.h"
#include "services/http_client.h"

namespace ringlane::router {
namespace {

using http_test::ConnectOrDie;
using http_test::ConnectRaw;
using http_test::Eventually;
using http_test::Get;
using http_test::Ok;
using http_test::ReadBytes;
using http_test::ReadUntilEof;
using http_test::SendRaw;
using http_test::StartOrDie;
using services::HttpClient;
using services::HttpRequestSpec;
using services::HttpResponse;

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

}  // namespace
}  // namespace ringlane::router
