// Coordinator: the one component that knows the whole cluster (DESIGN.md,
// "Coordinator and membership"): the shard registry, trainer rank
// assignment, the step barrier's norm collection, checkpoint assembly and
// on-demand checkpoints. Shard 0 hosts it beside its own shard; the other
// shards reach it through the Coordinator gRPC service
// (coordinator_service.h), trainers through shard 0's Join.
//
// Thread-safety: every method may be called from any thread; each wait has
// a deadline.
#ifndef ZSHARD_SERVER_COORDINATOR_COORDINATOR_H_
#define ZSHARD_SERVER_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/rpc_credentials.h"
#include "server/checkpoint/checkpoint_coordinator.h"
#include "server/coordinator/membership.h"
#include "server/norm_exchange.h"
#include "server/shard_store.h"
#include "server/snapshot/held_snapshots.h"
#include "zshard/v1/admin.grpc.pb.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

struct CoordinatorOptions {
  uint32_t num_shards = 1;
  uint32_t world_size = 1;
  // Checkpoint assembly (off while checkpoint.root is empty).
  CheckpointCoordinatorOptions checkpoint;
  // How the coordinator calls the other shards.
  std::shared_ptr<const RpcCredentials> peers = RpcCredentials::Plaintext();
  // A trainer silent this long is dropped (see Membership).
  absl::Duration trainer_timeout = absl::Seconds(10);
};

class Coordinator : private ShardFanout {
 public:
  // `local` is shard 0's store (not owned; outlives the coordinator).
  Coordinator(const CoordinatorOptions& options, ShardStore* local);
  ~Coordinator() override;

  // --- Shards ---

  // Shard 0's own endpoint, once bound.
  void SetLocalEndpoint(const std::string& endpoint);
  // A shard announces itself. FAILED_PRECONDITION for another shard count or
  // other checkpoint settings than shard 0's; INVALID_ARGUMENT for a bad id
  // or an empty endpoint. On error nothing changes.
  absl::Status RegisterShard(uint32_t shard_id, uint32_t num_shards,
                             const std::string& endpoint,
                             const std::string& checkpoint_settings);
  // Every shard's endpoint ("" while it has not announced itself).
  std::vector<std::string> ShardEndpoints() const;
  // Blocks until every shard has announced itself or `deadline`
  // (UNAVAILABLE naming the missing shards).
  absl::Status AwaitShards(absl::Time deadline) const;

  // --- Trainers ---

  // Who holds which rank, admissions, heartbeats and drops.
  Membership& membership() { return *membership_; }
  const Membership& membership() const { return *membership_; }

  // --- Step barrier (NormExchange for every shard) ---

  // Records shard `shard`'s part of `step` and waits (until `deadline`) for
  // every shard's; the totals in shard order. DEADLINE_EXCEEDED naming the
  // shards missing.
  absl::StatusOr<NormTotals> CollectNorm(uint64_t step, uint32_t shard,
                                         double sum_squares, bool non_finite,
                                         absl::Time deadline);

  // --- Checkpoints ---

  bool checkpoints_on() const { return checkpoints_ != nullptr; }
  // A shard's part of a checkpoint is durable. FAILED_PRECONDITION when
  // checkpoints are off; INVALID_ARGUMENT for a bad shard id.
  absl::Status CommitCheckpoint(const ShardCommit& commit);
  // Schedules a checkpoint on every shard at the first step they all accept,
  // then waits for it (until `deadline`). Its global manifest.
  absl::StatusOr<GlobalManifest> TakeCheckpoint(absl::Time deadline);
  // The newest complete checkpoint; false when none.
  bool LastComplete(uint64_t* step) const;
  // Blocks until no checkpoint waits for more shards' parts (each is
  // complete or failed), or `deadline` (DEADLINE_EXCEEDED naming the shards
  // they wait for). OK at once when checkpoints are off.
  absl::Status WaitCheckpointsSettled(absl::Time deadline);

  // --- Shard replacement from in-memory snapshots (shard_replacement.cc) ---

