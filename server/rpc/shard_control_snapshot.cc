// ShardControl's snapshot methods (issue 16): the buddy side of in-memory
// snapshots and the rollback the coordinator orders.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "server/checkpoint/shard_restore.h"
#include "server/rpc/shard_control_service.h"
#include "server/snapshot/snapshot_wire.h"

namespace zshard {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

}  // namespace

grpc::Status ShardControlService::PutSnapshot(
    grpc::ServerContext* ctx, grpc::ServerReader<v1::SnapshotChunk>* reader,
    v1::PutSnapshotResponse* /*resp*/) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "PutSnapshot");
      !denied.ok()) {
    return denied;
  }
  if (!options_.held) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this shard holds no snapshots");
  }
  v1::SnapshotChunk chunk;
  if (!reader->Read(&chunk) || !chunk.has_header()) {
    return Invalid("PutSnapshot: the first message must carry the header");
  }
  const v1::SnapshotHeader& h = chunk.header();
  const ShardStoreOptions& o = store_->options();
  if (h.shard_id() == o.shard_id || h.shard_id() >= o.num_shards) {
    return Invalid(absl::StrCat("PutSnapshot: shard id ", h.shard_id(),
                                " is not another shard of ", o.num_shards));
  }
  const PartitionMap* map = store_->partition_map();
  if (!map) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "PutSnapshot: no model is registered here");
  }
  if (absl::Status st =
          CheckSnapshotHeader(h, h.shard_id(), o.num_shards, map->num_groups());
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  if (h.spec_hash() != store_->spec_hash()) {
    return Invalid("PutSnapshot: the snapshot is of another model");
  }
  if (options_.channel && h.epoch() < options_.channel->epoch()) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "PutSnapshot: shard ", h.shard_id(), "'s snapshot of step ", h.step(),
        " is of epoch ", h.epoch(), " but this shard is at epoch ",
        options_.channel->epoch(),
        " (the sender was replaced or the cluster "
        "rolled back since)")));
  }
  std::shared_ptr<Snapshot> s = options_.held->Begin(h);
  absl::Status st;
  if (chunk.has_source()) {
    const absl::Time deadline = std::min(absl::Now() + absl::Seconds(60),
                                         absl::FromChrono(ctx->deadline()));
    st = Pull(chunk.source(), s.get(), deadline);
  } else {
    st = ReadSnapshotData(chunk, s.get());
    while (st.ok() && reader->Read(&chunk)) {
      st = ReadSnapshotData(chunk, s.get());
    }
  }
  if (!st.ok()) return ToGrpcStatus(st);
  if (!s->complete()) {
    return Invalid(absl::StrCat("PutSnapshot: the stream stopped after ",
                                s->filled, " of ", h.total_floats(),
                                " values"));
  }
  options_.held->Keep(std::move(s));
  return grpc::Status::OK;
}

absl::Status ShardControlService::Pull(const v1::SnapshotSource& src,
                                       Snapshot* s, absl::Time deadline) {
  const uint64_t bytes = s->header.total_floats() * sizeof(float);
  if (!options_.transport) {
    return absl::FailedPreconditionError(
        "PutSnapshot: this shard has no data plane to read the snapshot over");
  }
  if (src.region().size() < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PutSnapshot: the source region holds ",
                     src.region().size(), " bytes, the header says ", bytes));
  }
  const RemoteRegion region{src.region().address(), src.region().size(),
                            src.region().key()};
  absl::MutexLock lock(&pairs_mu_);  // one pull at a time per buddy anyway
  std::unique_ptr<Pair>& pair = pairs_[src.transport_address()];
  if (!pair) {
    auto p = options_.transport->Connect(src.transport_address());
    if (!p.ok()) {
      pairs_.erase(src.transport_address());
      return p.status();
    }
    pair = std::move(*p);
  }
  constexpr uint64_t kPiece = 64 << 20;
  std::vector<std::shared_ptr<Request>> gets;
  char* out = reinterpret_cast<char*>(s->values());
  for (uint64_t off = 0; off < bytes; off += kPiece) {
    auto get = pair->Get(out + off, std::min(kPiece, bytes - off), region, off);
    if (!get.ok()) {
      pairs_.erase(src.transport_address());
      return get.status();
    }
    gets.push_back(std::move(*get));
  }
  absl::Status st = pair->Wait(gets, deadline);
  if (!st.ok()) {
    pairs_.erase(src.transport_address());  // closed on failure
    return st;
  }
  s->filled = s->header.total_floats();
  return absl::OkStatus();
}

