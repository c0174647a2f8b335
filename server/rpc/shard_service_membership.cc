// ShardService's membership handlers (shard 0 only): heartbeats, admission
// and leaving, answered by the coordinator's Membership.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "server/rpc/shard_service.h"

namespace zshard {
namespace {

absl::StatusOr<Coordinator*> CoordinatorFor(Coordinator* c, const char* what) {
  if (!c) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": trainers' membership is kept by shard 0 (the coordinator)"));
  }
  return c;
}

// ABORTED when the cluster rolled back since the trainer of `req` joined.
absl::Status CheckJoinedEpoch(const Coordinator& c,
                              const v1::HeartbeatRequest& req) {
  const uint64_t now = c.epoch();
  if (req.epoch() >= now) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("the cluster rolled back since trainer rank ",
                   req.trainer_rank(), " joined (epoch ", req.epoch(), ", now ",
                   now, "); this trainer must join again"));
}

}  // namespace

grpc::Status ShardService::Heartbeat(grpc::ServerContext* ctx,
                                     const v1::HeartbeatRequest* req,
                                     v1::HeartbeatResponse* /*resp*/) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Heartbeat");
      !denied.ok()) {
    return denied;
  }
  auto c = CoordinatorFor(options_.coordinator_host, "Heartbeat");
  if (!c.ok()) return ToGrpcStatus(c.status());
  absl::Status st =
      (*c)->membership().Heartbeat(req->trainer_rank(), req->instance_id());
  if (st.ok()) Touch(req->trainer_rank());
  if (st.ok()) st = CheckJoinedEpoch(**c, *req);
  return ToGrpcStatus(st);
}

absl::Status ShardService::Vouch(uint32_t rank, uint64_t instance) {
  if (instance == 0 || !options_.coordinator_host) return absl::OkStatus();
  absl::Status st =
      options_.coordinator_host->membership().Heartbeat(rank, instance);
  if (st.ok()) Touch(rank);
  return st;
}

absl::StatusOr<std::string> ShardService::AnswerHeartbeatCall(
    const std::string& header) {
  v1::HeartbeatCall call;
  if (!call.ParseFromString(header)) {
    return absl::InvalidArgumentError(
        "a heartbeat call over the transport does not parse as a "
        "HeartbeatCall");
  }
  if (!options_.coordinator_host) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", options_.store.shard_id,
        " does not keep the membership (shard 0, the coordinator, does)"));
  }
  const v1::HeartbeatRequest& req = call.request();
  ZS_RETURN_IF_ERROR(
      CheckCallToken(req.trainer_rank(), call.token(), "heartbeat"));
  ZS_RETURN_IF_ERROR(Vouch(req.trainer_rank(), req.instance_id()));
  ZS_RETURN_IF_ERROR(CheckJoinedEpoch(*options_.coordinator_host, req));
  return v1::HeartbeatResponse().SerializeAsString();
}

grpc::Status ShardService::Admit(grpc::ServerContext* ctx,
                                 const v1::AdmitRequest* req,
                                 v1::AdmitResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Admit");
      !denied.ok()) {
    return denied;
  }
  auto c = CoordinatorFor(options_.coordinator_host, "Admit");
  if (!c.ok()) return ToGrpcStatus(c.status());
  auto step = (*c)->membership().Admit(req->trainer_rank(), req->instance_id(),
                                       Deadline(ctx));
  if (!step.ok()) return ToGrpcStatus(step.status());
  resp->set_start_step(*step);
  return grpc::Status::OK;
}

grpc::Status ShardService::Leave(grpc::ServerContext* ctx,
                                 const v1::LeaveRequest* req,
                                 v1::LeaveResponse* /*resp*/) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Leave");
      !denied.ok()) {
    return denied;
  }
  auto c = CoordinatorFor(options_.coordinator_host, "Leave");
  if (!c.ok()) return ToGrpcStatus(c.status());
  return ToGrpcStatus((*c)->membership().Leave(
      req->trainer_rank(), req->instance_id(), req->reason()));
}

}  // namespace zshard
