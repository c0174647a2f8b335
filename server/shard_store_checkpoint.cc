// ShardStore's checkpoint side (DESIGN.md, "Checkpoints"): trainer resume
// states, scheduling, staging groups for the writer, and restore.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "common/status_macros.h"
#include "server/shard_store.h"

namespace zshard {

absl::Status ShardStore::Restore(const v1::ModelSpec& spec, uint64_t version,
                                 const std::function<uint64_t(uint32_t group)>& applied,
                                 const RestoreReadFn& read) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  absl::MutexLock lock(&mu_);
  if (registered_) {
    return absl::FailedPreconditionError("a model is registered already; restore needs a fresh shard");
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  ZS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<GroupState>> groups, MakeGroups(map, spec));
  for (auto& gp : groups) {
    GroupState& g = *gp;
    absl::MutexLock glock(&g.mu);
    std::vector<float>* arrays[kNumStateArrays] = {&g.master, &g.m, &g.v};
    for (int a = 0; a < kNumStateArrays; ++a) {
      if (g.slice.size() == 0) continue;
      ZS_RETURN_IF_ERROR(read(g.index, static_cast<StateArray>(a), g.slice.begin,
                              g.slice.end, arrays[a]->data()));
    }
    g.version = version;
    g.applied = applied(g.index);
  }
  ZS_RETURN_IF_ERROR(InstallLocked(std::move(map), spec, std::move(groups)));
  if (writer_) writer_->SkipStepsUpTo(version);  // the checkpoint restored is there
  absl::MutexLock step_lock(&step_mu_);
  barrier_.step = version;
  return absl::OkStatus();
}

std::string ShardStore::CheckpointSettings() const {
  const CheckpointWriterOptions& c = options_.checkpoint;
  if (c.root.empty()) return "off";
  return absl::StrCat("interval_steps=", options_.checkpoint_interval, " full_every=",
                      c.full_every, " chunk_elements=", c.chunk_elements,
                      " zstd_level=", c.zstd_level);
}

void ShardStore::SetCheckpointCommit(CheckpointWriter::CommitFn commit) {
  absl::MutexLock lock(&ckpt_mu_);
  commit_ = std::move(commit);
}

void ShardStore::RecordTrainerState(uint32_t rank, uint64_t step, std::string state) {
  if (rank >= options_.world_size) return;
  absl::MutexLock lock(&ckpt_mu_);
  auto& states = trainer_states_[rank];
  states[step] = std::move(state);
  while (states.size() > 4) states.erase(states.begin());
}

bool ShardStore::IsCheckpointStep(uint64_t version) {
  if (options_.checkpoint_interval > 0 && version % options_.checkpoint_interval == 0) {
    return true;
  }
  absl::MutexLock lock(&ckpt_mu_);
  return scheduled_.count(version) > 0;
}

void ShardStore::MaybeStageLocked(GroupState& g, bool skipped) {
  if (!writer_) return;
  {
    absl::MutexLock lock(&ckpt_mu_);
    step_skipped_[g.version] = skipped;
    while (step_skipped_.size() > 8) step_skipped_.erase(step_skipped_.begin());
  }
  if (g.slice.size() == 0 || g.version == 0 || !IsCheckpointStep(g.version)) return;
  absl::Status st = writer_->StageGroup(g.version, g.index, g.master.data(), g.m.data(),
                                        g.v.data(), g.version, g.applied,
                                        absl::Now() + options_.decision_timeout);
  if (!st.ok() && !absl::IsAlreadyExists(st)) {
    std::cerr << "zshard-server: shard " << options_.shard_id << ": " << st.message() << "\n";
  }
}

absl::Status ShardStore::ScheduleCheckpoint(uint64_t step) {
  if (!writer_ || options_.checkpoint.root.empty()) {
    return absl::FailedPreconditionError(
        options_.checkpoint.root.empty()
            ? "checkpoints are off on this shard (start zshard-server with --checkpoint_dir)"
            : "no model is registered yet");
  }
  if (options_.sum_only) {
    return absl::FailedPreconditionError(
        "checkpoints need ZeRO stage 1-3: at stage 0 the trainers hold the optimizer state");
  }
  // Every group's lock, in index order (no other path holds two).
  std::vector<std::unique_ptr<absl::MutexLock>> locks;
  for (const auto& g : groups_) locks.push_back(std::make_unique<absl::MutexLock>(&g->mu));
  bool all_at_step = true, any_past = false, quiet = true;
  for (const auto& g : groups_) {
    if (g->slice.size() == 0) continue;
    all_at_step &= g->version == step;
    any_past |= g->version >= step;
    for (uint64_t r : g->received) quiet &= r == 0;
  }
  if (writer_->last_step() == step) return absl::OkStatus();  // taken already
  if (all_at_step && quiet && step > 0) {
    for (const auto& g : groups_) {
      if (g->slice.size() == 0) continue;
      absl::Status st = writer_->StageGroup(step, g->index, g->master.data(), g->m.data(),
                                            g->v.data(), g->version, g->applied,
                                            absl::Now() + options_.decision_timeout);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (any_past) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has groups at or past step ", step,
        "; schedule a later step"));
  }
  absl::MutexLock lock(&ckpt_mu_);
  scheduled_.insert(step);
  while (scheduled_.size() > 64) scheduled_.erase(scheduled_.begin());
  return absl::OkStatus();
}

}  // namespace zshard
