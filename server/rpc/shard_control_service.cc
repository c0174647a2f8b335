#include "server/rpc/shard_control_service.h"

#include "common/base/grpc_status.h"

namespace zshard {

grpc::Status ShardControlService::ScheduleCheckpoint(
    grpc::ServerContext* ctx, const v1::ScheduleCheckpointRequest* req,
    v1::ScheduleCheckpointResponse* /*resp*/) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "ScheduleCheckpoint");
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(store_->ScheduleCheckpoint(req->step()));
}

}  // namespace zshard
