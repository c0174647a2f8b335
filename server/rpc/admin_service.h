// The operators' gRPC face of one shard (admin.proto): GetStatus on every
// shard, RequestCheckpoint on shard 0, which hands it to the Coordinator it
// hosts. Reads what the shard's ShardService and store expose; changes
// nothing but (RequestCheckpoint) the checkpoint schedule.
// Thread-safe; handlers run on gRPC's threads; RequestCheckpoint blocks at
// most until its deadline (capped by the shard's wait_timeout).
#ifndef ZSHARD_SERVER_RPC_ADMIN_SERVICE_H_
#define ZSHARD_SERVER_RPC_ADMIN_SERVICE_H_

#include <functional>
#include <utility>

#include "server/rpc/shard_service.h"
#include "zshard/v1/admin.grpc.pb.h"

namespace zshard {

class AdminService final : public v1::AdminService::Service {
 public:
  // `shard` is not owned and outlives this service.
  explicit AdminService(ShardService* shard) : shard_(shard) {}
  // Adds what the shard server knows of snapshots (held copies, epoch) to
  // GetStatus. Set before serving.
  void SetSnapshotStatus(std::function<void(v1::SnapshotStatus*)> fill) {
    fill_snapshots_ = std::move(fill);
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx,
                         const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status ReadValues(grpc::ServerContext* ctx,
                          const v1::ReadValuesRequest* req,
                          v1::ReadValuesResponse* resp) override;
  // What GetStatus answers (also the metrics' source). Thread-safe.
  void FillStatus(v1::GetStatusResponse* resp) const;
  grpc::Status RequestCheckpoint(grpc::ServerContext* ctx,
                                 const v1::RequestCheckpointRequest* req,
                                 v1::RequestCheckpointResponse* resp) override;

 private:
  void FillCheckpointStatus(v1::CheckpointStatus* status) const;

  ShardService* const shard_;
  std::function<void(v1::SnapshotStatus*)> fill_snapshots_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_ADMIN_SERVICE_H_
