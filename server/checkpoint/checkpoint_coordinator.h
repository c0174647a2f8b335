// CheckpointCoordinator: shard 0's bookkeeping that turns the shards' parts
// into checkpoints (DESIGN.md, "Checkpoints"). When every shard has committed
// its manifest for a step, it writes the model spec and then the global
// manifest (durably; the last file of a checkpoint), then removes chains
// older than the newest `keep_bases` complete bases.
//
// Thread-safe; Commit and WaitComplete may be called from any thread.
#ifndef ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_COORDINATOR_H_
#define ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint/manifest.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

struct CheckpointCoordinatorOptions {
  std::string root;
  uint32_t keep_bases = 2;
  // Copied into every global manifest.
  GlobalManifest
      cluster;  // num_shards, world_size, accumulation, layout, hashes
  // The membership history each global manifest records (none when null);
  // called on the committing thread.
  std::function<std::vector<MembershipRecord>()> history;
};

// One shard's committed part.
struct ShardCommit {
  uint64_t step = 0;
  uint32_t shard_id = 0;
  uint64_t base_step = 0;
  uint32_t manifest_crc = 0;
  uint64_t bytes_written = 0;
  std::map<uint32_t, std::string> trainer_states;  // shard 0's are recorded
  bool last_step_skipped = false;
  // Not OK: the shard could not write its part; the checkpoint fails.
  absl::Status error;
};

class CheckpointCoordinator {
 public:
  explicit CheckpointCoordinator(const CheckpointCoordinatorOptions& options);

  // Records `commit`; the last shard's commit of a step writes the global
  // manifest (on the calling thread) with `spec`. A commit carrying an error
  // fails the step's checkpoint: WaitComplete returns that error, naming
  // the shard. INVALID_ARGUMENT for a
  // shard out of range; UNAVAILABLE when the files cannot be written.
  absl::Status Commit(const ShardCommit& commit, const v1::ModelSpec& spec);

  // Blocks until the checkpoint of `step` is complete or `deadline`
  // (DEADLINE_EXCEEDED naming the shards that have not committed).
  absl::StatusOr<GlobalManifest> WaitComplete(uint64_t step,
                                              absl::Time deadline);

  // Blocks until no checkpoint has some shards' parts but not all (each
  // is complete or failed), or `deadline` (DEADLINE_EXCEEDED naming the
  // steps and the shards they still wait for).
  absl::Status WaitSettled(absl::Time deadline);

  // Newest step completed by this process (0 and false when none).
  bool last_complete(uint64_t* step) const;

 private:
  absl::Status Finish(uint64_t step, const std::vector<ShardCommit>& parts,
                      const v1::ModelSpec& spec);
  // Deletes step directories older than the oldest kept base.
  void CollectGarbage();

  const CheckpointCoordinatorOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::vector<std::optional<ShardCommit>>> pending_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, GlobalManifest> complete_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  // Steps whose global manifest is being written (outside mu_).
  int finishing_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CHECKPOINT_CHECKPOINT_COORDINATOR_H_
