#include "router/api/generate_service.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "services/flags_util.h"
#include "services/log.h"
#include "services/status_grpc.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;
using services::ToGrpcStatus;

GenerateServiceImpl::GenerateServiceImpl(Router* router, ApiKeys keys)
    : router_(router),
      keys_(std::move(keys)),
      requests_(&prometheus::BuildCounter()
                     .Name("ringlane_grpc_requests_total")
                     .Help("gRPC Generate API calls answered, by method and status code")
                     .Register(*router->metrics_registry())) {}

grpc::Status GenerateServiceImpl::Counted(const char* method, grpc::Status status) {
  requests_->Add({{"method", method}, {"code", std::to_string(status.error_code())}}).Increment();
  return status;
}

grpc::Status GenerateServiceImpl::Authenticate(const grpc::ServerContext* ctx) const {
  if (keys_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  std::string value;
  if (it != md.end()) value.assign(it->second.data(), it->second.size());
  absl::StatusOr<std::string> key = keys_.Authenticate(it == md.end() ? nullptr : &value);
  return key.ok() ? grpc::Status::OK : ToGrpcStatus(key.status());
}

grpc::Status GenerateServiceImpl::Generate(grpc::ServerContext* ctx,
                                           const v1::GenerateRequest* request,
                                           grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status a = Authenticate(ctx); !a.ok()) return Counted("Generate", a);
  return Counted("Generate", RunGenerate(ctx, request, writer));
}

grpc::Status GenerateServiceImpl::Tokenize(grpc::ServerContext* ctx,
                                           const v1::TokenizeRequest* request,
                                           v1::TokenizeResponse* response) {
  if (grpc::Status a = Authenticate(ctx); !a.ok()) return Counted("Tokenize", a);
  return Counted("Tokenize", RunTokenize(request, response));
}

grpc::Status GenerateServiceImpl::ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest*,
                                             v1::ListModelsResponse* response) {
  if (grpc::Status a = Authenticate(ctx); !a.ok()) return Counted("ListModels", a);
  return Counted("ListModels", RunListModels(ctx, response));
}

grpc::Status GenerateServiceImpl::RunGenerate(grpc::ServerContext* ctx,
                                              const v1::GenerateRequest* request,
                                              grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<PreparedRequest> p = router_->Prepare(*request);
  if (!p.ok()) return ToGrpcStatus(p.status());
  const std::string id = p->request_id;
  auto queue = std::make_shared<ResponseQueue>();
  if (absl::Status st = router_->Submit(std::move(*p), queue); !st.ok()) {
    return ToGrpcStatus(st);
  }
  std::vector<v1::GenerateResponse> msgs;
  for (;;) {
    absl::Status status;
    msgs.clear();
    const bool done = queue->Take(absl::Milliseconds(20), &msgs, &status);
    for (const v1::GenerateResponse& m : msgs) {
      if (!writer->Write(m)) {
        queue->Cancel();
        RL_LOG(INFO) << "request " << id << ": the client went away";
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    if (done) return ToGrpcStatus(status);
    if (ctx->IsCancelled()) {
      queue->Cancel();
      RL_LOG(INFO) << "request " << id << ": cancelled by the client";
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
  }
}

grpc::Status GenerateServiceImpl::RunTokenize(const v1::TokenizeRequest* request,
                                              v1::TokenizeResponse* response) {
  absl::StatusOr<v1::TokenizeResponse> r = router_->Tokenize(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status GenerateServiceImpl::RunListModels(grpc::ServerContext* ctx,
                                                v1::ListModelsResponse* response) {
  std::vector<GroupState> groups = router_->groups();
  int ready = 0;
  int64_t lanes = 0, waiting = 0, available = 0, total = 0, prefilled = 0;
  for (const GroupState& g : groups) {
    prefilled += g.prefilled_tokens;
    if (!g.ready) continue;
    ++ready;
    lanes += g.lanes;
    waiting += g.waiting;
    available += g.kv.free_blocks + g.kv.evictable_blocks;
    total += g.kv.num_blocks;
  }
  ctx->AddTrailingMetadata("ringlane-active-lanes", std::to_string(lanes));
  ctx->AddTrailingMetadata("ringlane-waiting", std::to_string(waiting));
  ctx->AddTrailingMetadata("ringlane-kv-available-blocks", std::to_string(available));
  ctx->AddTrailingMetadata("ringlane-kv-total-blocks", std::to_string(total));
  ctx->AddTrailingMetadata("ringlane-prefilled-tokens", std::to_string(prefilled));
  std::optional<ModelDescription> m = router_->model();
  if (!m) return grpc::Status::OK;  // nothing known until a group connects
  v1::ModelInfo* info = response->add_models();
  info->set_id(m->model_id);
  info->set_created_unix_s(router_->created_unix_s());
  info->set_owned_by("ringlane");
  info->set_max_context_tokens(m->max_context_tokens);
  info->set_vocab_size(m->vocab_size);
  info->set_num_groups(static_cast<int32_t>(groups.size()));
  info->set_num_ready_groups(ready);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(Router* router,
                                                                  const std::string& listen,
                                                                  ApiKeys keys) {
  std::unique_ptr<RouterServer> s(new RouterServer(router, std::move(keys)));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  b.RegisterService(&s->service_);
  s->server_ = b.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  s->health_thread_ = std::thread([p = s.get()] { p->WatchHealth(); });
  return s;
}

void RouterServer::WatchHealth() {
  int last = -1;
  do {
    const int ready = router_->any_ready() ? 1 : 0;
    if (ready != last) {
      server_->GetHealthCheckService()->SetServingStatus(ready == 1);
      last = ready;
    }
  } while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
}

void RouterServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  stop_.Notify();
  if (health_thread_.joinable()) health_thread_.join();
  if (server_) {
    server_->GetHealthCheckService()->Shutdown();
    server_->Shutdown(deadline);
  }
}

RouterServer::~RouterServer() { Shutdown(std::chrono::system_clock::now()); }

}  // namespace ringlane::router
