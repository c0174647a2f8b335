// Restoring a shard from a checkpoint, and keeping the checkpoint directory
// clean (DESIGN.md, "Checkpoints"): `--restore=latest|N` loads this shard's
// slices of a checkpoint into its store (onto any number of shards); a fresh
// cluster refuses a directory that already holds another run's checkpoints;
// after a restore, shard 0 sets newer (abandoned) checkpoints aside.
//
// Blocking calls; each wait has a deadline. Not thread-safe against other
// users of the store: call before the shard serves.
#ifndef ZSHARD_SERVER_CHECKPOINT_SHARD_RESTORE_H_
#define ZSHARD_SERVER_CHECKPOINT_SHARD_RESTORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/rpc_credentials.h"
#include "server/shard_store.h"

namespace zshard {

struct RestoreOptions {
  // "latest" (shard 0 picks the newest intact checkpoint, the others ask it
  // which) or a step number.
  std::string what;
  // Shard 0's address, for shards > 0 restoring "latest", and how long they
  // wait for it to answer.
  std::string coordinator;
  absl::Duration coordinator_timeout = absl::Seconds(60);
  // How to call the coordinator.
  std::shared_ptr<const RpcCredentials> peers = RpcCredentials::Plaintext();
};

struct RestoredCheckpoint {
  uint64_t step = 0;
  // What each trainer rank saved to resume from, and whether the step
  // before was skipped: handed back to trainers at Join.
  std::map<uint32_t, std::string> trainer_states;
  bool last_step_skipped = false;
  // The coordinator's membership history up to the checkpoint.
  std::vector<MembershipRecord> membership_history;
};

// Loads this shard's slices of the checkpoint into `store`, from
// store.options().checkpoint.root. INVALID_ARGUMENT for a bad `what` or no
// checkpoint directory; FAILED_PRECONDITION when the checkpoint's trainer
// count or accumulation steps differ from the store's, or when nothing
// intact can be restored (naming what was refused); UNAVAILABLE when shard 0
// cannot be asked in time. On shard 0, newer checkpoints are moved to
// ROOT/abandoned-<unix ms>/.
absl::StatusOr<RestoredCheckpoint> RestoreShard(const RestoreOptions& options,
                                                ShardStore& store);

// A running shard goes back to the checkpoint at `step` (its buddy's
// in-memory copy is gone too): ShardStore::RollBackToCheckpoint from this
// shard's checkpoint directory, expecting `ranks` from there. What the
// trainers saved to resume from, or the reader's or the store's error.
absl::StatusOr<RestoredCheckpoint> RollBackToCheckpoint(
    ShardStore& store, uint64_t step, const std::vector<uint32_t>& ranks,
    const std::string& reason);

// The newest checkpoint in `root` every shard's files of which are intact
// (NOT_FOUND naming what was refused when none).
absl::StatusOr<uint64_t> NewestRestorableCheckpoint(const std::string& root);

// FAILED_PRECONDITION when `root` already holds a complete checkpoint (a
// fresh cluster must not write into another run's checkpoints).
absl::Status CheckNoCheckpoints(const std::string& root);

}  // namespace zshard

#endif  // ZSHARD_SERVER_CHECKPOINT_SHARD_RESTORE_H_
