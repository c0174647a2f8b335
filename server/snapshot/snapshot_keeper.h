// SnapshotKeeper: a shard's own in-memory snapshots (issue 16, "Shards:
// replacement from a peer's memory"). The update engine tells it each time
// a group's version is published; at every `interval`-th step its thread
// copies the group's state. Once every group is copied,
// its thread hands the snapshot to `send` (which streams it to the buddy
// shard and reports it to the coordinator, returning once every shard's
// copy of the step is held). The keeper then keeps that step as the newest
// globally complete one and frees the older copy.
//
// It keeps two copies: the newest complete one (to roll back to) and the
// one being staged or sent. A send that failed short of an ABORTED answer
// (the coordinator or a buddy died while the step was being reported) may
// still be complete everywhere else; that copy is kept too, as unsettled,
// until a newer one is complete, so a replacement can choose its step. The
// engine never waits: a snapshot step that comes while the previous one is
// still being sent is skipped on this shard, and the others are told (their
// copies of that step are then not complete anywhere), so snapshots are taken
// as often as the shards can send them, at most every `interval` steps. The
// copy of a group of more than 1 MiB runs on the keeper's thread, right after
// the publish (an update of the group cannot start before the trainers have
// fetched the version and computed on it; if one did, that step's snapshot
// fails here); a smaller one is copied on the engine at once.
//
// Thread-safety: OnPublished runs on the engine thread; the other methods on
// any thread.
#ifndef ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_KEEPER_H_
#define ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_KEEPER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint/trainer_states.h"
#include "server/optimizer.h"
#include "server/snapshot/snapshot.h"

namespace zshard {

struct SnapshotKeeperOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint32_t world_size = 1;
  uint64_t spec_hash = 0;
  uint64_t interval = 1;  // > 0
  // How long staging waits for the previous snapshot's send.
  absl::Duration send_timeout = absl::Seconds(30);
  // The copies are registered with it (not owned; null: plain memory), so
  // the buddy can read them over the data plane.
  Transport* transport = nullptr;
};

struct SnapshotStats {
  uint64_t taken = 0;            // staged and sent
  uint64_t failed = 0;           // sends that failed or timed out
  uint64_t newest_complete = 0;  // step (0: none)
  uint64_t bytes = 0;            // of one snapshot
  double stage_seconds = 0;      // copying (the keeper's thread)
  uint64_t skipped = 0;          // steps skipped: the previous one in flight
  double send_seconds = 0;       // the sender's time, all snapshots
};

class SnapshotKeeper {
 public:
  // `send` streams a complete snapshot to the buddy and reports it; called
  // on the keeper's thread, one at a time.
  using SendFn = std::function<absl::Status(const Snapshot&)>;
  // Tells the others this shard skipped the snapshot of `step`; on the
  // keeper's thread.
  using SkipFn = std::function<absl::Status(uint64_t step)>;
  // `optimizer` outlives the keeper. Blocks while it allocates and touches
  // the first two snapshots' buffers (2 x 12 bytes per parameter of the
  // shard), so the first snapshots do not do it during training.
  SnapshotKeeper(const SnapshotKeeperOptions& options,
                 const Optimizer* optimizer, SendFn send, SkipFn skip);
  // Waits for the send in progress to return, then stops the thread.
  ~SnapshotKeeper();
  SnapshotKeeper(const SnapshotKeeper&) = delete;
  SnapshotKeeper& operator=(const SnapshotKeeper&) = delete;

  // Takes no more snapshots and ends a staging wait (a rollback retires
  // this keeper while its engine may be waiting); the destructor still
  // waits for the send in progress.
  void Abandon();

  // Engine: `group` reached `version`.
  void OnPublished(uint32_t group, uint64_t version, bool skipped);
  // Trainer `rank`'s resume state reported with `step`.
  void RecordTrainerState(uint32_t rank, uint64_t step, std::string state);

  // The own complete copy of `step` (null when not kept).
  std::shared_ptr<const Snapshot> Own(uint64_t step) const;
  // Steps of the complete copies kept (sent, unsettled, or being sent).
  std::vector<uint64_t> OwnSteps() const;
  SnapshotStats stats() const;
  // Values in one of this shard's snapshots (fixed by the model's layout).
  uint64_t total_floats() const { return TotalFloats(); }

 private:
  // Engine: queues `group` at `version` for copying (starting a snapshot,
  // or skipping the step while the previous one is still in flight).
  void Stage(uint32_t group, uint64_t version);
  void SkipLocked(uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeper's thread: copies the next queued group (mu_ released meanwhile;
  // the optimizer's group lock holds the state still). A group that an
  // update moved past the snapshot's step first fails the step here.
  void CopyOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies `group` into the pending snapshot (mu_ released meanwhile) and
  // hands the snapshot on when it was the last; on the calling thread.
  void CopyLocked(uint32_t group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Groups of at most this many bytes (master, m, v) are copied on the
  // engine at the publish, bigger ones on the keeper's thread.
  static constexpr uint64_t kCopyHereBytes = 1 << 20;
  bool Copy(Snapshot& s, uint32_t group);
  // Starts a snapshot of `version` in a free buffer.
  void BeginLocked(uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Floats of one snapshot: every group's master and two moments.
  uint64_t TotalFloats() const;
  // Gives `s` memory for `total` floats (the transport's when there is one),
  // keeping what it has when the size is the same.
  void SizeLocked(Snapshot& s, uint64_t total) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `s` (may be null) for reuse, up to kBuffers spares.
  void KeepSpareLocked(std::shared_ptr<Snapshot> s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buffers in use at once in the steady state: the kept copy and the one
  // being staged or sent. This many are made at construction.
  static constexpr int kBuffers = 2;
  void Run();

  const SnapshotKeeperOptions options_;
  const Optimizer* const optimizer_;
  const SendFn send_;
  const SkipFn skip_;
  size_t groups_with_elements_ = 0;

  mutable absl::Mutex mu_;
  // The newest globally complete copy; the one being staged or sent;
  // spare buffers (reused to avoid touching fresh memory each time; the
  // first kBuffers made at construction).
  std::shared_ptr<Snapshot> kept_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Snapshot> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Snapshot>> spares_ ABSL_GUARDED_BY(mu_);
  // A complete copy newer than kept_ whose send failed without an answer
  // that it failed everywhere (null: none).
  std::shared_ptr<Snapshot> unsettled_ ABSL_GUARDED_BY(mu_);
  size_t staged_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<char> group_staged_ ABSL_GUARDED_BY(mu_);
  // The complete snapshot handed to the sender (null: none), and whether
  // the sender has taken it.
  std::shared_ptr<Snapshot> to_send_ ABSL_GUARDED_BY(mu_);
  bool sent_ ABSL_GUARDED_BY(mu_) = false;
  // The step being skipped, and the skips the others are still to hear of.
  uint64_t skipping_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> skips_ ABSL_GUARDED_BY(mu_);
  std::deque<uint32_t> copies_ ABSL_GUARDED_BY(mu_);  // groups to copy
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, bool> skipped_ ABSL_GUARDED_BY(mu_);
  TrainerStates trainer_states_ ABSL_GUARDED_BY(mu_);
  SnapshotStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_KEEPER_H_
