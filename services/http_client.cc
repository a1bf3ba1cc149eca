#include "services/http_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/buffer_body.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/read.hpp"
#include "boost/beast/http/string_body.hpp"
#include "boost/beast/http/write.hpp"
#include "services/flags_util.h"

namespace ringlane::services {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

// Debian's Abseil has its own absl::string_view; views cross into StrCat here.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string ToString(beast::string_view s) { return std::string(s.data(), s.size()); }

// How much of a body one read hands to on_data at most.
constexpr size_t kPieceBytes = 16 << 10;

// absl::InfiniteDuration (or a huge timeout) would overflow steady_clock.
SteadyTime DeadlineAfter(absl::Duration timeout) {
  const absl::Duration capped =
      std::min(std::max(timeout, absl::ZeroDuration()), absl::Hours(24 * 365));
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             absl::ToChronoNanoseconds(capped));
}

absl::Status FromError(beast::error_code ec, std::string_view what) {
  if (ec == beast::error::timeout) {
    return absl::DeadlineExceededError(absl::StrCat(AbslView(what), ": timed out"));
  }
  return absl::UnavailableError(absl::StrCat(AbslView(what), ": ", ec.message()));
}

bool ValidHostChar(char c, bool bracketed) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  if (bracketed) return c == ':' || c == '.' || c == '%';
  return c == '-' || c == '.' || c == '_';
}

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(AbslView(url.substr(0, kScheme.size())), AbslView(kScheme))) {
    return absl::InvalidArgumentError(
        absl::StrCat("want an http:// URL, got '", AbslView(url), "'"));
  }
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (path.find_first_of("?# ") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("URL '", AbslView(url), "' has a query, fragment or space in its path"));
  }
  if (authority.find('@') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("URL '", AbslView(url), "' has user info, which is not supported"));
  }

  HttpUrl parsed;
  const bool bracketed = !authority.empty() && authority.front() == '[';
  const size_t bracket_end = bracketed ? authority.find(']') : 0;
  const bool has_port =
      bracketed ? (bracket_end != std::string_view::npos && bracket_end + 1 < authority.size())
                : authority.find(':') != std::string_view::npos;
  if (has_port) {
    absl::StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(authority);
    if (!host_port.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("URL '", AbslView(url), "': ", host_port.status().message()));
    }
    parsed.host = std::move(host_port->first);
    parsed.port = host_port->second;
    if (parsed.port == 0) {
      return absl::InvalidArgumentError(absl::StrCat("URL '", AbslView(url), "' has port 0"));
    }
  } else if (bracketed) {
    if (bracket_end == std::string_view::npos || bracket_end != authority.size() - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("URL '", AbslView(url), "' has an unclosed '['"));
    }
    parsed.host = std::string(authority.substr(1, bracket_end - 1));
  } else {
    parsed.host = std::string(authority);
  }
  if (parsed.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("URL '", AbslView(url), "' has no host"));
  }
  for (char c : parsed.host) {
    if (!ValidHostChar(c, bracketed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("URL '", AbslView(url), "' has a bad host '", parsed.host, "'"));
    }
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  parsed.prefix = std::string(path);
  return parsed;
}

// All socket work runs on the calling thread: each operation is started
// asynchronously and io_context::run() drives it to completion, because Beast
// applies tcp_stream's expiry only to asynchronous operations.
struct HttpClient::Impl {
  Impl(std::string host_in, int port_in) : host(std::move(host_in)), port(port_in) {}

