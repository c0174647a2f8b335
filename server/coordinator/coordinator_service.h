// CoordinatorService: the gRPC face of the Coordinator (proto service
// zshard.v1.Coordinator) that shard 0 serves beside its ShardService. Handlers
// validate and hand over to the Coordinator; each blocks at most until its
// deadline, capped by `wait_timeout`. Thread-safe.
#ifndef ZSHARD_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define ZSHARD_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "common/base/rpc_authorizer.h"
#include "server/coordinator/coordinator.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `coordinator` is not owned and outlives the service.
  // `auth` admits the admin role only (shards' calls).
  CoordinatorService(Coordinator* coordinator, absl::Duration wait_timeout,
                     std::shared_ptr<const RpcAuthorizer> auth)
      : coordinator_(coordinator),
        wait_timeout_(wait_timeout),
        auth_(std::move(auth)) {}

  grpc::Status RegisterShard(grpc::ServerContext* ctx, const v1::RegisterShardRequest* req,
                             v1::RegisterShardResponse* resp) override;
  grpc::Status ExchangeNorm(grpc::ServerContext* ctx, const v1::ExchangeNormRequest* req,
                            v1::ExchangeNormResponse* resp) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext* ctx,
                                const v1::CommitCheckpointRequest* req,
                                v1::CommitCheckpointResponse* resp) override;
  // Snapshots and replacement (see Coordinator).
  grpc::Status ReportSnapshot(grpc::ServerContext* ctx,
                              const v1::ReportSnapshotRequest* req,
                              v1::ReportSnapshotResponse* resp) override;
  grpc::Status PrepareReplace(grpc::ServerContext* ctx,
                              const v1::PrepareReplaceRequest* req,
                              v1::PrepareReplaceResponse* resp) override;
  grpc::Status ShardHeartbeat(grpc::ServerContext* ctx,
                              const v1::ShardHeartbeatRequest* req,
                              v1::ShardHeartbeatResponse* resp) override;

 private:
  Coordinator* const coordinator_;
  const absl::Duration wait_timeout_;
  const std::shared_ptr<const RpcAuthorizer> auth_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
