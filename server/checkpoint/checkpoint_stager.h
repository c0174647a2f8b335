// CheckpointStager: the subscriber that hands a shard's state to the
// checkpoint writer (DESIGN.md, "Checkpoints"). The update engine tells it
// each time a group's version is published; at a checkpoint step (every
// interval, or scheduled on demand) it stages that group's state, which is
// the only stall. It also keeps what trainers reported to resume from (their
// state after each step) and which steps were skipped.
//
// Thread-safety: OnPublished and Schedule run on the update engine's thread
// (so the state they copy does not change meanwhile); RecordTrainerState on
// any thread.
#ifndef ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_STAGER_H_
#define ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_STAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/checkpoint/trainer_states.h"
#include "server/optimizer.h"

namespace zshard {

struct CheckpointStagerOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint32_t world_size = 1;
  // The writer's options (shard_id and num_shards are filled in from above).
  CheckpointWriterOptions checkpoint;
  uint64_t interval = 0;  // 0: only scheduled checkpoints
  // How long staging waits for the previous checkpoint's write.
  absl::Duration stage_timeout = absl::Seconds(120);
};

class CheckpointStager {
 public:
  // Creates the writer for `optimizer`'s groups (which must outlive the
  // stager). UNAVAILABLE when the checkpoint root cannot be created.
  static absl::StatusOr<std::unique_ptr<CheckpointStager>> Create(
      const CheckpointStagerOptions& options, const Optimizer* optimizer,
      CheckpointWriter::CommitFn commit,
      CheckpointWriter::FailFn fail = nullptr);

  CheckpointWriter* writer() { return writer_.get(); }

  // Records trainer `rank`'s opaque resume state after `step`; a checkpoint
  // at step N saves the states the trainers reported with step N-1.
  void RecordTrainerState(uint32_t rank, uint64_t step, std::string state);

  // Engine: `group` reached `version` (by an applied or a skipped step).
  void OnPublished(uint32_t group, uint64_t version, bool skipped);

  // Engine: a checkpoint at `step`, now when every group is at `step`
  // (whether or not gradients of the next step have arrived), else each
  // group as it reaches `step` (the groups already there, while this shard
  // is still applying it, now). ABORTED when a group is past `step` or
  // another checkpoint is still being staged (ask again with a later step).
  absl::Status Schedule(uint64_t step);

 private:
  CheckpointStager(const CheckpointStagerOptions& options,
                   const Optimizer* optimizer);
  bool IsCheckpointStep(uint64_t version);
  // Stages `group` at `step`; the writer's error.
  absl::Status Stage(uint64_t step, uint32_t group);
  CheckpointWriter::TrainerResume ResumeFor(uint64_t step);

  const CheckpointStagerOptions options_;
  const Optimizer* const optimizer_;
  std::unique_ptr<CheckpointWriter> writer_;
  absl::Mutex mu_;
  std::set<uint64_t> scheduled_ ABSL_GUARDED_BY(mu_);
  // version -> whether the step that produced it was skipped (recent ones)
  std::map<uint64_t, bool> step_skipped_ ABSL_GUARDED_BY(mu_);
  // rank -> step -> state (recent steps only)
  TrainerStates trainer_states_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_STAGER_H_