  // Runs one asynchronous operation to completion and returns its error.
  template <typename Start>
  beast::error_code Run(Start start) {
    beast::error_code result;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  absl::Status Open(SteadyTime deadline) {
    Close();
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", ec.message()));
    stream.expires_at(deadline);
    ec = Run([&](auto handler) { stream.async_connect(endpoints, std::move(handler)); });
    if (ec) {
      Close();
      // A connect that ran out of time is still "could not connect".
      return absl::UnavailableError(
          absl::StrCat("connect ", JoinHostPort(host, port), ": ",
                       ec == beast::error::timeout ? "timed out" : ec.message()));
    }
    stream.socket().set_option(tcp::no_delay(true), ec);
    open = true;
    fresh = true;
    return absl::OkStatus();
  }

  // True when a kept-alive connection can no longer carry a request: the
  // server closed or reset it, or sent something unasked (e.g. a 408).
  bool Stale() {
    if (!open) return true;
    if (fresh) return false;
    if (buffer.size() > 0) return true;
    pollfd p{stream.socket().native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    return true;
  }

  void Close() {
    if (stream.socket().is_open()) {
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream.socket().close(ignored);
    }
    buffer.consume(buffer.size());
    open = false;
  }

  absl::StatusOr<HttpResponse> Exchange(const HttpRequestSpec& spec,
                                        const std::function<bool(std::string_view)>* on_data,
                                        absl::Duration timeout);
  // One try on the open connection; `unanswered`: it failed because the
  // peer closed before a byte of the response came.
  absl::StatusOr<HttpResponse> Attempt(const HttpRequestSpec& spec,
                                       const std::function<bool(std::string_view)>* on_data,
                                       SteadyTime deadline, bool* unanswered);

  const std::string host;
  const int port;
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  // Bytes read past the end of the last parsed element.
  beast::flat_buffer buffer;
  bool open = false;
  // No exchange has run on this connection yet.
  bool fresh = false;
  int64_t retries = 0;
};

// The peer closed or reset the connection.
bool PeerClosed(beast::error_code ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted;
}

absl::StatusOr<HttpResponse> HttpClient::Impl::Exchange(
    const HttpRequestSpec& spec, const std::function<bool(std::string_view)>* on_data,
    absl::Duration timeout) {
  const SteadyTime deadline = DeadlineAfter(timeout);
  bool reused = false;
  if (Stale()) {
    if (absl::Status s = Open(deadline); !s.ok()) return s;
  } else {
    reused = !fresh;
  }
  fresh = false;
  bool unanswered = false;
  absl::StatusOr<HttpResponse> r = Attempt(spec, on_data, deadline, &unanswered);
  if (r.ok() || !reused || !unanswered) return r;
  // A server may close an idle kept-alive connection just as a request goes
  // out on it (the poll in Stale() saw nothing yet). It closed without
  // reading the request, so sending it once more on a new connection cannot
  // run it twice; a connection that was fresh, or a response begun, is
  // never retried.
  ++retries;
  if (absl::Status s = Open(deadline); !s.ok()) return s;
  fresh = false;
  return Attempt(spec, on_data, deadline, &unanswered);
}

absl::StatusOr<HttpResponse> HttpClient::Impl::Attempt(
    const HttpRequestSpec& spec, const std::function<bool(std::string_view)>* on_data,
    SteadyTime deadline, bool* unanswered) {
  *unanswered = false;

  http::request<http::string_body> req;
  const http::verb verb = http::string_to_verb(spec.method);
  if (verb == http::verb::unknown) {
    req.method_string(spec.method);
  } else {
    req.method(verb);
  }
  req.target(spec.target);
  req.version(11);
  req.set(http::field::host, JoinHostPort(host, port));
  for (const auto& [name, value] : spec.headers) req.insert(name, value);
  if (!spec.body.empty()) {
    req.set(http::field::content_type, spec.content_type);
    req.body() = spec.body;
  }
  req.prepare_payload();

  stream.expires_at(deadline);
  beast::error_code ec =
      Run([&](auto handler) { http::async_write(stream, req, std::move(handler)); });
  if (ec) {
    *unanswered = PeerClosed(ec);
    Close();
    return FromError(ec, "send request");
  }

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (verb == http::verb::head) parser.skip(true);
  HttpResponse response;
  bool header_taken = false;
  char piece[kPieceBytes];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof(piece);
    // read_some returns after each parsed element (header, chunk header,
    // chunk body or what one read brought), so a flushed chunk reaches
    // on_data without waiting for the next one.
    ec = Run(
        [&](auto handler) { http::async_read_some(stream, buffer, parser, std::move(handler)); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      *unanswered = !parser.got_some() && PeerClosed(ec);
      Close();
      return FromError(ec, "read response");
    }
    if (!header_taken && parser.is_header_done()) {
      header_taken = true;
      response.status = parser.get().result_int();
      for (const auto& field : parser.get()) {
        response.headers[absl::AsciiStrToLower(ToString(field.name_string()))] =
            ToString(field.value());
      }
    }
    const size_t n = sizeof(piece) - parser.get().body().size;
    if (n == 0) continue;
    const std::string_view data(piece, n);
    response.body.append(data);
    if (on_data != nullptr && !(*on_data)(data)) {
      Close();
      return response;
    }
  }
  if (!parser.get().keep_alive()) Close();
  return response;
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpClient::~HttpClient() { Close(); }

absl::StatusOr<std::unique_ptr<HttpClient>> HttpClient::Connect(const std::string& host, int port,
                                                                absl::Duration timeout) {
  auto impl = std::make_unique<Impl>(host, port);
  if (absl::Status s = impl->Open(DeadlineAfter(timeout)); !s.ok()) return s;
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequestSpec& request,
                                              absl::Duration timeout) {
  return impl_->Exchange(request, nullptr, timeout);
}

absl::StatusOr<HttpResponse> HttpClient::Stream(
    const HttpRequestSpec& request, const std::function<bool(std::string_view data)>& on_data,
    absl::Duration timeout) {
  return impl_->Exchange(request, &on_data, timeout);
}

int64_t HttpClient::retries() const { return impl_->retries; }

void HttpClient::Close() {
  if (impl_ != nullptr) impl_->Close();
}

void SseParser::Feed(std::string_view bytes,
                     const std::function<void(std::string_view data)>& on_event) {
  pending_.append(bytes);
  size_t start = 0;
  for (;;) {
    // A line ends at "\r\n", "\n" or a lone "\r". A '\r' that is the last
    // byte so far may be the first half of "\r\n": handle it now and drop a
    // '\n' that starts the next piece.
    if (skip_lf_ && start < pending_.size()) {
      if (pending_[start] == '\n') ++start;
      skip_lf_ = false;
    }
    const size_t end = pending_.find_first_of("\r\n", start);
    if (end == std::string::npos) break;
    const std::string_view line(pending_.data() + start, end - start);
    if (pending_[end] == '\r') {
      if (end + 1 < pending_.size()) {
        start = end + (pending_[end + 1] == '\n' ? 2 : 1);
      } else {
        start = end + 1;
        skip_lf_ = true;
      }
    } else {
      start = end + 1;
    }

    if (line.empty()) {
      if (has_data_) on_event(data_);
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.front() == ':') continue;  // a comment (keep-alive ping)
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value =
        colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field != "data") continue;
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  pending_.erase(0, start);
}

}  // namespace ringlane::services