grpc::Status ShardControlService::FetchSnapshot(
    grpc::ServerContext* ctx, const v1::FetchSnapshotRequest* req,
    grpc::ServerWriter<v1::SnapshotChunk>* writer) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "FetchSnapshot");
      !denied.ok()) {
    return denied;
  }
  std::shared_ptr<const Snapshot> s =
      options_.held ? options_.held->Get(req->shard_id(), req->step())
                    : nullptr;
  if (!s) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("shard ", store_->options().shard_id,
                     " holds no snapshot of shard ", req->shard_id(),
                     " at step ", req->step()));
  }
  return ToGrpcStatus(WriteSnapshot(
      *s, [writer](const v1::SnapshotChunk& c) { return writer->Write(c); }));
}

grpc::Status ShardControlService::SnapshotInventory(
    grpc::ServerContext* ctx, const v1::SnapshotInventoryRequest* /*req*/,
    v1::SnapshotInventoryResponse* resp) {
  if (grpc::Status denied =
          auth_->Check(*ctx, RpcRole::kAdmin, "SnapshotInventory");
      !denied.ok()) {
    return denied;
  }
  for (uint64_t step : store_->OwnSnapshotSteps()) resp->add_own_steps(step);
  for (const Roster::Member& m : store_->roster().Members()) {
    resp->add_member_ranks(m.rank);
  }
  if (options_.held) {
    for (const auto& [shard, step] : options_.held->Inventory()) {
      v1::HeldSnapshot* h = resp->add_held();
      h->set_shard_id(shard);
      h->set_step(step);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ShardControlService::RollBack(grpc::ServerContext* ctx,
                                           const v1::RollBackRequest* req,
                                           v1::RollBackResponse* /*resp*/) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "RollBack");
      !denied.ok()) {
    return denied;
  }
  if (options_.channel && req->epoch() <= options_.channel->epoch()) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "RollBack to epoch ", req->epoch(), ": this shard is at epoch ",
        options_.channel->epoch(), " with the coordinator at ",
        options_.channel->endpoint(), " (the caller was replaced)")));
  }
  std::vector<uint32_t> ranks(req->trainer_ranks().begin(),
                              req->trainer_ranks().end());
  for (uint32_t r : ranks) {
    if (r >= store_->options().world_size) {
      return Invalid(
          absl::StrCat("RollBack: trainer rank ", r, " out of range"));
    }
  }
  if (req->roster_only()) {
    store_->ResetRoster(ranks, req->step());
  } else if (req->from_checkpoint()) {
    if (absl::Status st =
            RollBackToCheckpoint(*store_, req->step(), ranks, req->reason())
                .status();
        !st.ok()) {
      return ToGrpcStatus(st);
    }
  } else if (absl::Status st =
                 store_->RollBack(req->step(), ranks, req->reason());
             !st.ok()) {
    return ToGrpcStatus(st);
  }
  if (options_.channel)
    options_.channel->Advance(req->epoch(), req->coordinator());
  if (options_.on_rolled_back)
    options_.on_rolled_back(req->epoch(), req->step());
  return grpc::Status::OK;
}

grpc::Status ShardControlService::ClusterView(
    grpc::ServerContext* ctx, const v1::ClusterViewRequest* /*req*/,
    v1::ClusterViewResponse* resp) {
  if (grpc::Status denied = auth_->Check(*ctx, RpcRole::kAdmin, "ClusterView");
      !denied.ok()) {
    return denied;
  }
  resp->set_shard_id(store_->options().shard_id);
  resp->set_num_shards(store_->options().num_shards);
  if (options_.channel) {
    resp->set_epoch(options_.channel->epoch());
    resp->set_coordinator(options_.channel->endpoint());
  }
  bool every_endpoint = options_.endpoints != nullptr;
  if (options_.endpoints) {
    for (const std::string& e : options_.endpoints()) {
      resp->add_endpoints(e);
      every_endpoint = every_endpoint && !e.empty();
    }
  }
  resp->set_running(store_->registered() && every_endpoint &&
                    resp->endpoints_size() > 0);
  return grpc::Status::OK;
}

}  // namespace zshard
