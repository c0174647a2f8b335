#include "server/checkpoint/checkpoint_stager.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace zshard {

CheckpointStager::CheckpointStager(const CheckpointStagerOptions& options,
                                   const Optimizer* optimizer)
    : options_(options),
      optimizer_(optimizer),
      trainer_states_(options.world_size) {}

absl::StatusOr<std::unique_ptr<CheckpointStager>> CheckpointStager::Create(
    const CheckpointStagerOptions& options, const Optimizer* optimizer,
    CheckpointWriter::CommitFn commit, CheckpointWriter::FailFn fail) {
  std::unique_ptr<CheckpointStager> s(new CheckpointStager(options, optimizer));
  CheckpointWriterOptions o = options.checkpoint;
  o.shard_id = options.shard_id;
  o.num_shards = options.num_shards;
  std::vector<StagedGroupShape> shapes;
  for (uint32_t g = 0; g < optimizer->num_groups(); ++g) {
    const Slice& slice = optimizer->shape(g).slice;
    shapes.push_back({slice.begin, slice.size()});
  }
  CheckpointStager* self = s.get();
  ZS_ASSIGN_OR_RETURN(
      s->writer_, CheckpointWriter::Create(
                      o, std::move(shapes), std::move(commit),
                      [self](uint64_t step) { return self->ResumeFor(step); },
                      std::move(fail)));
  return s;
}

CheckpointWriter::TrainerResume CheckpointStager::ResumeFor(uint64_t step) {
  CheckpointWriter::TrainerResume out;
  absl::MutexLock lock(&mu_);
  if (step > 0) out.states = trainer_states_.At(step - 1);
  auto s = step_skipped_.find(step);
  out.last_step_skipped = s != step_skipped_.end() && s->second;
  return out;
}

void CheckpointStager::RecordTrainerState(uint32_t rank, uint64_t step,
                                          std::string state) {
  absl::MutexLock lock(&mu_);
  trainer_states_.Record(rank, step, std::move(state));
}

bool CheckpointStager::IsCheckpointStep(uint64_t version) {
  if (options_.interval > 0 && version % options_.interval == 0) return true;
  absl::MutexLock lock(&mu_);
  return scheduled_.count(version) > 0;
}

absl::Status CheckpointStager::Stage(uint64_t step, uint32_t group) {
  absl::Status st;
  const GroupShape& shape = optimizer_->shape(group);
  optimizer_->Read(group, [&](const Optimizer::State& s) {
    const float* m = s.m.data();
    const float* v = s.v.data();
    // The file holds the moments at their slice positions (0 where frozen),
    // whatever the server keeps in memory.
    std::vector<float> m_full, v_full;
    if (s.m.size() != s.master.size()) {
      m_full.resize(s.master.size());
      v_full.resize(s.master.size());
      ExpandMoments(shape, m, m_full.data());
      ExpandMoments(shape, v, v_full.data());
      m = m_full.data();
      v = v_full.data();
    }
    st = writer_->StageGroup(step, group, s.master.data(), m, v, s.version,
                             s.applied, absl::Now() + options_.stage_timeout);
  });
  return st;
}

void CheckpointStager::OnPublished(uint32_t group, uint64_t version,
                                   bool skipped) {
  {
    absl::MutexLock lock(&mu_);
    step_skipped_[version] = skipped;
    while (step_skipped_.size() > 8) step_skipped_.erase(step_skipped_.begin());
  }
  if (optimizer_->shape(group).slice.size() == 0 || version == 0 ||
      !IsCheckpointStep(version)) {
    return;
  }
  absl::Status st = Stage(version, group);
  if (!st.ok() && !absl::IsAlreadyExists(st)) {
    std::cerr << "zshard-server: shard " << options_.shard_id << ": "
              << st.message() << "\n";
  }
}

absl::Status CheckpointStager::Schedule(uint64_t step) {
  bool all_at_step = true, any_at_step = false, any_past = false;
  for (uint32_t g = 0; g < optimizer_->num_groups(); ++g) {
    if (optimizer_->shape(g).slice.size() == 0) continue;
    const uint64_t v = optimizer_->version(g);
    all_at_step &= v == step;
    any_at_step |= v == step;
    any_past |= v > step;
  }
  if (writer_->last_step() == step) return absl::OkStatus();  // taken already
  // Stages the groups already at `step` (another checkpoint still being
  // staged: ABORTED, a later step will do).
  auto stage_ready = [&]() -> absl::Status {
    for (uint32_t g = 0; g < optimizer_->num_groups(); ++g) {
      if (optimizer_->shape(g).slice.size() == 0) continue;
      if (optimizer_->version(g) != step) continue;
      absl::Status st = Stage(step, g);
      if (absl::IsFailedPrecondition(st))
        return absl::AbortedError(st.message());
      ZS_RETURN_IF_ERROR(st);
    }
    return absl::OkStatus();
  };
  // Every group at `step`: its state is that step's until the next one is
  // applied, even when the next step's gradients have begun to arrive (the
  // trainer asking may be one the next step waits for).
  if (all_at_step && step > 0) return stage_ready();
  if (any_past || step == 0) {
    return absl::AbortedError(absl::StrCat("shard ", options_.shard_id,
                                           " has groups at or past step ", step,
                                           "; schedule a later step"));
  }
  // Some or all groups are still before `step` (this shard is applying it,
  // or will): those at it are staged now, the others when they reach it.
  if (any_at_step) ZS_RETURN_IF_ERROR(stage_ready());
  absl::MutexLock lock(&mu_);
  scheduled_.insert(step);
  while (scheduled_.size() > 64) scheduled_.erase(scheduled_.begin());
  return absl::OkStatus();
}

}  // namespace zshard
