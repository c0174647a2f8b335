// ShardStore's checkpoint side (DESIGN.md, "Checkpoints"): restore, and the
// calls the service forwards to the CheckpointStager.
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"
#include "server/shard_store.h"

namespace zshard {

ShardStore::FillFn ShardStore::CheckpointFill(
    const std::function<uint64_t(uint32_t group)>& applied,
    const RestoreReadFn& read) {
  return [applied, read](uint32_t g, const GroupShape& shape,
                         Optimizer::State& s) {
    s.applied = applied(g);
    const Slice& slice = shape.slice;
    if (slice.size() == 0) return absl::OkStatus();
    // The file holds the moments at slice positions; memory keeps the
    // trainable elements only.
    std::vector<float> full(s.m.size() == s.master.size() ? 0 : slice.size());
    std::vector<float>* arrays[kNumStateArrays] = {&s.master, &s.m, &s.v};
    for (int a = 0; a < kNumStateArrays; ++a) {
      std::vector<float>& dst = *arrays[a];
      const bool compact = a != 0 && !full.empty();
      ZS_RETURN_IF_ERROR(read(g, static_cast<StateArray>(a), slice.begin,
                              slice.end, compact ? full.data() : dst.data()));
      if (compact) CompactMoments(shape, full.data(), dst.data());
    }
    return absl::OkStatus();
  };
}

absl::Status ShardStore::Restore(
    const v1::ModelSpec& spec, uint64_t version,
    const std::function<uint64_t(uint32_t group)>& applied,
    const RestoreReadFn& read) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  absl::MutexLock lock(&mu_);
  if (registered_) {
    return absl::FailedPreconditionError(
        "a model is registered already; restore needs a fresh shard");
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(spec, options_.num_shards, options_.alignment,
                           options_.persistence_threshold));
  return InstallLocked(std::move(map), spec, version,
                       CheckpointFill(applied, read));
}

absl::Status ShardStore::RollBackToCheckpoint(
    const v1::ModelSpec& spec, uint64_t step,
    const std::function<uint64_t(uint32_t group)>& applied,
    const RestoreReadFn& read, const std::vector<uint32_t>& ranks,
    const std::string& reason) {
  if (!registered()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id,
                     " has no model to roll back to step ", step));
  }
  if (SpecHash(spec) != spec_hash()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint at step ", step, " is of another model"));
  }
  return RollBackWith(
      step, ranks, reason, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        ZS_ASSIGN_OR_RETURN(
            PartitionMap map,
            PartitionMap::Create(spec_, options_.num_shards, options_.alignment,
                                 options_.persistence_threshold));
        return InstallLocked(std::move(map), spec_, step,
                             CheckpointFill(applied, read));
      });
}

std::string ShardStore::CheckpointSettings() const {
  const CheckpointWriterOptions& c = options_.checkpoint;
  if (c.root.empty()) return "off";
  return absl::StrCat("interval_steps=", options_.checkpoint_interval,
                      " full_every=", c.full_every,
                      " chunk_elements=", c.chunk_elements,
                      " zstd_level=", c.zstd_level);
}

void ShardStore::SetCheckpointCommit(CheckpointWriter::CommitFn commit,
                                     CheckpointWriter::FailFn fail) {
  absl::MutexLock lock(&mu_);
  commit_ = std::move(commit);
  commit_failed_ = std::move(fail);
}

CheckpointWriter* ShardStore::checkpoint_writer() {
  if (!registered()) return nullptr;
  const std::shared_ptr<Model> m = Current();
  return m->stager ? m->stager->writer() : nullptr;
}

void ShardStore::RecordTrainerState(uint32_t rank, uint64_t step,
                                    std::string state) {
  if (!registered()) return;
  const std::shared_ptr<Model> m = Current();
  if (m->keeper) m->keeper->RecordTrainerState(rank, step, state);
  if (m->stager) m->stager->RecordTrainerState(rank, step, std::move(state));
}

absl::Status ShardStore::ScheduleCheckpoint(uint64_t step) {
  if (options_.checkpoint.root.empty() || !registered()) {
    return absl::FailedPreconditionError(
        options_.checkpoint.root.empty()
            ? "checkpoints are off on this shard (start zshard-server with "
              "--checkpoint_dir)"
            : "no model is registered yet");
  }
  if (options_.sum_only) {
    return absl::FailedPreconditionError(
        "checkpoints need ZeRO stage 1-3: at stage 0 the trainers hold the "
        "optimizer state");
  }
  // On the engine, between updates: the versions it compares and the state
  // it may stage do not move meanwhile.
  const std::shared_ptr<Model> m = Current();
  return m->engine->Run(
      [m, step] { return m->stager->Schedule(step); },
      absl::Now() + options_.decision_timeout);
}

}  // namespace zshard
