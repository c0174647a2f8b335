// CheckpointWriter: one shard's side of asynchronous, differential
// checkpoints (DESIGN.md, "Checkpoints").
//
// At a checkpoint step the shard store hands each group's fp32 master, m and
// v to StageGroup while it holds that group's lock: the writer compares them
// chunk by chunk with what the previous checkpoint saved and copies only the
// chunks that changed into its staging area (a base copies everything). That
// copy is the whole stall. Once every group with elements is staged, a
// background thread encodes the changed chunks (against the chain's base,
// byte-shuffled, zstd), writes step-N/shard-K.data through a temporary name,
// fsyncs, writes the shard manifest last and calls the commit callback (which
// tells the coordinator). A new base starts every `full_every` checkpoints.
//
// Memory: two extra copies of the shard's state (staging and base), allocated
// and touched at creation. Thread-safety: every method may be called from any
// thread; StageGroup blocks while the previous checkpoint is still being
// written (the wait is counted in the stall and logged).
#ifndef ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_
#define ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint/manifest.h"

namespace zshard {

struct CheckpointWriterOptions {
  std::string root;  // checkpoint directory (shared by all shards)
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint64_t chunk_elements = 256 * 1024;
  // A new full base every `full_every` checkpoints (1: every one is a base).
  uint32_t full_every = 5;
  int zstd_level = 1;
  // Testing: sleep this long after each chunk written (to kill mid-file).
  absl::Duration testing_chunk_delay = absl::ZeroDuration();
};

// The shard's slice of one group: where it starts and how many elements.
struct StagedGroupShape {
  uint64_t begin = 0;
  uint64_t size = 0;
};

struct CheckpointWriteStats {
  uint64_t step = 0;
  bool base = false;
  uint64_t bytes_written = 0;
  uint64_t chunks_written = 0;
  uint64_t chunks_total = 0;
  double stall_seconds = 0;  // sum of the StageGroup copies (and waits)
  double write_seconds = 0;  // encode + write + fsync, in the background
};

class CheckpointWriter {
 public:
  // Called on the writer thread once the shard manifest is durable, with the
  // manifest and its file's CRC; its error is recorded as the write's.
  using CommitFn =
      std::function<absl::Status(const ShardManifest& manifest, uint32_t manifest_crc)>;
  // Called on the writer thread when the write of `step` failed (the data,
  // the manifest or the commit), with its error.
  using FailFn = std::function<void(uint64_t step, const absl::Status& error)>;
  // What trainers need to resume from a checkpoint at `step`: the states
  // they reported with step-1 and whether step-1 was skipped.
  struct TrainerResume {
    std::map<uint32_t, std::string> states;
    bool last_step_skipped = false;
  };
  using TrainerStatesFn = std::function<TrainerResume(uint64_t step)>;

  // INVALID_ARGUMENT for bad options; UNAVAILABLE when the root cannot be
  // created.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(
      const CheckpointWriterOptions& options,
      std::vector<StagedGroupShape> groups, CommitFn commit,
      TrainerStatesFn trainer_states, FailFn fail = nullptr);
  // Finishes the write in progress, then stops the thread.
  ~CheckpointWriter();

  const CheckpointWriterOptions& options() const { return options_; }

  // Copies group `group`'s state at checkpoint `step` (each array `size`
  // floats). Groups of one step may arrive in any order and from any thread;
  // starting a step waits (up to `deadline`) for the previous write. When
  // the last group with elements is staged, the write starts. Errors leave
  // the step unwritten (later steps still work): FAILED_PRECONDITION when
  // another step is being staged, ALREADY_EXISTS for a step not after the
  // last one, DEADLINE_EXCEEDED.
  absl::Status StageGroup(uint64_t step, uint32_t group, const float* master,
                          const float* exp_avg, const float* exp_avg_sq,
                          uint64_t version, uint64_t applied, absl::Time deadline);

  // Checkpoints are taken at increasing steps: StageGroup refuses a step at
  // or below the newest one started (ALREADY_EXISTS), and below `step` after
  // this call (a restore from `step`).
  void SkipStepsUpTo(uint64_t step);
  // The newest step whose checkpoint was started (0: none).
  uint64_t last_step() const;

  // Blocks until no checkpoint is being staged or written, or `deadline`.
  absl::Status WaitIdle(absl::Time deadline);

  // For a shard that is stopping: nothing is staged after this call
  // (StageGroup answers FAILED_PRECONDITION), a step only partly staged is
  // dropped (its step in *abandoned, else 0), and a write in progress is
  // waited for, committed included, until `deadline` (DEADLINE_EXCEEDED
  // naming the step). Blocks; any thread.
  absl::Status Drain(absl::Time deadline, uint64_t* abandoned);

  // Stats of the last finished write and its outcome.
  CheckpointWriteStats last_stats() const;
  absl::Status last_error() const;
  uint64_t writes_completed() const;

 private:
  struct Group {
    StagedGroupShape shape;
    std::vector<float> staging[kNumStateArrays];
    std::vector<float> base[kNumStateArrays];
    std::vector<char> dirty[kNumStateArrays];       // per chunk
    std::vector<ChunkEntry> entries[kNumStateArrays];  // previous checkpoint's
    uint64_t version = 0, applied = 0;
    bool staged = false;
  };

  CheckpointWriter(const CheckpointWriterOptions& options,
                   std::vector<StagedGroupShape> shapes, CommitFn commit,
                   TrainerStatesFn trainer_states, FailFn fail);
  void Run();
  // Encodes and writes the staged step; on the writer thread.
  absl::Status Write(uint64_t step, bool base, CheckpointWriteStats* stats);

  const CheckpointWriterOptions options_;
  const CommitFn commit_;
  const TrainerStatesFn trainer_states_;
  const FailFn fail_;
  size_t groups_with_elements_ = 0;

  mutable absl::Mutex mu_;
  std::vector<Group> groups_;  // contents owned by the stager or the writer by phase
  enum class Phase { kIdle, kStaging, kWriting };
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kIdle;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_base_ ABSL_GUARDED_BY(mu_) = false;
  size_t staged_ ABSL_GUARDED_BY(mu_) = 0;
  double stall_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // The trainers' resume states of the step being written, taken when its
  // write began.
  TrainerResume step_resume_ ABSL_GUARDED_BY(mu_);
  // Checkpoints written in the current chain (0: next one is a base).
  uint32_t in_chain_ ABSL_GUARDED_BY(mu_) = 0;
  // Writer thread only: the chain's base and the data files it references.
  uint64_t base_step_ = 0;
  std::map<uint64_t, DataFileRecord> files_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  CheckpointWriteStats last_stats_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_WRITER_H_
