// grpc.health.v1.Health/Check for one shard, as a sync service (see
// proto/zshard/v1/health.proto for why not gRPC's own). SERVING for the
// whole server ("") and for each zshard service it hosts until
// SetNotServing; NOT_FOUND naming any other service. Watch is UNIMPLEMENTED.
// Thread-safe; Check never blocks.
#ifndef ZSHARD_SERVER_RPC_HEALTH_SERVICE_H_
#define ZSHARD_SERVER_RPC_HEALTH_SERVICE_H_

#include <atomic>
#include <set>
#include <string>

#include "zshard/v1/health.grpc.pb.h"

namespace zshard {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // `services`: the fully qualified names this server hosts.
  explicit HealthService(std::set<std::string> services)
      : services_(std::move(services)) {}

  // From now on Check answers NOT_SERVING (the server is shutting down).
  void SetNotServing() { serving_ = false; }

  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;

 private:
  const std::set<std::string> services_;
  std::atomic<bool> serving_{true};
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_HEALTH_SERVICE_H_
