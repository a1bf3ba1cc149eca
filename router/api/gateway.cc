#include "router/api/gateway.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "router/request/errors.h"
#include "router/request/prepare.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;
using nlohmann::json;
using openai::ApiError;

namespace {

constexpr std::string_view kJson = "application/json";

// Text exposition from nlohmann::json. Router text is valid UTF-8 by
// construction; `replace` keeps a stray byte from throwing mid-stream.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError Error(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

// Holds one of a key's concurrent-request slots for a handler's lifetime.
class KeySlot {
 public:
  KeySlot(absl::Mutex* mu, std::map<std::string, int>* counts, std::string key)
      : mu_(mu), counts_(counts), key_(std::move(key)) {}
  ~KeySlot() { Release(); }
  // Gives the slots back before the handler ends: once its choices are
  // finished, before the last bytes go out, so a client that sends its next
  // request the moment it has read this response never finds them taken.
  void Release() {
    if (weight_ == 0) return;
    absl::MutexLock l(mu_);
    if (((*counts_)[key_] -= weight_) <= 0) counts_->erase(key_);
    weight_ = 0;
  }
  // Takes `weight` slots (at least one request's worth may always run
  // alone, however heavy: the per-request caps bound it).
  bool Acquire(int limit, int weight) {
    absl::MutexLock l(mu_);
    int& n = (*counts_)[key_];
    if (limit > 0 && n > 0 && n + weight > limit) {
      if (n == 0) counts_->erase(key_);
      return false;
    }
    n += weight;
    weight_ = weight;
    return true;
  }

 private:
  absl::Mutex* mu_;
  std::map<std::string, int>* counts_;
  std::string key_;
  int weight_ = 0;
};

// Holds a gauge up for a scope, whatever way the scope is left.
class GaugeHold {
 public:
  explicit GaugeHold(prometheus::Gauge* g) : g_(g) { g_->Increment(); }
  ~GaugeHold() { g_->Decrement(); }
  GaugeHold(const GaugeHold&) = delete;
  GaugeHold& operator=(const GaugeHold&) = delete;

 private:
  prometheus::Gauge* g_;
};

}  // namespace

Gateway::Gateway(Router* router, GatewayOptions options)
    : router_(router), options_(std::move(options)), keys_(options_.api_keys) {
  prometheus::Registry& r = *router_->metrics_registry();
  http_requests_ = &prometheus::BuildCounter()
                        .Name("ringlane_http_requests_total")
                        .Help("HTTP requests answered by the gateway, by endpoint and status")
                        .Register(r);
  http_in_flight_ = &prometheus::BuildGauge()
                         .Name("ringlane_http_requests_in_flight")
                         .Help("HTTP requests being handled now")
                         .Register(r)
                         .Add({});
  client_disconnects_ = &prometheus::BuildCounter()
                             .Name("ringlane_http_client_disconnects_total")
                             .Help("Generation requests whose client went away before the end")
                             .Register(r)
                             .Add({});
  auto generate = [this](openai::Endpoint e) -> Handler {
    return [this, e](const HttpRequest& r, HttpResponder& o, const std::string& key) {
      return Generate(e, r, o, key);
    };
  };
  const Handler tokenize = [this](const HttpRequest& r, HttpResponder& o, const std::string&) {
    return Tokenize(r, o);
  };
  const Handler detokenize = [this](const HttpRequest& r, HttpResponder& o, const std::string&) {
    return Detokenize(r, o);
  };
  routes_ = {
      {"/metrics", {"GET", [this](auto&, HttpResponder& o, auto&) { return Metrics(o); }}},
      {"/v1/models", {"GET", [this](auto&, HttpResponder& o, auto&) { return Models(o); }}},
      {"/v1/completions", {"POST", generate(openai::Endpoint::kCompletions)}},
      {"/v1/chat/completions", {"POST", generate(openai::Endpoint::kChatCompletions)}},
      {"/tokenize", {"POST", tokenize}},
      {"/v1/tokenize", {"POST", tokenize}},
      {"/detokenize", {"POST", detokenize}},
      {"/v1/detokenize", {"POST", detokenize}},
  };
}

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(Router* router, GatewayOptions options) {
  std::unique_ptr<Gateway> g(new Gateway(router, options));
  HttpServerOptions so;
  so.listen = options.listen;
  so.max_body_bytes = options.max_body_bytes;
  so.max_connections = options.max_connections;
  so.idle_timeout = options.idle_timeout;
  so.first_byte_timeout = options.first_byte_timeout;
  so.max_connections_per_peer = options.max_connections_per_peer;
  so.error_body = [](int status, std::string_view message) {
    ApiError e = Error(status, status == 413 ? "invalid_request_error" : "server_error",
                       std::string(message));
    if (status < 500) e.type = "invalid_request_error";
    return openai::ErrorJson(e);
  };
  Gateway* self = g.get();
  auto server = HttpServer::Start(
      std::move(so),
      [self](const HttpRequest& req, HttpResponder& out) { self->Handle(req, out); });
  if (!server.ok()) return server.status();
  g->server_ = std::move(*server);
  return g;
}

