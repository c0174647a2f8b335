// What the coordinator asks of every shard (coordinator.proto, service
// ShardControl): schedule a checkpoint at a step boundary, and the
// membership's admissions and drops (see server/roster.h).
// Thread-safe; PrepareAdmit waits for the update engine (within the call's
// deadline), the others answer at once.
#ifndef ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_
#define ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_

#include <memory>
#include <utility>

#include "common/base/rpc_authorizer.h"
#include "server/shard_store.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

class ShardControlService final : public v1::ShardControl::Service {
 public:
  // `store` is not owned and outlives this service.
  // `auth` admits the admin role only (the coordinator's calls).
  ShardControlService(ShardStore* store,
                      std::shared_ptr<const RpcAuthorizer> auth)
      : store_(store), auth_(std::move(auth)) {}

  // OK when the step is scheduled or taken already; ABORTED when this shard
  // is mid-step or past it (try a later step); FAILED_PRECONDITION when
  // checkpoints are off or no model is registered.
  grpc::Status ScheduleCheckpoint(
      grpc::ServerContext* ctx, const v1::ScheduleCheckpointRequest* req,
      v1::ScheduleCheckpointResponse* resp) override;
  grpc::Status PrepareAdmit(grpc::ServerContext* ctx,
                            const v1::PrepareAdmitRequest* req,
                            v1::PrepareAdmitResponse* resp) override;
  grpc::Status AdmitTrainer(grpc::ServerContext* ctx,
                            const v1::AdmitTrainerRequest* req,
                            v1::AdmitTrainerResponse* resp) override;
  grpc::Status DropTrainer(grpc::ServerContext* ctx,
                           const v1::DropTrainerRequest* req,
                           v1::DropTrainerResponse* resp) override;

 private:
  ShardStore* const store_;
  const std::shared_ptr<const RpcAuthorizer> auth_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_
