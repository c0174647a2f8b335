// What the coordinator asks of every shard (coordinator.proto, service
// ShardControl): schedule a checkpoint at a step boundary, and the
// membership's admissions and drops (see server/roster.h).
// Thread-safe; PrepareAdmit waits for the update engine (within the call's
// deadline), the others answer at once.
#ifndef ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_
#define ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/base/rpc_authorizer.h"
#include "common/transport/transport.h"
#include "server/shard_store.h"
#include "server/snapshot/held_snapshots.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

class ShardControlService final : public v1::ShardControl::Service {
 public:
  // `store` is not owned and outlives this service.
  // `auth` admits the admin role only (the coordinator's calls).
  // `held` (not owned, outlives the service) keeps the other shards'
  // snapshots; `on_epoch` learns the epoch and step a RollBack moves to;
  // over `transport` (not owned, outlives the service) it reads snapshots
  // that a sender offers in its memory.
  ShardControlService(
      ShardStore* store, std::shared_ptr<const RpcAuthorizer> auth,
      HeldSnapshots* held = nullptr,
      std::function<void(uint64_t epoch, uint64_t step)> on_epoch = nullptr,
      Transport* transport = nullptr)
      : store_(store),
        auth_(std::move(auth)),
        held_(held),
        on_epoch_(std::move(on_epoch)),
        transport_(transport) {}

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

  // Snapshots (shard_control_snapshot.cc). PutSnapshot: a neighbour's
  // snapshot, header first (INVALID_ARGUMENT for one that does not add up,
  // names another cluster's shape or this shard, or stops short; nothing is
  // kept then). FetchSnapshot: NOT_FOUND when not held. RollBack: see
  // ShardStore::RollBack.
  grpc::Status PutSnapshot(grpc::ServerContext* ctx,
                           grpc::ServerReader<v1::SnapshotChunk>* reader,
                           v1::PutSnapshotResponse* resp) override;
  grpc::Status FetchSnapshot(
      grpc::ServerContext* ctx, const v1::FetchSnapshotRequest* req,
      grpc::ServerWriter<v1::SnapshotChunk>* writer) override;
  grpc::Status SnapshotInventory(grpc::ServerContext* ctx,
                                 const v1::SnapshotInventoryRequest* req,
                                 v1::SnapshotInventoryResponse* resp) override;
  grpc::Status RollBack(grpc::ServerContext* ctx,
                        const v1::RollBackRequest* req,
                        v1::RollBackResponse* resp) override;

 private:
  ShardStore* const store_;
  const std::shared_ptr<const RpcAuthorizer> auth_;
  HeldSnapshots* const held_;
  const std::function<void(uint64_t epoch, uint64_t step)> on_epoch_;
  Transport* const transport_;
  // Reads `src` into `s` over the data plane, by `deadline`.
  absl::Status Pull(const v1::SnapshotSource& src, Snapshot* s,
                    absl::Time deadline);
  absl::Mutex pairs_mu_;
  std::map<std::string, std::unique_ptr<Pair>> pairs_
      ABSL_GUARDED_BY(pairs_mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_
