#include "tools/bench/client.h"

#include <chrono>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ringlane::bench {
namespace {

using json = nlohmann::json;

std::string Excerpt(std::string_view s) {
  constexpr size_t kMax = 300;
  std::string out(s.substr(0, kMax));
  if (s.size() > kMax) out += "...";
  return out;
}

}  // namespace

absl::StatusOr<std::string> BuildRequestBody(const ServerOptions& server, const RequestSpec& spec) {
  json body = json::object();
  body["model"] = server.model;
  if (spec.endpoint == Endpoint::kChat) {
    json messages = json::array();
    for (const ChatMessage& m : spec.messages) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    body["messages"] = std::move(messages);
  } else {
    body["prompt"] = spec.prompt;
  }
  body["max_tokens"] = spec.max_tokens;
  body["temperature"] = spec.temperature;
  body["stream"] = true;
  // The final chunk then carries usage: the server's own token counts.
  body["stream_options"] = {{"include_usage", true}};
  if (server.request_logprobs) {
    // Completions take the number of alternatives (1 is accepted by every
    // server; 0 is not); chat takes a switch.
    if (spec.endpoint == Endpoint::kChat) {
      body["logprobs"] = true;
    } else {
      body["logprobs"] = 1;
    }
  }
  if (server.kind == ServerKind::kRinglane) {
    // Ringlane rejects unknown fields and other servers may too, so its
    // extensions go only to it, and only when they differ from its default.
    if (spec.ignore_eos) body["ignore_eos"] = true;
    if (!spec.loop_watchdog) body["loop_watchdog"] = false;
  }
  if (!server.extra_body.empty()) {
    json extra = json::parse(server.extra_body, nullptr, /*allow_exceptions=*/false);
    if (extra.is_discarded() || !extra.is_object()) {
      return absl::InvalidArgumentError("extra body: not a JSON object");
    }
    body.update(extra);
  }
  return body.dump();
}

absl::StatusOr<std::unique_ptr<ApiClient>> ApiClient::Create(const ServerOptions& server) {
  absl::StatusOr<services::HttpUrl> base = services::ParseHttpUrl(server.base_url);
  if (!base.ok()) return base.status();
  for (const std::string* url : {&server.metrics_url, &server.tokenize_url}) {
    if (url->empty()) continue;
    if (absl::Status s = services::ParseHttpUrl(*url).status(); !s.ok()) return s;
  }
  return std::unique_ptr<ApiClient>(new ApiClient(server, *std::move(base)));
}

absl::StatusOr<services::HttpClient*> ApiClient::ConnectionFor(const services::HttpUrl& url) {
  if (conn_ != nullptr && conn_host_ == url.host && conn_port_ == url.port) return conn_.get();
  conn_.reset();
  absl::StatusOr<std::unique_ptr<services::HttpClient>> c =
      services::HttpClient::Connect(url.host, url.port, server_.connect_timeout);
  if (!c.ok()) return c.status();
  conn_ = *std::move(c);
  conn_host_ = url.host;
  conn_port_ = url.port;
  return conn_.get();
}