  // Shard 0's own held snapshots (not owned; outlives the coordinator), and
  // what runs on shard 0 after a rollback (its trainer resume states: the
  // snapshot's header, and the new epoch). Set before serving.
  void SetHeldSnapshots(const HeldSnapshots* held);
  using RolledBackFn =
      std::function<void(const v1::SnapshotHeader& header, uint64_t epoch)>;
  void SetRolledBackHook(RolledBackFn hook);
  // The membership epoch: one more after each replacement.
  uint64_t epoch() const;
  // Shard `shard`'s snapshot of `step` is held by its buddy; blocks until
  // every shard's is (DEADLINE_EXCEEDED naming the missing shards).
  // FAILED_PRECONDITION for an older epoch (a replaced process).
  // A non-OK `failed` (the buddy did not take it) fails the step for every
  // shard at once (ABORTED naming it).
  // Ends the waits of ReportSnapshot and CollectNorm at once (ABORTED) and
  // refuses new ones: the server is shutting down, and gRPC's shutdown
  // waits for every handler to return. Any thread.
  void Close();
  absl::Status ReportSnapshot(uint32_t shard, uint64_t step, uint64_t epoch,
                              absl::Time deadline,
                              const absl::Status& failed = absl::OkStatus());
  // A replacement for `shard` asks what to restore: the newest step whose
  // snapshot of `shard` its buddy holds and that every other shard keeps
  // its own copy of; when there is none (its buddy is gone too, or a shard
  // that cannot be reached keeps none), the newest intact disk checkpoint
  // (from_checkpoint: the whole cluster goes back there), or the step the
  // cluster already went back to without this shard. FAILED_PRECONDITION
  // naming what each holds when neither exists, and for shard 0 (which
  // answers here).
  absl::StatusOr<v1::PrepareReplaceResponse> PrepareReplace(
      uint32_t shard, uint32_t num_shards, absl::Time deadline);
  // The replacement for `shard` serves at `endpoint` with its state at
  // `step`: every other shard rolls back to `step`, the replacement's
  // roster follows, the registry names the new endpoint and the epoch
  // moves; trainers then join again and resume at `step`. Returns the new
  // epoch.
  // With `from_checkpoint`, every shard goes back to the disk checkpoint
  // of `step` instead, and shards that cannot be reached are waited for:
  // their replacements (PrepareReplace answers them that step) join the
  // rollback when they register.
  absl::StatusOr<uint64_t> ReplaceShard(uint32_t shard,
                                        const std::string& endpoint,
                                        uint64_t step, bool from_checkpoint,
                                        absl::Time deadline);
  // --- Taking over as a new coordinator (coordinator_takeover.cc) ---

  // A replacement of shard 0, before it serves: learns the cluster from the
  // live shard at `peer` (every shard's endpoint, the epoch), asks every
  // shard what it holds, and answers which snapshot step restores shard 0
  // from its buddy (as PrepareReplace). INVALID_ARGUMENT when `peer` is no
  // shard of this cluster's size other than 0; FAILED_PRECONDITION when no
  // step can (naming what each holds) or there is one shard only;
  // UNAVAILABLE naming a shard that cannot be asked.
  absl::StatusOr<v1::PrepareReplaceResponse> PrepareTakeover(
      const std::string& peer, absl::Time deadline);
  // Then, serving at `endpoint` with shard 0's state as `header` says:
  // every other shard rolls back to its step and calls this coordinator
  // from now on, the membership holds the ranks the shards expect for their
  // trainers, and the epoch moves (its new value is returned). Trainers then
  // join again (finding this coordinator through any shard's GetLayout).
  // With `from_checkpoint` (PrepareTakeover's plan), to the disk
  // checkpoint of the header's step, as ReplaceShard.
  absl::StatusOr<uint64_t> TakeOver(const std::string& endpoint,
                                    const v1::SnapshotHeader& header,
                                    bool from_checkpoint, absl::Time deadline);

  // A shard's liveness call: FAILED_PRECONDITION (naming the new process)
  // when another process serves `shard` now.
  absl::StatusOr<v1::ShardHeartbeatResponse> ShardHeartbeat(
      uint32_t shard, const std::string& endpoint, uint64_t epoch);

 private:
  // The other shards as the coordinator calls them (index 0 unused: shard 0
  // is in process).
  struct Peer {
    std::unique_ptr<v1::AdminService::Stub> admin;
    std::unique_ptr<v1::ShardControl::Stub> control;
  };
  // The newest version any shard is at (shard 0 in process, the others
  // over GetStatus).
  absl::StatusOr<uint64_t> NewestVersion(const std::vector<Peer>& peers,
                                         absl::Time deadline);
  // Stubs for every shard (index 0 empty); UNAVAILABLE while one has not
  // announced itself. Made once, then shared.
  absl::StatusOr<std::shared_ptr<const std::vector<Peer>>> Peers();

  // ShardFanout: the membership's changes on every shard.
  absl::StatusOr<uint64_t> PrepareAdmit(uint32_t rank, uint64_t min_step,
                                        const std::string& identity,
                                        absl::Time deadline) override;
  absl::Status Admit(uint32_t rank, uint64_t step,
                     absl::Time deadline) override;
  absl::Status Drop(uint32_t rank, const std::string& reason,
                    absl::Time deadline) override;
  uint64_t CurrentStep() override;

