// ShardService's checkpoint RPCs and coordination (DESIGN.md, "Checkpoints"). See shard_service.h.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/shard_service.h"

namespace zshard {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

void ShardService::SetRestored(uint64_t step, std::map<uint32_t, std::string> trainer_states,
                               bool last_step_skipped) {
  restored_ = true;
  restored_last_skipped_ = last_step_skipped;
  restored_step_ = step;
  restored_states_ = std::move(trainer_states);
}

absl::Status ShardService::CommitToCoordinator(const ShardManifest& m, uint32_t crc) {
  if (options_.store.shard_id == 0) {
    if (!checkpoints_) return absl::FailedPreconditionError("checkpoints are off");
    ZS_ASSIGN_OR_RETURN(v1::ModelSpec spec, store_->spec());
    ShardCommit c;
    c.step = m.step;
    c.shard_id = 0;
    c.base_step = m.base_step;
    c.manifest_crc = crc;
    c.bytes_written = m.bytes_written;
    c.trainer_states = m.trainer_states;
    c.last_step_skipped = m.last_step_skipped;
    return checkpoints_->Commit(c, spec);
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
  absl::Status st = FromGrpcStatus(coordinator_stub_->CommitCheckpoint(&ctx, req, &resp));
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("coordinator ", options_.coordinator,
                                                ": ", st.message()));
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
  if (checkpoints_ && checkpoints_->last_complete(&step)) {
    status->set_has_complete(true);
    status->set_last_complete_step(step);
  }
}

grpc::Status ShardService::ScheduleCheckpoint(grpc::ServerContext* /*ctx*/,
                                              const v1::ScheduleCheckpointRequest* req,
                                              v1::ScheduleCheckpointResponse* /*resp*/) {
  return Error(store_->ScheduleCheckpoint(req->step()));
}

grpc::Status ShardService::CommitCheckpoint(grpc::ServerContext* /*ctx*/,
                                            const v1::CommitCheckpointRequest* req,
                                            v1::CommitCheckpointResponse* /*resp*/) {
  if (!checkpoints_) {
    return Error(absl::FailedPreconditionError(
        options_.store.shard_id != 0
            ? "checkpoint commits go to the coordinator (shard 0)"
            : "checkpoints are off on the coordinator (no --checkpoint_dir)"));
  }
  if (req->shard_id() >= options_.store.num_shards) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("checkpoint commit from shard ", req->shard_id(), " of ",
                     options_.store.num_shards)));
  }
  auto spec = store_->spec();
  if (!spec.ok()) return Error(spec.status());
  ShardCommit c;
  c.step = req->step();
  c.shard_id = req->shard_id();
  c.base_step = req->base_step();
  c.manifest_crc = req->manifest_crc32c();
  c.bytes_written = req->bytes_written();
  return Error(checkpoints_->Commit(c, *spec));
}

absl::StatusOr<GlobalManifest> ShardService::TakeCheckpoint(absl::Time deadline) {
  std::vector<std::string> endpoints;
  {
    absl::MutexLock lock(&mu_);
    endpoints = shard_endpoints_;
  }
  for (size_t s = 1; s < endpoints.size(); ++s) {
    if (endpoints[s].empty()) {
      return absl::UnavailableError(absl::StrCat("shard ", s, " has not announced itself"));
    }
  }
  std::vector<std::unique_ptr<v1::ShardService::Stub>> stubs(endpoints.size());
  for (size_t s = 1; s < endpoints.size(); ++s) {
    stubs[s] = v1::ShardService::NewStub(
        grpc::CreateChannel(endpoints[s], grpc::InsecureChannelCredentials()));
  }
  uint64_t floor = 1;
  absl::Status last;
  while (absl::Now() < deadline) {
    // The newest version anywhere: the cluster is at or just before it.
    uint64_t step = floor;
    for (size_t s = 0; s < endpoints.size(); ++s) {
      uint64_t max_v = 0;
      if (s == 0) {
        for (const GroupProgress& p : store_->Progress()) {
          if (p.slice.size() > 0) max_v = std::max(max_v, p.version);
        }
      } else {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        v1::GetStatusResponse st;
        ZS_RETURN_IF_ERROR(FromGrpcStatus(stubs[s]->GetStatus(&ctx, v1::GetStatusRequest(), &st)));
        max_v = st.max_version();
      }
      step = std::max(step, max_v);
    }
    bool accepted = true;
    for (size_t s = 0; s < endpoints.size() && accepted; ++s) {
      if (s == 0) {
        last = store_->ScheduleCheckpoint(step);
      } else {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        v1::ScheduleCheckpointRequest req;
        req.set_step(step);
        v1::ScheduleCheckpointResponse resp;
        last = FromGrpcStatus(stubs[s]->ScheduleCheckpoint(&ctx, req, &resp));
        if (!last.ok()) {
          last = absl::Status(last.code(), absl::StrCat("shard ", s, ": ", last.message()));
        }
      }
      // ABORTED: that shard is mid-step or past `step`; anything else (off,
      // stage 0, unreachable) is final.
      if (!last.ok() && !absl::IsAborted(last)) return last;
      accepted = last.ok();
    }
    if (accepted) return checkpoints_->WaitComplete(step, deadline);
    floor = step + 1;  // someone was mid-step or past it: the next boundary
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no step accepted for a checkpoint before the deadline: ", last.message()));
}

grpc::Status ShardService::RequestCheckpoint(grpc::ServerContext* ctx,
                                             const v1::RequestCheckpointRequest* /*req*/,
                                             v1::RequestCheckpointResponse* resp) {
  if (options_.store.shard_id != 0) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are requested from the coordinator (shard 0)"));
  }
  if (!checkpoints_) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are off (start the servers with --checkpoint_dir)"));
  }
  if (!store_->registered()) {
    return Error(absl::FailedPreconditionError("no model is registered yet"));
  }
  auto g = TakeCheckpoint(Deadline(ctx));
  if (!g.ok()) return Error(g.status());
  resp->set_step(g->step);
  resp->set_base(g->base_step == g->step);
  resp->set_bytes_written(g->bytes_written);
  resp->set_directory(options_.store.checkpoint.root + "/" + StepDirName(g->step));
  return grpc::Status::OK;
}

}  // namespace zshard