void ApiClient::Complete(const RequestSpec& spec, RequestSample* sample) {
  sample->connection_failed = false;
  sample->max_tokens = spec.max_tokens;
  absl::StatusOr<std::string> body = BuildRequestBody(server_, spec);
  if (!body.ok()) {
    sample->error = std::string(body.status().message());
    return;
  }
  services::HttpRequestSpec req;
  req.method = "POST";
  req.target =
      base_.prefix + (spec.endpoint == Endpoint::kChat ? "/chat/completions" : "/completions");
  req.body = *std::move(body);
  req.headers.push_back({"Accept", "text/event-stream"});
  if (!server_.api_key.empty())
    req.headers.push_back({"Authorization", "Bearer " + server_.api_key});

  absl::StatusOr<services::HttpClient*> conn = ConnectionFor(base_);
  if (!conn.ok()) {
    sample->error = std::string(conn.status().message());
    sample->connection_failed = true;
    return;
  }

  // The response's format is read from its first bytes, not its headers:
  // some servers label an event stream application/json, others answer a
  // streamed request with one JSON body.
  enum class Format { kUnknown, kEvents, kWholeJson };
  Format format = Format::kUnknown;
  std::string whole;
  services::SseParser sse;
  StreamAccumulator acc(spec.endpoint, sample);
  const auto t0 = std::chrono::steady_clock::now();
  auto since_ms = [&t0] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  bool any_data = false;
  auto on_data = [&](std::string_view data) {
    // One clock reading per piece: events that arrived together share it.
    const double t = since_ms();
    any_data = true;
    if (format == Format::kUnknown) {
      const size_t first = data.find_first_not_of(" \t\r\n");
      if (first != std::string_view::npos) {
        format = data[first] == '{' || data[first] == '[' ? Format::kWholeJson : Format::kEvents;
      }
    }
    if (format == Format::kWholeJson) {
      whole.append(data);
    } else {
      sse.Feed(data, [&](std::string_view event) { acc.OnEvent(event, t); });
    }
    return true;
  };
  const int64_t retries_before = (*conn)->retries();
  absl::StatusOr<services::HttpResponse> resp =
      (*conn)->Stream(req, on_data, server_.request_timeout);
  const double t_end = since_ms();
  sample->retried = (*conn)->retries() > retries_before;
  if (!resp.ok()) {
    // A broken or timed-out exchange leaves the connection unusable.
    conn_.reset();
    sample->connection_failed = !any_data && absl::IsUnavailable(resp.status());
    if (format == Format::kWholeJson) acc.OnWholeBody(whole, t_end);
    acc.Finish(t_end);
    sample->error = absl::StrCat(absl::StatusCodeToString(resp.status().code()), ": ",
                                 std::string(resp.status().message()));
    return;
  }
  sample->http_status = resp->status;
  if (format == Format::kWholeJson) acc.OnWholeBody(whole, t_end);
  acc.Finish(t_end);
  if (resp->status != 200) {
    sample->error = absl::StrCat("HTTP ", resp->status, ": ", Excerpt(resp->body));
  }
}

absl::StatusOr<services::HttpResponse> ApiClient::Send(const std::string& url,
                                                       const std::string& method,
                                                       const std::string& body) {
  absl::StatusOr<services::HttpUrl> u = services::ParseHttpUrl(url);
  if (!u.ok()) return u.status();
  absl::StatusOr<services::HttpClient*> conn = ConnectionFor(*u);
  if (!conn.ok()) return conn.status();
  services::HttpRequestSpec req;
  req.method = method;
  req.target = u->prefix.empty() ? "/" : u->prefix;
  req.body = body;
  if (!server_.api_key.empty())
    req.headers.push_back({"Authorization", "Bearer " + server_.api_key});
  absl::StatusOr<services::HttpResponse> resp = (*conn)->Send(req, server_.request_timeout);
  if (!resp.ok()) {
    conn_.reset();
    return resp.status();
  }
  if (resp->status != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat(method, " ", url, ": HTTP ", resp->status, ": ", Excerpt(resp->body)));
  }
  return resp;
}

absl::StatusOr<int64_t> ApiClient::CountTokens(const std::string& text) {
  if (server_.tokenize_url.empty()) return absl::FailedPreconditionError("no tokenize URL");
  json body = {{"model", server_.model}, {"prompt", text}};
  absl::StatusOr<services::HttpResponse> resp = Send(server_.tokenize_url, "POST", body.dump());
  if (!resp.ok()) return resp.status();
  json j = json::parse(resp->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("count") && j.at("count").is_number_integer()) {
    return j.at("count").get<int64_t>();
  }
  if (j.is_object() && j.contains("tokens") && j.at("tokens").is_array()) {
    return static_cast<int64_t>(j.at("tokens").size());
  }
  return absl::InvalidArgumentError("tokenize: no count or tokens in " + Excerpt(resp->body));
}

absl::StatusOr<std::vector<std::string>> ApiClient::ListModels() {
  absl::StatusOr<services::HttpResponse> resp = Send(server_.base_url + "/models", "GET", "");
  if (!resp.ok()) return resp.status();
  json j = json::parse(resp->body, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> ids;
  if (j.is_object() && j.contains("data") && j.at("data").is_array()) {
    for (const json& m : j.at("data")) {
      if (m.is_object() && m.contains("id") && m.at("id").is_string()) {
        ids.push_back(m.at("id").get<std::string>());
      }
    }
  }
  if (ids.empty()) return absl::NotFoundError("models: no model ids in " + Excerpt(resp->body));
  return ids;
}

absl::StatusOr<std::string> ApiClient::ScrapeMetrics() {
  if (server_.metrics_url.empty()) return absl::FailedPreconditionError("no metrics URL");
  absl::StatusOr<services::HttpResponse> resp = Send(server_.metrics_url, "GET", "");
  if (!resp.ok()) return resp.status();
  return std::move(resp->body);
}

}  // namespace ringlane::bench
