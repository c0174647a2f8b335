// MetricsServer: a shard's HTTP telemetry port (--metrics_listen):
// /metrics (Prometheus text, prometheus_text.h) on every shard; on shard 0
// also the status page (/ and /status, status_page.h) and /status.json,
// which asks the other shards for their status (admin GetStatus over the
// shard's peer credentials, 1 s each). With tokens configured every path
// needs the admin token as "Authorization: Bearer <token>" (401 otherwise).
// Thread-safe; stopped by the destructor.
#ifndef ZSHARD_SERVER_METRICS_METRICS_SERVER_H_
#define ZSHARD_SERVER_METRICS_METRICS_SERVER_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/rpc_authorizer.h"
#include "server/coordinator/coordinator.h"
#include "server/metrics/http_server.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/shard_service.h"
#include "zshard/v1/admin.grpc.pb.h"

namespace zshard {

class MetricsServer {
 public:
  // `admin`, `shard` and (shard 0; else null) `coordinator` are not owned
  // and outlive the server. Errors as HttpServer::Start's, naming
  // --metrics_listen.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, AdminService* admin, ShardService* shard,
      Coordinator* coordinator, std::shared_ptr<const RpcAuthorizer> auth);

  int port() const { return http_->port(); }

 private:
  MetricsServer() = default;
  HttpResponse Metrics() const;
  HttpResponse Status();
  // A peer's admin stub, made once per endpoint.
  v1::AdminService::Stub* Peer(const std::string& endpoint);

  AdminService* admin_ = nullptr;
  ShardService* shard_ = nullptr;
  Coordinator* coordinator_ = nullptr;
  std::shared_ptr<const RpcAuthorizer> auth_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::AdminService::Stub>> peers_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HttpServer> http_;  // last: stopped first
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_METRICS_METRICS_SERVER_H_