Gateway::~Gateway() { Shutdown(absl::Now()); }

void Gateway::Drain(absl::Time deadline) {
  BeginDrain();
  while (generating_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  Shutdown(deadline);
}

void Gateway::Shutdown(absl::Time deadline) {
  draining_.store(true);
  if (server_) server_->Shutdown(deadline);
}

int Gateway::SendError(HttpResponder& out, const ApiError& e) {
  HttpHeaders h;
  if (e.status == 429 || e.status == 503)
    h.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
  out.Send(e.status, kJson, openai::ErrorJson(e), h);
  return e.status;
}

void Gateway::Handle(const HttpRequest& req, HttpResponder& out) {
  std::string endpoint = "other";
  int status = 500;
  {
    // A handler that throws (the HTTP server catches it) must not leave the
    // gauge up.
    GaugeHold in_flight(http_in_flight_);
    Route(req, out, &endpoint, &status);
  }
  http_requests_->Add({{"endpoint", endpoint}, {"status", std::to_string(status)}}).Increment();
}

absl::StatusOr<std::string> Gateway::Authenticate(const HttpRequest& req) const {
  const std::string auth = req.Header("authorization");
  return keys_.Authenticate(auth.empty() ? nullptr : &auth);
}

void Gateway::Route(const HttpRequest& req, HttpResponder& out, std::string* endpoint,
                    int* status) {
  const std::string& path = req.path;
  if (path == "/health") {
    *endpoint = path;
    // Liveness: answered by the HTTP thread, whatever the engine is doing.
    out.Send(200, kJson, R"({"status":"ok"})");
    *status = 200;
    return;
  }
  if (path == "/ready") {
    *endpoint = path;
    const bool ready = !draining_.load() && router_->any_ready();
    json j = {{"ready", ready},
              {"status", draining_.load() ? "draining"
                         : ready          ? "ready"
                                          : "no worker group is ready"}};
    *status = ready ? 200 : 503;
    out.Send(*status, kJson, Dump(j));
    return;
  }
  auto route = routes_.find(path);
  if (route != routes_.end()) *endpoint = path;
  std::string key;
  if (path != "/metrics" || options_.metrics_require_key) {
    absl::StatusOr<std::string> k = Authenticate(req);
    if (!k.ok()) {
      *status = SendError(out, openai::ErrorFromStatus(k.status()));
      return;
    }
    key = std::move(*k);
  }
  if (route == routes_.end()) {
    *status = SendError(out, Error(404, "not_found_error", absl::StrCat("no route ", path)));
  } else if (req.method != route->second.method) {
    *status = SendError(
        out, Error(405, "invalid_request_error",
                   absl::StrCat("use ", std::string(route->second.method), " for ", path)));
  } else {
    *status = route->second.handle(req, out, key);
  }
}

int Gateway::Metrics(HttpResponder& out) {
  const std::string text =
      prometheus::TextSerializer().Serialize(router_->metrics_registry()->Collect());
  out.Send(200, "text/plain; version=0.0.4; charset=utf-8", text);
  return 200;
}

int Gateway::Models(HttpResponder& out) {
  json data = json::array();
  if (std::optional<ModelDescription> m = router_->model()) {
    data.push_back({{"id", m->model_id},
                    {"object", "model"},
                    {"created", router_->created_unix_s()},
                    {"owned_by", "ringlane"},
                    {"max_model_len", m->max_context_tokens}});
  }
  out.Send(200, kJson, Dump({{"object", "list"}, {"data", std::move(data)}}));
  return 200;
}

int Gateway::Tokenize(const HttpRequest& req, HttpResponder& out) {
  absl::StatusOr<v1::TokenizeRequest> r = openai::ParseTokenizeRequest(req.body, options_.limits);
  if (!r.ok()) return SendError(out, openai::ErrorFromStatus(r.status()));
  absl::StatusOr<v1::TokenizeResponse> t = router_->Tokenize(*r);
  if (!t.ok()) return SendError(out, openai::ErrorFromStatus(t.status()));
  json j = {{"tokens", t->token_ids()},
            {"count", t->token_ids_size()},
            {"max_model_len", t->max_context_tokens()}};
  out.Send(200, kJson, Dump(j));
  return 200;
}

int Gateway::Detokenize(const HttpRequest& req, HttpResponder& out) {
  auto r = openai::ParseDetokenizeRequest(req.body, options_.limits);
  if (!r.ok()) return SendError(out, openai::ErrorFromStatus(r.status()));
  std::optional<ModelDescription> m = router_->model();
  if (!r->first.empty() && m && r->first != m->model_id) {
    return SendError(out, openai::ErrorFromStatus(UnknownModelError(r->first, m->model_id)));
  }
  absl::StatusOr<std::string> text = router_->tokenizer().Decode(r->second);
  if (!text.ok()) {
    return SendError(
        out, openai::ErrorFromStatus(FieldError("tokens", std::string(text.status().message()))));
  }
  out.Send(200, kJson, Dump({{"prompt", openai::ValidUtf8(*text)}}));
  return 200;
}

int Gateway::Generate(openai::Endpoint endpoint, const HttpRequest& req, HttpResponder& out,
                      const std::string& key) {
  if (draining_.load()) {
    return SendError(out, Error(503, "service_unavailable_error",
                                "the router is shutting down; retry on another replica"));
  }
  const std::string client_id = req.Header("x-request-id");
  if (!client_id.empty()) {
    // Checked before anything is queued: the id is echoed in a response
    // header, where CR/LF would inject headers and 70 KB would fail the
    // write after the lanes were submitted.
    if (absl::Status st = CheckRequestId("X-Request-Id", client_id, options_.max_request_id_bytes);
        !st.ok()) {
      return SendError(out, openai::ErrorFromStatus(st));
    }
  }
  const std::string session_header = req.Header("x-session-id");
  // The workers' sampling bounds, as they advertised them in GetInfo: the
  // parser names the OpenAI field that exceeds one.
  openai::RequestLimits limits = options_.limits;
  if (std::optional<ModelDescription> m = router_->model()) {
    limits.max_top_logprobs = m->limits.max_top_logprobs();
    limits.max_abs_logit_bias = m->limits.max_abs_logit_bias();
  }
  absl::StatusOr<openai::ParsedRequest> parsed =
      openai::ParseRequest(endpoint, req.body, session_header, limits);
  if (!parsed.ok()) return SendError(out, openai::ErrorFromStatus(parsed.status()));
  generating_.fetch_add(1);
  struct Done {
    std::atomic<int>* n;
    ~Done() { n->fetch_sub(1); }
  } done_guard{&generating_};
  const int choices = static_cast<int>(parsed->prompts.size()) * parsed->n;
  // Without API keys, clients are told apart by address: one busy client
  // must not use up everyone's allowance.
  const std::string slot_key = !key.empty()
                                   ? absl::StrCat("key:", key)
                                   : absl::StrCat("peer:", req.peer.substr(0, req.peer.rfind(':')));
  KeySlot slot(&mu_, &running_per_key_, slot_key);
  if (!slot.Acquire(options_.max_concurrent_per_key, choices)) {
    return SendError(
        out,
        Error(429, "rate_limit_error",
              absl::StrCat("this API key (or client address, without keys) already has choices in "
                           "progress; at most ",
                           options_.max_concurrent_per_key,
                           " at once (--max_concurrent_per_key counts prompts x n)"),
              "rate_limit_exceeded"));
  }
  std::vector<PreparedRequest> prepared;
  for (size_t i = 0; i < parsed->prompts.size(); ++i) {
    v1::GenerateRequest& g = parsed->prompts[i];
    if (g.request_id().empty() && !client_id.empty()) {
      g.set_request_id(parsed->prompts.size() == 1 ? client_id : absl::StrCat(client_id, "-", i));
    }
    absl::StatusOr<PreparedRequest> p = router_->Prepare(g);
    if (!p.ok()) {
      ApiError e = openai::ErrorFromStatus(p.status());
      if (parsed->prompts.size() > 1 && e.status == 400) {
        e.message = absl::StrCat("prompt[", i, "]: ", e.message);
      }
      return SendError(out, e);
    }
    prepared.push_back(std::move(*p));
  }
  if (parsed->logprobs && !parsed->stream) {
    int64_t entries = 0;
    for (const PreparedRequest& p : prepared) {
      entries += int64_t{p.n} * p.max_tokens * (parsed->top_logprobs + 1);
    }
    if (entries > options_.max_buffered_logprobs) {
      return SendError(
          out, Error(400, "invalid_request_error",
                     absl::StrCat("logprobs: up to ", entries,
                                  " logprob entries (choices x max_tokens x (top_logprobs + 1)) "
                                  "would be held for one response; at most ",
                                  options_.max_buffered_logprobs,
                                  " unless stream is true (or ask for fewer max_tokens)")));
    }
  }
  const std::string request_id = prepared.front().request_id;
  if (!parsed->user.empty()) {
    RL_LOG(DEBUG) << "request " << request_id << " from user '" << parsed->user << "'";
  }
  // Every queue of the request wakes this one handler: it sleeps until any
  // of them has news (or a client check is due), never polling each.
  auto notifier = std::make_shared<ResponseNotifier>();
  std::vector<std::shared_ptr<ResponseQueue>> queues;
  auto cancel_all = [&queues] {
    for (auto& q : queues) q->Cancel();
  };
  // However the handler ends (a finished request, a client gone, a throw
  // while writing), its lanes do not outlive it. Cancelling a finished
  // queue does nothing.
  struct CancelOnExit {
    std::vector<std::shared_ptr<ResponseQueue>>* queues;
    ~CancelOnExit() {
      for (auto& q : *queues) q->Cancel();
    }
  } cancel_on_exit{&queues};
  for (PreparedRequest& p : prepared) {
    auto q = std::make_shared<ResponseQueue>(notifier);
    if (absl::Status st = router_->Submit(std::move(p), q); !st.ok()) {
      cancel_all();
      return SendError(out, openai::ErrorFromStatus(st));
    }
    queues.push_back(std::move(q));
  }

  const bool chat = endpoint == openai::Endpoint::kChatCompletions;
  const std::string served = router_->model() ? router_->model()->model_id : parsed->model;
  // Chat output is parsed for tool calls when tools are offered, and split
  // into reasoning and answer when the template opens a <think> block.
  std::optional<ToolParserOptions> output;
  const ChatTemplate& tmpl = router_->chat_template();
  const bool tools_on = !parsed->tools.is_null() && parsed->tool_choice != "none";
  if (chat && (tools_on || tmpl.reasoning())) {
    output.emplace();
    output->format = tmpl.tool_format();
    output->reasoning = tmpl.reasoning();
    if (tools_on) {
      for (const auto& t : parsed->tools) {
        const auto& fn = t["function"];
        output->tool_parameters[fn["name"].get<std::string>()] =
            json(fn.value("parameters", nlohmann::ordered_json()));
      }
    }
  }
  openai::ResponseBuilder builder(*parsed, absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id),
                                  absl::ToUnixSeconds(absl::Now()), served,
                                  static_cast<int>(queues.size()), router_->tokenizer(),
                                  std::move(output));
  const HttpHeaders headers = {{"X-Request-Id", request_id}};
  auto send_event = [&out](const json& j) { return out.Write("data: " + Dump(j) + "\n\n"); };
  auto gone = [&] {
    cancel_all();
    client_disconnects_->Increment();
    RL_LOG(INFO) << "request " << request_id << ": the client went away; its lanes are freed";
    return 499;  // nginx's "client closed request": nothing more was sent
  };

  if (parsed->stream) {
    if (!out.StartStream(200, "text/event-stream",
                         {{"Cache-Control", "no-cache"}, {"X-Request-Id", request_id}})) {
      return gone();
    }
    for (const json& c : builder.OpeningChunks()) {
      if (!send_event(c)) return gone();
    }
  }
  std::vector<bool> done(queues.size(), false);
  size_t left = queues.size();
  absl::Status failure;
  std::vector<v1::GenerateResponse> msgs;
  uint64_t seen = 0;
  while (left > 0) {
    // Taken before draining, so news that lands while draining wakes the wait.
    seen = notifier->events();
    for (size_t i = 0; i < queues.size(); ++i) {
      if (done[i]) continue;
      msgs.clear();
      absl::Status st;
      const bool finished = queues[i]->Take(absl::ZeroDuration(), &msgs, &st);
      for (const v1::GenerateResponse& m : msgs) {
        std::vector<json> chunks = builder.Add(static_cast<int>(i), m);
        if (!parsed->stream) continue;
        for (const json& c : chunks) {
          if (!send_event(c)) return gone();
        }
      }
      if (finished) {
        done[i] = true;
        --left;
        if (!st.ok() && failure.ok()) failure = st;
      }
    }
    if (!failure.ok()) break;
    if (out.ClientGone()) return gone();
    if (left > 0) notifier->Wait(&seen, absl::Milliseconds(20));
  }
  if (!failure.ok()) {
    cancel_all();
    slot.Release();
    ApiError e = openai::ErrorFromStatus(failure);
    RL_LOG(WARNING) << "request " << request_id << " failed: " << failure;
    if (!parsed->stream) return SendError(out, e);
    // Headers are out: the error travels as an event, as OpenAI's does.
    json j = json::parse(openai::ErrorJson(e));
    send_event(j);
    out.Write("data: [DONE]\n\n");
    out.EndStream();
    return 200;
  }
  slot.Release();
  if (!parsed->stream) {
    out.Send(200, kJson, Dump(builder.Final()), headers);
    return 200;
  }
  if (parsed->include_usage && !send_event(builder.UsageChunk())) return gone();
  if (!out.Write("data: [DONE]\n\n")) return gone();
  out.EndStream();
  return 200;
}

}  // namespace ringlane::router
