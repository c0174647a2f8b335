#include "server/metrics/metrics_server.h"

#include <grpcpp/grpcpp.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "server/metrics/prometheus_text.h"
#include "server/metrics/status_page.h"

namespace zshard {
namespace {

HttpResponse Unauthorized() {
  HttpResponse r;
  r.status = 401;
  r.body =
      "this server has tokens: send the admin token as 'Authorization: "
      "Bearer <token>'\n";
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, AdminService* admin, ShardService* shard,
    Coordinator* coordinator, std::shared_ptr<const RpcAuthorizer> auth) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->admin_ = admin;
  m->shard_ = shard;
  m->coordinator_ = coordinator;
  m->auth_ = std::move(auth);
  MetricsServer* self = m.get();
  auto guarded = [self](std::function<HttpResponse()> f) {
    return [self, f](const HttpRequest& req) {
      if (!self->auth_->AdmitsAdmin(req.authorization)) return Unauthorized();
      return f();
    };
  };
  std::map<std::string, HttpServer::Handler> handlers;
  handlers["/metrics"] = guarded([self] { return self->Metrics(); });
  if (coordinator) {
    auto page = guarded([] {
      HttpResponse r;
      r.content_type = "text/html; charset=utf-8";
      r.body = StatusPageHtml();
      return r;
    });
    handlers["/"] = page;
    handlers["/status"] = page;
    handlers["/status.json"] = guarded([self] { return self->Status(); });
  }
  auto http =
      HttpServer::Start(listen, std::move(handlers), "--metrics_listen");
  if (!http.ok()) return http.status();
  m->http_ = std::move(*http);
  return m;
}

HttpResponse MetricsServer::Metrics() const {
  v1::GetStatusResponse status;
  admin_->FillStatus(&status);
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = PrometheusText(status, coordinator_ ? &shard_->history() : nullptr,
                          ReadProcessUsage());
  return r;
}

v1::AdminService::Stub* MetricsServer::Peer(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  auto& stub = peers_[endpoint];
  if (!stub) {
    stub =
        v1::AdminService::NewStub(auth_->PeerCredentials()->Channel(endpoint));
  }
  return stub.get();
}

HttpResponse MetricsServer::Status() {
  const std::vector<std::string> endpoints = coordinator_->ShardEndpoints();
  std::vector<ShardView> views(endpoints.size());
  for (size_t s = 0; s < endpoints.size(); ++s) {
    ShardView& v = views[s];
    v.shard_id = static_cast<uint32_t>(s);
    v.endpoint = endpoints[s];
    v1::GetStatusResponse status;
    if (s == 0) {
      admin_->FillStatus(&status);
      v.status = std::move(status);
      continue;
    }
    if (endpoints[s].empty()) {
      v.status = absl::UnavailableError("has not announced itself");
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    absl::Status st = FromGrpcStatus(
        Peer(endpoints[s])->GetStatus(&ctx, v1::GetStatusRequest(), &status));
    if (st.ok()) {
      v.status = std::move(status);
    } else {
      v.status = st;
    }
  }
  HttpResponse r;
  r.content_type = "application/json";
  r.body = StatusJson(views, shard_->history().Points(), absl::Now());
  return r;
}

}  // namespace zshard
