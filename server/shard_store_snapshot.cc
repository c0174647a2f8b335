// ShardStore's in-memory snapshots (issue 16, "Shards: replacement from a
// peer's memory"): the keeper's copies, a rollback to one of them, and a
// replacement's restore from the buddy's copy.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"
#include "server/shard_store.h"

namespace zshard {

void ShardStore::SetSnapshotSend(SnapshotKeeper::SendFn send,
                                 SnapshotKeeper::SkipFn skip,
                                 std::function<void(uint64_t)> prepared) {
  absl::MutexLock lock(&mu_);
  snapshot_send_ = std::move(send);
  snapshot_skip_ = std::move(skip);
  snapshot_prepared_ = std::move(prepared);
}

std::vector<uint64_t> ShardStore::OwnSnapshotSteps() const {
  if (!registered()) return {};
  const std::shared_ptr<Model> m = Current();
  return m->keeper ? m->keeper->OwnSteps() : std::vector<uint64_t>{};
}

std::shared_ptr<const Snapshot> ShardStore::OwnSnapshot(uint64_t step) const {
  if (!registered()) return nullptr;
  const std::shared_ptr<Model> m = Current();
  return m->keeper ? m->keeper->Own(step) : nullptr;
}

SnapshotStats ShardStore::SnapshotStatistics() const {
  if (!registered()) return {};
  const std::shared_ptr<Model> m = Current();
  return m->keeper ? m->keeper->stats() : SnapshotStats{};
}

uint64_t ShardStore::rollbacks() const {
  absl::MutexLock lock(&mu_);
  return rollbacks_;
}

absl::Status ShardStore::InstallSnapshotLocked(const v1::ModelSpec& spec,
                                               const Snapshot& snap) {
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  ZS_RETURN_IF_ERROR(CheckSnapshotHeader(
      snap.header, options_.shard_id, options_.num_shards, map.num_groups()));
  if (snap.header.spec_hash() != SpecHash(spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the snapshot of step ", snap.step(), " of shard ",
                     options_.shard_id, " is of another model"));
  }
  if (!snap.complete()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the snapshot of step ", snap.step(), " is incomplete (", snap.filled,
        " of ", snap.header.total_floats(), " values)"));
  }
  const FillFn fill = [&snap](uint32_t g, const GroupShape&,
                              Optimizer::State& s) {
    return snap.CopyTo(g, s);
  };
  return InstallLocked(std::move(map), spec, snap.step(), fill);
}

absl::Status ShardStore::RestoreSnapshot(const v1::ModelSpec& spec,
                                         const Snapshot& snap) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  absl::MutexLock lock(&mu_);
  if (registered_) {
    return absl::FailedPreconditionError(
        "a model is registered already; a replacement needs a fresh shard");
  }
  return InstallSnapshotLocked(spec, snap);
}

void ShardStore::ResetRoster(const std::vector<uint32_t>& ranks,
                             uint64_t step) {
  roster_->Reset(ranks, step);
}

absl::Status ShardStore::RollBack(uint64_t step,
                                  const std::vector<uint32_t>& ranks,
                                  const std::string& reason) {
  if (!registered()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id,
                     " has no model to roll back to step ", step));
  }
  const std::shared_ptr<Model> old = Current();
  if (!old->keeper) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id,
        " keeps no snapshots (zshard_fault_tolerance.snapshot_interval_steps "
        "is 0)"));
  }
  const std::shared_ptr<const Snapshot> snap = old->keeper->Own(step);
  if (!snap) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " keeps no snapshot of step ", step,
        " (it keeps steps ", absl::StrJoin(old->keeper->OwnSteps(), ","), ")"));
  }
  return RollBackWith(step, ranks, reason,
                      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                        return InstallSnapshotLocked(spec_, *snap);
                      });
}

absl::Status ShardStore::RollBackWith(
    uint64_t step, const std::vector<uint32_t>& ranks,
    const std::string& reason, const std::function<absl::Status()>& install) {
  const std::shared_ptr<Model> old = Current();
  absl::MutexLock lock(&mu_);
  rolled_back_ =
      absl::StrCat("shard ", options_.shard_id, " rolled back to step ", step,
                   " (", reason, "); the trainer must join again");
  old->retired.store(true, std::memory_order_release);
  if (old->keeper)
    old->keeper->Abandon();  // a staging wait on the engine ends now
  old->engine->Stop();
  const uint64_t last_checkpoint =
      old->stager ? old->stager->writer()->last_step() : 0;
  roster_->Reset(ranks, step);
  absl::Status st = install();
  if (!st.ok()) {
    // The state of this model: only memory or the checkpoint's files can
    // fail here.
    return absl::InternalError(absl::StrCat("shard ", options_.shard_id,
                                            " could not roll back to step ",
                                            step, ": ", st.message()));
  }
  const std::shared_ptr<Model> now = Current();
  if (now->stager && last_checkpoint > step) {
    now->stager->writer()->SkipStepsUpTo(last_checkpoint);
  }
  ++rollbacks_;
  return absl::OkStatus();
}

}  // namespace zshard
