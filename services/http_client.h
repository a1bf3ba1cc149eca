// A small blocking HTTP/1.1 client (Boost.Beast) for the tests and the
// benchmark client: one keep-alive TCP connection, plain http only (the
// gateway serves plain HTTP; TLS belongs to the ingress in front of it).
// Streamed bodies (server-sent events) are handed over piece by piece as they
// arrive, so a caller can time them and can hang up mid-stream.
#ifndef RINGLANE_SERVICES_HTTP_CLIENT_H_
#define RINGLANE_SERVICES_HTTP_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringlane::services {

// "http://host:port/prefix" split up. The prefix has no trailing '/' ("" for
// "http://h:1" and "http://h:1/").
struct HttpUrl {
  std::string host;
  int port = 80;
  std::string prefix;
};
// InvalidArgument for a scheme other than http, or a bad host or port.
absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url);

struct HttpRequestSpec {
  std::string method = "GET";
  std::string target;  // "/v1/models"
  // Extra headers ("Authorization", "Bearer k"); Host, Content-Length and
  // Content-Type (when body is set) are added.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "application/json";
};

struct HttpResponse {
  int status = 0;
  // Lower-cased names.
  std::map<std::string, std::string> headers;
  // The whole body; for Stream, what on_data was given, concatenated (until
  // on_data returned false).
  std::string body;
};

class HttpClient {
 public:
  // Connects to host:port. Unavailable when that fails within `timeout`.
  static absl::StatusOr<std::unique_ptr<HttpClient>> Connect(const std::string& host, int port,
                                                             absl::Duration timeout);
  ~HttpClient();

  // Sends one request and reads the whole response. Unavailable when the
  // connection fails or closes, DeadlineExceeded past `timeout`. Reconnects
  // first when the server closed the previous keep-alive connection, and
  // once more when it closes it as the request goes out (see retries()).
  absl::StatusOr<HttpResponse> Send(const HttpRequestSpec& request, absl::Duration timeout);

  // Like Send, but calls on_data with each piece of the body as it is read
  // off the socket (chunked or not; chunk framing removed). When on_data
  // returns false the connection is closed at once (the client "goes away")
  // and the response so far is returned. `timeout` bounds the whole
  // exchange.
  absl::StatusOr<HttpResponse> Stream(const HttpRequestSpec& request,
                                      const std::function<bool(std::string_view data)>& on_data,
                                      absl::Duration timeout);

  // Requests sent a second time, on a new connection, because the server
  // closed the kept-alive one under them before answering (once each; a
  // fresh connection or a begun response is never retried).
  int64_t retries() const;

  void Close();

 private:
  struct Impl;
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits a server-sent-event byte stream into events. Feed it the pieces in
// order; on_event gets each event's data (its "data:" lines joined with
// '\n', the one space after the colon removed) once the blank line that ends
// it has arrived. Comment lines (":...") and other fields are skipped.
class SseParser {
 public:
  void Feed(std::string_view bytes, const std::function<void(std::string_view data)>& on_event);

 private:
  std::string pending_;  // bytes after the last complete line
  std::string data_;     // data lines of the event being read
  bool has_data_ = false;
  // The last piece ended in '\r': a '\n' starting the next one belongs to it.
  bool skip_lf_ = false;
};

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_HTTP_CLIENT_H_
