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
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/base/rpc_authorizer.h"
#include "common/transport/transport.h"
#include "server/coordinator/coordinator_channel.h"
#include "server/shard_store.h"
#include "server/snapshot/held_snapshots.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

// What a ShardControlService reaches besides the store (each not owned and
// outliving the service; each may be absent).
struct ShardControlOptions {
  // The other shards' snapshots this shard keeps.
  HeldSnapshots* held = nullptr;
  // The coordinator and the epoch: calls of an older coordinator are
  // refused; a RollBack moves it.
  CoordinatorChannel* channel = nullptr;
  // Runs after a RollBack moved this shard to `epoch` at `step`.
  std::function<void(uint64_t epoch, uint64_t step)> on_rolled_back;
  // Every shard's endpoint as this shard last learned it (ClusterView).
  std::function<std::vector<std::string>()> endpoints;
  // The data plane it reads snapshots over that a sender offers in its
  // memory.
  Transport* transport = nullptr;
};

class ShardControlService final : public v1::ShardControl::Service {
 public:
  // `store` is not owned and outlives this service.
  // `auth` admits the admin role only (the coordinator's calls).
  ShardControlService(ShardStore* store,
                      std::shared_ptr<const RpcAuthorizer> auth,
                      ShardControlOptions options = {})
      : store_(store), auth_(std::move(auth)), options_(std::move(options)) {}

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
  // RollBack: FAILED_PRECONDITION unless it moves this shard to a newer
  // epoch (a replaced coordinator's is refused).
  grpc::Status RollBack(grpc::ServerContext* ctx,
                        const v1::RollBackRequest* req,
                        v1::RollBackResponse* resp) override;
  grpc::Status ClusterView(grpc::ServerContext* ctx,
                           const v1::ClusterViewRequest* req,
                           v1::ClusterViewResponse* resp) override;

 private:
  // OK when the calling coordinator's `epoch` is current (no channel: OK).
  grpc::Status CheckCoordinator(uint64_t epoch, const char* method) const;

  ShardStore* const store_;
  const std::shared_ptr<const RpcAuthorizer> auth_;
  const ShardControlOptions options_;
  // Reads `src` into `s` over the data plane, by `deadline`.
  absl::Status Pull(const v1::SnapshotSource& src, Snapshot* s,
                    absl::Time deadline);
  absl::Mutex pairs_mu_;
  std::map<std::string, std::unique_ptr<Pair>> pairs_
      ABSL_GUARDED_BY(pairs_mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_SHARD_CONTROL_SERVICE_H_
