#include "server/checkpoint/shard_restore.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "common/checkpoint/durable_file.h"
#include "zshard/v1/admin.grpc.pb.h"

namespace zshard {

// A fresh cluster must not write into another run's checkpoints.
absl::Status CheckNoCheckpoints(const std::string& root) {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(root);
  if (!steps.ok()) return absl::OkStatus();  // created on first use
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    const std::string manifest =
        root + "/" + StepDirName(*it) + "/" + kGlobalManifestName;
    if (ReadWholeFile(manifest).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint_dir ", root,
          " already holds checkpoints (newest: step ", *it,
          "); resume with --restore=latest, or use an empty directory"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Asks the coordinator which checkpoint it restored, waiting for it to serve.
absl::StatusOr<uint64_t> CoordinatorRestoreStep(const RestoreOptions& options) {
  auto stub =
      v1::AdminService::NewStub(options.peers->Channel(options.coordinator));
  const absl::Time deadline = absl::Now() + options.coordinator_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
    ctx.set_wait_for_ready(true);
    v1::GetStatusResponse resp;
    last = FromGrpcStatus(stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp));
    if (last.ok()) {
      if (!resp.checkpoint().restored()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--restore=latest: the coordinator at ", options.coordinator,
            " did not restore a checkpoint (start shard 0 with --restore "
            "too)"));
      }
      return resp.checkpoint().restored_step();
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat(
      "--restore=latest: could not ask the coordinator at ",
      options.coordinator, " which checkpoint it restored: ", last.message()));
}

// After a restore from `step`, newer checkpoints belong to an abandoned
// timeline: they are moved to ROOT/abandoned-<unix ms>/ so that `latest`
// and the new run's files never mix with them.
absl::Status SetAsideNewer(const std::string& root, uint64_t step) {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(root);
  if (!steps.ok()) return steps.status();
  std::string aside;
  for (uint64_t s : *steps) {
    if (s <= step) continue;
    if (aside.empty()) {
      aside =
          absl::StrCat(root, "/abandoned-", absl::ToUnixMillis(absl::Now()));
      ZS_RETURN_IF_ERROR(MakeDirs(aside));
    }
    const std::string from = root + "/" + StepDirName(s),
                      to = aside + "/" + StepDirName(s);
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot move ", from, " to ", to));
    }
  }
  if (!aside.empty()) {
    std::cerr << "zshard-server: checkpoints newer than step " << step
              << " moved to " << aside << "\n";
    ZS_RETURN_IF_ERROR(SyncDir(root));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoredCheckpoint> RestoreShard(const RestoreOptions& options,
                                                ShardStore& store) {
  const ShardStoreOptions& so = store.options();
  const std::string& root = so.checkpoint.root;
  if (root.empty()) {
    return absl::InvalidArgumentError("--restore needs --checkpoint_dir");
  }
  uint64_t step = 0;
  if (options.what == "latest") {
    if (so.shard_id == 0) {
      std::vector<std::string> refused;
      absl::StatusOr<uint64_t> found =
          FindRestorableCheckpoint(root, UINT64_MAX, &refused);
      for (const std::string& r : refused) {
        std::cerr << "zshard-server: restore: refused " << r << "\n";
      }
      if (!found.ok()) return found.status();
      step = *found;
    } else {
      absl::StatusOr<uint64_t> s = CoordinatorRestoreStep(options);
      if (!s.ok()) return s.status();
      step = *s;
    }
  } else if (!absl::SimpleAtoi(options.what, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--restore: expected 'latest' or a step number, got '",
                     options.what, "'"));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(root, step);
  if (!reader.ok()) return reader.status();
  CheckpointReader& r = **reader;
  if (so.shard_id == 0 && options.what != "latest") {
    absl::Status st = r.VerifyDataFiles();  // "latest" verified it already
    if (!st.ok()) return st;
  }
  if (r.global().world_size != so.world_size && so.shard_id == 0) {
    // The data position is the run's (the step), and every rank's saved
    // state is the run's too: ranks the checkpoint has none for resume from
    // the lowest rank's (ShardService::Join).
    std::cerr << "zshard-server: restore: checkpoint at step " << step
              << " was taken with " << r.global().world_size
              << " trainers; resuming with --trainers=" << so.world_size
              << "\n";
  }
  if (r.global().accumulation_steps != so.accumulation_steps) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint at step ", step,
                     " was taken with gradient_accumulation_steps ",
                     r.global().accumulation_steps, "; the config now says ",
                     so.accumulation_steps));
  }
  const absl::Time start = absl::Now();
  absl::Status st = store.Restore(
      r.spec(), step, [&r](uint32_t g) { return r.applied(g); },
      [&r](uint32_t g, StateArray a, uint64_t begin, uint64_t end, float* out) {
        return r.Read(g, a, begin, end, out);
      });
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("restore of step ", step, ": ", st.message()));
  }
  if (so.shard_id == 0) ZS_RETURN_IF_ERROR(SetAsideNewer(root, step));
  std::cerr << "zshard-server: shard " << so.shard_id << "/" << so.num_shards
            << " restored step " << step << " from " << root << " (written by "
            << r.global().num_shards << " shards; read " << r.bytes_read()
            << " encoded bytes in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s)\n";
  return RestoredCheckpoint{step, r.global().trainer_states,
                            r.global().last_step_skipped,
                            r.global().membership_history};
}

absl::StatusOr<RestoredCheckpoint> RollBackToCheckpoint(
    ShardStore& store, uint64_t step, const std::vector<uint32_t>& ranks,
    const std::string& reason) {
  const std::string& root = store.options().checkpoint.root;
  if (root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", store.options().shard_id,
                     " has no --checkpoint_dir to roll back from"));
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> r,
                      CheckpointReader::Open(root, step));
  ZS_RETURN_IF_ERROR(store.RollBackToCheckpoint(
      r->spec(), step, [&r](uint32_t g) { return r->applied(g); },
      [&r](uint32_t g, StateArray a, uint64_t begin, uint64_t end, float* out) {
        return r->Read(g, a, begin, end, out);
      },
      ranks, reason));
  std::cerr << "zshard-server: shard " << store.options().shard_id
            << ": rolled back to the checkpoint at step " << step << "\n";
  return RestoredCheckpoint{step, r->global().trainer_states,
                            r->global().last_step_skipped,
                            r->global().membership_history};
}

absl::StatusOr<uint64_t> NewestRestorableCheckpoint(const std::string& root) {
  std::vector<std::string> refused;
  absl::StatusOr<uint64_t> found =
      FindRestorableCheckpoint(root, UINT64_MAX, &refused);
  if (found.ok()) return found;
  std::string why;
  for (const std::string& r : refused) absl::StrAppend(&why, "; refused ", r);
  return absl::NotFoundError(absl::StrCat("no intact checkpoint in ", root,
                                          ": ", found.status().message(), why));
}

}  // namespace zshard
