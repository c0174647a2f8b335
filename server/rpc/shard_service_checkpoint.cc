// ShardService's checkpoint coordination: restore state and commits to the
// coordinator (DESIGN.md, "Checkpoints"). See shard_service.h.
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "server/rpc/shard_service.h"

namespace zshard {

void ShardService::SetRestored(uint64_t step,
                               std::map<uint32_t, std::string> trainer_states,
                               bool last_step_skipped) {
  absl::MutexLock lock(&mu_);
  restored_ = true;
  restored_last_skipped_ = last_step_skipped;
  restored_step_ = step;
  restored_states_ = std::move(trainer_states);
}

absl::Status ShardService::CommitToCoordinator(const ShardManifest& m,
                                               uint32_t crc) {
  ShardCommit c;
  c.step = m.step;
  c.shard_id = options_.store.shard_id;
  c.base_step = m.base_step;
  c.manifest_crc = crc;
  c.bytes_written = m.bytes_written;
  c.trainer_states = m.trainer_states;
  c.last_step_skipped = m.last_step_skipped;
  return SendCommit(c);
}

absl::Status ShardService::SendCommit(const ShardCommit& c) {
  if (Coordinator* coordinator = options_.coordinator_host) {
    return coordinator->CommitCheckpoint(c);
  }
  auto stub = CoordinatorStub();
  if (!stub) {
    return absl::FailedPreconditionError("no coordinator address to report to");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.wait_timeout));
  v1::CommitCheckpointRequest req;
  req.set_step(c.step);
  req.set_shard_id(c.shard_id);
  req.set_base_step(c.base_step);
  req.set_manifest_crc32c(c.manifest_crc);
  req.set_bytes_written(c.bytes_written);
  req.set_error_code(static_cast<int32_t>(c.error.code()));
  req.set_error_message(std::string(c.error.message()));
  v1::CommitCheckpointResponse resp;
  absl::Status st = FromGrpcStatus(stub->CommitCheckpoint(&ctx, req, &resp));
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("coordinator ", CoordinatorEndpoint(), ": ",
                                st.message()));
  }
  return st;
}

void ShardService::ReportCheckpointFailure(uint64_t step,
                                           const absl::Status& error) {
  ShardCommit c;
  c.step = step;
  c.shard_id = options_.store.shard_id;
  c.error = error;
  absl::Status st = SendCommit(c);
  if (!st.ok()) {
    std::cerr << "zshard-server: shard " << c.shard_id
              << ": could not tell the coordinator that checkpoint step "
              << step << " failed: " << st.message() << "\n";
  }
}

absl::Status ShardService::DrainCheckpoints(absl::Time deadline) {
  CheckpointWriter* writer = store_->checkpoint_writer();
  if (writer == nullptr) return absl::OkStatus();
  uint64_t abandoned = 0;
  absl::Status st = writer->Drain(deadline, &abandoned);
  if (abandoned > 0) {
    ReportCheckpointFailure(
        abandoned, absl::AbortedError(absl::StrCat(
                       "shard ", options_.store.shard_id,
                       " stopped before its state at step ", abandoned,
                       " was staged")));
  }
  return st;
}

}  // namespace zshard
