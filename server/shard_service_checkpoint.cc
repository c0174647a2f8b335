// ShardService's checkpoint RPCs and coordination (DESIGN.md, "Checkpoints").
// See shard_service.h.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "server/shard_service.h"

namespace zshard {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

void ShardService::SetRestored(uint64_t step,
                               std::map<uint32_t, std::string> trainer_states,
                               bool last_step_skipped) {
  restored_ = true;
  restored_last_skipped_ = last_step_skipped;
  restored_step_ = step;
  restored_states_ = std::move(trainer_states);
}

absl::Status ShardService::CommitToCoordinator(const ShardManifest& m,
                                               uint32_t crc) {
  if (Coordinator* coordinator = options_.coordinator_host) {
    ShardCommit c;
    c.step = m.step;
    c.shard_id = 0;
    c.base_step = m.base_step;
    c.manifest_crc = crc;
    c.bytes_written = m.bytes_written;
    c.trainer_states = m.trainer_states;
    c.last_step_skipped = m.last_step_skipped;
    return coordinator->CommitCheckpoint(c);
  }
  if (!coordinator_stub_) {
    return absl::FailedPreconditionError("no coordinator address to report to");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.wait_timeout));
  v1::CommitCheckpointRequest req;
  req.set_step(m.step);
  req.set_shard_id(options_.store.shard_id);
  req.set_base_step(m.base_step);
  req.set_manifest_crc32c(crc);
  req.set_bytes_written(m.bytes_written);
  v1::CommitCheckpointResponse resp;
  absl::Status st =
      FromGrpcStatus(coordinator_stub_->CommitCheckpoint(&ctx, req, &resp));
  if (!st.ok()) {
    return absl::Status(
        st.code(),
        absl::StrCat("coordinator ", options_.coordinator, ": ", st.message()));
  }
  return st;
}

void ShardService::FillCheckpointStatus(v1::CheckpointStatus* status) {
  status->set_enabled(!options_.store.checkpoint.root.empty());
  status->set_restored(restored_);
  status->set_restored_step(restored_step_);
  if (CheckpointWriter* w = store_->checkpoint_writer()) {
    const CheckpointWriteStats st = w->last_stats();
    status->set_writes_completed(w->writes_completed());
    status->set_last_written_step(st.step);
    status->set_last_bytes_written(st.bytes_written);
    status->set_last_stall_seconds(st.stall_seconds);
    status->set_last_write_seconds(st.write_seconds);
    status->set_last_error(std::string(w->last_error().message()));
  }
  uint64_t step = 0;
  if (options_.coordinator_host &&
      options_.coordinator_host->LastComplete(&step)) {
    status->set_has_complete(true);
    status->set_last_complete_step(step);
  }
}

grpc::Status ShardService::ScheduleCheckpoint(
    grpc::ServerContext* /*ctx*/, const v1::ScheduleCheckpointRequest* req,
    v1::ScheduleCheckpointResponse* /*resp*/) {
  return Error(store_->ScheduleCheckpoint(req->step()));
}

grpc::Status ShardService::RequestCheckpoint(
    grpc::ServerContext* ctx, const v1::RequestCheckpointRequest* /*req*/,
    v1::RequestCheckpointResponse* resp) {
  if (!options_.coordinator_host) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are requested from the coordinator (shard 0)"));
  }
  if (!options_.coordinator_host->checkpoints_on()) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are off (start the servers with --checkpoint_dir)"));
  }
  if (!store_->registered()) {
    return Error(absl::FailedPreconditionError("no model is registered yet"));
  }
  auto g = options_.coordinator_host->TakeCheckpoint(Deadline(ctx));
  if (!g.ok()) return Error(g.status());
  resp->set_step(g->step);
  resp->set_base(g->base_step == g->step);
  resp->set_bytes_written(g->bytes_written);
  resp->set_directory(options_.store.checkpoint.root + "/" +
                      StepDirName(g->step));
  return grpc::Status::OK;
}

}  // namespace zshard
