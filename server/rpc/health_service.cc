#include "server/rpc/health_service.h"

namespace zshard {

grpc::Status HealthService::Check(
    grpc::ServerContext* /*ctx*/,
    const grpc::health::v1::HealthCheckRequest* req,
    grpc::health::v1::HealthCheckResponse* resp) {
  if (!req->service().empty() && services_.count(req->service()) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "health: unknown service '" + req->service() + "'");
  }
  resp->set_status(serving_
                       ? grpc::health::v1::HealthCheckResponse::SERVING
                       : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

}  // namespace zshard
