// The accept loop's side: binding, the connection limits and eviction under
// pressure, shutdown. The reading of requests and writing of responses on
// one connection is http_connection_test.cc.

#include "router/api/http_server.h"

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
#include "router/api/http_server_test_util.h"
#include "services/http_client.h"

namespace ringlane::router {
namespace {

using http_test::Blocking;
using http_test::ConnectOrDie;
using http_test::ConnectRaw;
using http_test::Eventually;
using http_test::Get;
using http_test::kOkResponse;
using http_test::Ok;
using http_test::ReadBytes;
using http_test::ReadUntilEof;
using http_test::SendInBackground;
using http_test::SendRaw;
using http_test::StartOrDie;
using services::HttpClient;
using services::HttpResponse;

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
