#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"

namespace zshard {

grpc::Status CoordinatorService::RegisterShard(
    grpc::ServerContext* ctx, const v1::RegisterShardRequest* req,
    v1::RegisterShardResponse* resp) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "RegisterShard");
      !denied.ok()) {
    return denied;
  }
  if (!req->replacement()) {
    resp->set_epoch(coordinator_->epoch());
    return ToGrpcStatus(coordinator_->RegisterShard(
        req->shard_id(), req->num_shards(), req->endpoint(),
        req->checkpoint_settings()));
  }
  // Checks what a first registration checks, then replaces.
  const absl::Time deadline =
      std::min(absl::Now() + wait_timeout_, absl::FromChrono(ctx->deadline()));
  auto epoch = coordinator_->ReplaceShard(req->shard_id(), req->endpoint(),
                                          req->replaced_at_step(),
                                          req->from_checkpoint(), deadline);
  if (!epoch.ok()) return ToGrpcStatus(epoch.status());
  resp->set_epoch(*epoch);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportSnapshot(
    grpc::ServerContext* ctx, const v1::ReportSnapshotRequest* req,
    v1::ReportSnapshotResponse* /*resp*/) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "ReportSnapshot");
      !denied.ok()) {
    return denied;
  }
  const absl::Time deadline =
      std::min(absl::Now() + wait_timeout_, absl::FromChrono(ctx->deadline()));
  const absl::Status failed =
      req->failed() ? absl::UnavailableError(req->error().substr(0, 1024))
                    : absl::OkStatus();
  return ToGrpcStatus(coordinator_->ReportSnapshot(
      req->shard_id(), req->step(), req->epoch(), deadline, failed));
}

grpc::Status CoordinatorService::PrepareReplace(
    grpc::ServerContext* ctx, const v1::PrepareReplaceRequest* req,
    v1::PrepareReplaceResponse* resp) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "PrepareReplace");
      !denied.ok()) {
    return denied;
  }
  const absl::Time deadline = std::min(absl::Now() + absl::Seconds(10),
                                       absl::FromChrono(ctx->deadline()));
  auto r = coordinator_->PrepareReplace(req->shard_id(), req->num_shards(),
                                        deadline);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *r;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ShardHeartbeat(
    grpc::ServerContext* ctx, const v1::ShardHeartbeatRequest* req,
    v1::ShardHeartbeatResponse* resp) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "ShardHeartbeat");
      !denied.ok()) {
    return denied;
  }
  auto r = coordinator_->ShardHeartbeat(req->shard_id(), req->endpoint(),
                                        req->epoch());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *r;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ExchangeNorm(
    grpc::ServerContext* ctx, const v1::ExchangeNormRequest* req,
    v1::ExchangeNormResponse* resp) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "ExchangeNorm");
      !denied.ok()) {
    return denied;
  }
  const absl::Time deadline =
      std::min(absl::Now() + wait_timeout_, absl::FromChrono(ctx->deadline()));
  auto t = coordinator_->CollectNorm(req->step(), req->shard_id(),
                                     req->sum_squares(), req->non_finite(),
                                     deadline);
  if (!t.ok()) return ToGrpcStatus(t.status());
  resp->set_sum_squares(t->sum_squares);
  resp->set_non_finite(t->non_finite);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CommitCheckpoint(
    grpc::ServerContext* ctx, const v1::CommitCheckpointRequest* req,
    v1::CommitCheckpointResponse* /*resp*/) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "CommitCheckpoint");
      !denied.ok()) {
    return denied;
  }
  ShardCommit c;
  c.step = req->step();
  c.shard_id = req->shard_id();
  c.base_step = req->base_step();
  c.manifest_crc = req->manifest_crc32c();
  c.bytes_written = req->bytes_written();
  if (req->error_code() != 0) {
    if (req->error_code() < 0 || req->error_code() > 16) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("error_code ", req->error_code(),
                                       " is not a status code"));
    }
    c.error = absl::Status(static_cast<absl::StatusCode>(req->error_code()),
                           req->error_message());
  }
  return ToGrpcStatus(coordinator_->CommitCheckpoint(c));
}

}  // namespace zshard
