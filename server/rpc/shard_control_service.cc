#include "server/rpc/shard_control_service.h"

#include <algorithm>

#include "absl/time/time.h"
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
  if (grpc::Status stale =
          CheckCoordinator(req->coordinator_epoch(), "ScheduleCheckpoint");
      !stale.ok()) {
    return stale;
  }
  return ToGrpcStatus(store_->ScheduleCheckpoint(req->step()));
}

grpc::Status ShardControlService::CheckCoordinator(uint64_t epoch,
                                                   const char* method) const {
  if (!options_.channel) return grpc::Status::OK;
  return ToGrpcStatus(options_.channel->CheckCaller(epoch, method));
}

grpc::Status ShardControlService::PrepareAdmit(
    grpc::ServerContext* ctx, const v1::PrepareAdmitRequest* req,
    v1::PrepareAdmitResponse* resp) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "PrepareAdmit");
      !denied.ok()) {
    return denied;
  }
  if (grpc::Status stale =
          CheckCoordinator(req->coordinator_epoch(), "PrepareAdmit");
      !stale.ok()) {
    return stale;
  }
  const absl::Time deadline = std::min(absl::Now() + absl::Seconds(30),
                                       absl::FromChrono(ctx->deadline()));
  auto step = store_->PrepareAdmit(req->trainer_rank(), req->min_step(),
                                   req->identity(), deadline);
  if (!step.ok()) return ToGrpcStatus(step.status());
  resp->set_step(*step);
  return grpc::Status::OK;
}

grpc::Status ShardControlService::AdmitTrainer(
    grpc::ServerContext* ctx, const v1::AdmitTrainerRequest* req,
    v1::AdmitTrainerResponse* /*resp*/) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "AdmitTrainer");
      !denied.ok()) {
    return denied;
  }
  if (grpc::Status stale =
          CheckCoordinator(req->coordinator_epoch(), "AdmitTrainer");
      !stale.ok()) {
    return stale;
  }
  return ToGrpcStatus(store_->Admit(req->trainer_rank(), req->step()));
}

grpc::Status ShardControlService::DropTrainer(
    grpc::ServerContext* ctx, const v1::DropTrainerRequest* req,
    v1::DropTrainerResponse* /*resp*/) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "DropTrainer");
      !denied.ok()) {
    return denied;
  }
  if (grpc::Status stale =
          CheckCoordinator(req->coordinator_epoch(), "DropTrainer");
      !stale.ok()) {
    return stale;
  }
  if (req->trainer_rank() >= store_->options().world_size) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "DropTrainer: trainer_rank out of range");
  }
  store_->DropTrainer(req->trainer_rank(), req->reason());
  return grpc::Status::OK;
}

}  // namespace zshard