  const CoordinatorOptions options_;
  ShardStore* const local_;
  std::unique_ptr<CheckpointCoordinator> checkpoints_;

  mutable absl::Mutex mu_;
  std::vector<std::string> shard_endpoints_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<Peer>> peers_ ABSL_GUARDED_BY(mu_);

  struct NormReport {
    bool present = false;
    double sum_squares = 0;
    bool non_finite = false;
  };
  absl::Mutex norm_mu_;
  bool norm_closed_ ABSL_GUARDED_BY(norm_mu_) = false;
  // Each step's reports, indexed by shard (recent steps only).
  std::map<uint64_t, std::vector<NormReport>> norms_ ABSL_GUARDED_BY(norm_mu_);
  // Snapshots and replacement.
  // The inventory of every shard but `except` (index = shard id); a shard
  // that does not answer holds nothing and is added to `unreachable`.
  absl::StatusOr<std::vector<v1::SnapshotInventoryResponse>> Inventories(
      uint32_t except, absl::Time deadline, std::set<uint32_t>* unreachable);
  // `plan`, or, when no snapshot can replace `shard`, the newest intact
  // disk checkpoint (FAILED_PRECONDITION naming both when none).
  absl::StatusOr<v1::PrepareReplaceResponse> OrFromCheckpoint(
      uint32_t shard, absl::StatusOr<v1::PrepareReplaceResponse> plan);
  // A checkpoint's resume states as a snapshot header carries them.
  absl::StatusOr<v1::SnapshotHeader> CheckpointResume(uint64_t step) const;
  // The newest step whose snapshot of `shard` its buddy holds and every
  // other shard keeps its own copy of, given every shard's inventory.
  absl::StatusOr<v1::PrepareReplaceResponse> ChooseReplacementStep(
      uint32_t shard, const std::vector<v1::SnapshotInventoryResponse>& inv);
  // What a rollback does: the shard replaced (its roster only: its state
  // is at `step` already), the step and new epoch, why, a coordinator the
  // shards move to (non-empty after a takeover), and whether to the disk
  // checkpoint of `step` rather than the own snapshots.
  struct RollBackPlan {
    uint32_t replaced = 0;
    uint64_t step = 0;
    uint64_t epoch = 0;
    std::string reason;
    std::string coordinator;
    bool from_checkpoint = false;
  };
  // Rolls every shard back as `plan` says, expecting `ranks`. From a disk
  // checkpoint, shards that cannot be reached go to `missing` (they must
  // be replaced too); otherwise any failure is the error.
  absl::Status RollBackShards(const RollBackPlan& plan,
                              const std::vector<uint32_t>& ranks,
                              std::set<uint32_t>* missing, absl::Time deadline);
  // After RollBackShards: the new epoch, the shards still owed, the hook.
  void FinishRollBack(const RollBackPlan& plan,
                      const v1::SnapshotHeader& header,
                      const std::vector<uint32_t>& ranks,
                      const std::set<uint32_t>& missing);
  // A replacement of a shard the cluster went back to a disk checkpoint
  // without: its roster joins; the new epoch. NOT_FOUND when no rollback
  // waits for `shard`. replace_mu_ held.
  absl::StatusOr<uint64_t> JoinDiskRollBack(uint32_t shard,
                                            const std::string& endpoint,
                                            uint64_t step, absl::Time deadline);
  const HeldSnapshots* held_ = nullptr;
  RolledBackFn rolled_back_;
  absl::Mutex replace_mu_;  // one replacement at a time
  // PrepareTakeover's finding: the ranks the shards expect.
  std::vector<uint32_t> takeover_ranks_ ABSL_GUARDED_BY(replace_mu_);
  mutable absl::Mutex snap_mu_;
  bool snap_closed_ ABSL_GUARDED_BY(snap_mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(snap_mu_) = 0;
  struct SnapshotReports {
    std::vector<bool> held;
    std::string failed;  // why the step's snapshot is not complete anywhere
  };
  std::map<uint64_t, SnapshotReports> snapshot_reports_
      ABSL_GUARDED_BY(snap_mu_);
  // The cluster went back to the disk checkpoint of `step` without the
  // `missing` shards (gone too); their replacements join it.
  struct DiskRollBack {
    uint64_t step = 0;
    std::set<uint32_t> missing;
    std::vector<uint32_t> ranks;
  };
  std::optional<DiskRollBack> disk_rollback_ ABSL_GUARDED_BY(snap_mu_);
  std::unique_ptr<Membership> membership_;  // last: its watchdog calls us
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_COORDINATOR_COORDINATOR_H_
