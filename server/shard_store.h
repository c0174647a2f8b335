// ShardStore: one shard's part of the training (DESIGN.md, "The server's
// step as a pipeline"). It registers or restores the model and builds its
// stages for this shard's slice of every group: ContributionBuffer (where
// gradients land), Optimizer (master weights, AdamW moments), Publisher (two
// leased slots per group), StepBarrier (with fp16 or clipping), the
// CheckpointStager, and the UpdateEngine thread that runs reduce -> decide ->
// update -> publish. Its methods are what the RPC handlers call: they
// validate, record and hand work to the engine; none runs the optimizer.
// Independent of gRPC so tests can drive it directly.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZSHARD_SERVER_SHARD_STORE_H_
#define ZSHARD_SERVER_SHARD_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
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
#include "common/config/training_config.h"
#include "common/model/partition_map.h"
#include "common/transport/transport.h"
#include "server/checkpoint/checkpoint_stager.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/contribution_buffer.h"
#include "server/initial_values.h"
#include "server/landing_pool.h"
#include "server/lease_table.h"
#include "server/norm_exchange.h"
#include "server/optimizer.h"
#include "server/publish_latency.h"
#include "server/publisher.h"
#include "server/roster.h"
#include "server/snapshot/snapshot.h"
#include "server/snapshot/snapshot_keeper.h"
#include "server/step_barrier.h"
#include "server/update_engine.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

struct ShardStoreOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint64_t alignment = 64;
  uint64_t persistence_threshold = 100000;
  // Trainer ranks (T) and micro-steps per step (A): an update waits for
  // A contributions of every rank the roster expects (at start the first
  // `initial_trainers`, 0: all T; the others may join later). While fewer
  // than `min_trainers` ranks are members, steps wait for the absent ones.
  uint32_t world_size = 1;
  uint32_t initial_trainers = 0;
  uint32_t min_trainers = 1;
  uint32_t accumulation_steps = 1;
  AdamWParams adamw;
  // The optimizer's kernels: instruction set and threads per update.
  kernels::CpuKernelsOptions kernels;
  // Learning-rate schedule (kNone: adamw.lr throughout).
  SchedulerConfig scheduler;
  // With a step barrier, a shard reduces each group's gradients as they
  // arrive but updates nothing until every trainer has committed the step
  // (CommitStep) and every shard has reported its part of the global decision
  // (inf/nan anywhere: skip everywhere; global norm for clipping).
  bool step_barrier = false;
  // Clip the averaged gradient to this global L2 norm (0: off; needs the
  // barrier).
  double gradient_clipping = 0;
  // ZeRO stage 0 (the BytePS arrangement): the shard only reduces; after a
  // step its published values are the averaged gradient, and the trainers
  // run AdamW themselves.
  bool sum_only = false;
  // bf16 on the wire: keep a bf16 copy of every slice (written in the same
  // pass as AdamW) for fetches, and accept bf16 gradients.
  bool publish_bf16 = false;
  // Quantized transfers (ZeRO++'s qwZ and qgZ): a quantized format here
  // turns them on. Parameters: each version is also published in it (leased
  // with its dtype; the plain copy stays for every other reader). Gradients:
  // trainers land them in it and the fold dequantizes them. A plain format
  // (the default) means off: both travel as publish_bf16 says.
  WireFormat quantized_parameters;
  WireFormat quantized_gradients;
  // How long a shard waits for the others to report a step's decision.
  absl::Duration decision_timeout = absl::Seconds(120);
  // Checkpoints (off while checkpoint.root is empty): the writer's options
  // (shard_id and num_shards are filled in from above) and the period.
  CheckpointWriterOptions checkpoint;
  uint64_t checkpoint_interval = 0;  // 0: only scheduled ones
  // Data plane (DESIGN.md, "Data plane"): the transport whose registered
  // memory publishes each group's values (two slots, leased) and receives
  // gradient contributions in place; null: plain memory, reached only in
  // process (ReadSlice, AcceptGradient: tests and tools). Not owned;
  // outlives the store.
  Transport* transport = nullptr;
  // A lease not released by then ends by itself.
  absl::Duration lease_timeout = absl::Seconds(30);
  // Slots of the landing pool (each as large as the shard's largest
  // contribution) that every group's contributions share; a trainer waits
  // for one rather than the shard growing with trainers x micro-steps.
  // 8: with 4, about half of the pushes of 2 trainers found no credit and
  // took a reservation round trip (step_bench's default shape: 11-15
  // reservations per trainer and step; with 8, 0.5).
  uint32_t landing_slots = 8;
  // How long the landing slots a dropped trainer held stay out of use (it
  // may only be stopped; see LandingPool::Quarantine): the servers'
  // --trainer_timeout_s.
  absl::Duration quarantine = absl::Seconds(10);
  // In-memory snapshots every this many steps, sent to the buddy shard
  // (0: off; see SnapshotKeeper and SetSnapshotSend).
  uint64_t snapshot_interval = 0;
};

// What Lease grants: one version of a group's slice in registered memory,
// and where the group's contributions land.
struct LeaseGrant {
  uint64_t version = 0;
  uint64_t lease_id = 0;
  uint64_t offset = 0;  // global element offset of the slice
  uint64_t elements = 0;
  RemoteRegion values;  // the slice at `version`, in the format leased
  // Values of one contribution (the slice's trainable ones; 0: none, a
  // contribution is then a Landed call alone).
  uint64_t landing_elements = 0;
};

// What ReserveLanding grants: one landing-pool slot for one contribution.
struct LandingGrant {
  uint32_t slot = 0;
  RemoteRegion region;    // the pool
  uint64_t offset = 0;    // of the slot in `region`, bytes
  uint64_t elements = 0;  // values of the contribution (push dtype)
};

// What a shard's training state takes (bytes), as the store accounts it.
struct StoreMemory {
  uint64_t state = 0;         // master weights, AdamW moments
  uint64_t published = 0;     // two published copies per group
  uint64_t landing = 0;       // the landing pool
  uint64_t accumulators = 0;  // one fp32 sum per group
  uint64_t total() const { return state + published + landing + accumulators; }
  uint32_t landing_slots = 0;
  uint32_t landing_slots_peak = 0;  // most in use at once so far
  // Contributions that landed in a reserved slot, and in a landing credit.
  uint64_t landed_reserved = 0;
  uint64_t landed_credit = 0;
  // The reduce so far (see UpdateEngine::ReduceStats).
  uint64_t reduced_contributions = 0;
  uint64_t reduced_elements = 0;
  double reduce_seconds = 0;
};

// Initial values for part of a shard's slice (global element offset within
// the group's flat vector).
struct ValueChunk {
  uint32_t group = 0;
  uint64_t offset = 0;
  std::vector<float> values;
};

// What a fetch returns: one consistent version of a shard's slice.
struct SliceSnapshot {
  uint64_t version = 0;
  uint64_t offset = 0;         // global element offset of values[0]
  std::vector<float> values;   // fp32 fetch
  std::vector<uint16_t> bf16;  // bf16 fetch
};

struct GroupProgress {
  uint64_t version = 0;
  Slice slice;
  std::vector<uint32_t> waiting_for_ranks;
  uint32_t contributions_received = 0;
};

class ShardStore {
 public:
  // INVALID_ARGUMENT when the kernel options are (see CpuKernels::Create).
  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(
      const ShardStoreOptions& options);
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  const ShardStoreOptions& options() const { return options_; }

  // Registers the model with initial values covering this shard's slices
  // exactly (assembled for this shard's slices of `spec`'s partition; they
  // become the master weights, no copy). Returns true when it registered,
  // false when an identical spec was already registered (values ignored).
  // FAILED_PRECONDITION naming the first difference for another spec, or
  // for values that stop short of a slice; INVALID_ARGUMENT for values with
  // a gap or assembled for another partition. On error nothing changes.
  absl::StatusOr<bool> Register(const v1::ModelSpec& spec,
                                InitialValues values);
  // The same from chunks (INVALID_ARGUMENT, too, for chunks out of the
  // slice or overlapping).
  absl::StatusOr<bool> Register(const v1::ModelSpec& spec,
                                const std::vector<ValueChunk>& values);

  bool registered() const;
  // The registered spec; FAILED_PRECONDITION when none.
  absl::StatusOr<v1::ModelSpec> spec() const;
  uint64_t spec_hash() const;
  // Null until registered; immutable afterwards.
  const PartitionMap* partition_map() const;

  // Blocks until the model is registered and `group`'s slice reaches
  // `min_version`, or until `deadline` (DEADLINE_EXCEEDED naming what it
  // waited for) or `cancelled()` returns true (CANCELLED). NOT_FOUND for an
  // unknown group. Returns a copy of one version of the slice.
  // With `bf16`, the snapshot holds the bf16 copy (FAILED_PRECONDITION when
  // the shard does not publish one).
  absl::StatusOr<SliceSnapshot> ReadSlice(
      uint32_t group, uint64_t min_version, absl::Time deadline,
      const std::function<bool()>& cancelled, bool bf16 = false);

  // Most elements one ReadValues call returns (16 MiB of fp32).
  static constexpr uint64_t kMaxReadElements = 4 << 20;
  // The values [begin, end) (global element offsets in `group`'s flat
  // vector, within this shard's slice) of exactly `version` (0: the newest
  // published), fp32 or (with `bf16`) the bf16 copy: an operator's read
  // (zshardctl tensor). Never waits. FAILED_PRECONDITION before
  // registration, for a version no longer held (the last two published ones
  // are; fp32 of a bf16 shard: only the current master) or bf16 from a
  // shard without it; OUT_OF_RANGE outside the slice; INVALID_ARGUMENT for
  // more than kMaxReadElements; NOT_FOUND for an unknown group.
  absl::StatusOr<SliceSnapshot> ReadValues(uint32_t group, uint64_t version,
                                           uint64_t begin, uint64_t end,
                                           bool bf16);

  // Validates and stores one gradient chunk (`n` fp32 values at `data`, or
  // bf16 ones with `bf16`, any alignment) of one trainer's contribution.
  // Chunks of a contribution arrive in order (offset = slice begin + what was
  // received); the first waits, until `deadline`, for a landing slot as
  // ReserveLanding does. The update engine folds each contribution into the
  // group's sum in a fixed order (micro-step, then rank); after the step's
  // last it applies AdamW and publishes the next version; this call does
  // not wait for that. FAILED_PRECONDITION when `bf16` is not the shard's
  // gradient dtype. On error the state is unchanged.
  absl::Status AcceptGradient(uint32_t group, uint64_t step,
                              uint32_t micro_step, uint32_t rank,
                              uint64_t offset, const void* data, size_t n,
                              bool bf16 = false,
                              absl::Time deadline = absl::Now() +
                                                    absl::Seconds(30));

  // How the step barrier learns the other shards' part of a decision (not
  // owned; outlives the store). Set by the service before the model is
  // registered or restored; unset: this shard's totals alone.
  void SetNormExchange(NormExchange* exchange);

  // Barrier mode: trainer `rank` ends `step` (all its gradients are in),
  // reporting whether its gradients overflowed and their loss scale. Blocks
  // until the update engine decided the step on this shard or `deadline`
  // (DEADLINE_EXCEEDED naming the ranks not yet committed). FAILED_PRECONDITION
  // without a barrier, for a step other than the current one (an already
  // decided step is answered again), or a loss scale that differs from another
  // trainer's.
  absl::StatusOr<StepDecision> CommitStep(
      uint64_t step, uint32_t rank, bool overflow, double loss_scale,
      absl::Time deadline, const std::function<bool()>& cancelled);

  // Forgets a partially received contribution (a push stream that broke).
  // A contribution already complete is kept.
  void AbortContribution(uint32_t group, uint64_t step, uint32_t micro_step,
                         uint32_t rank);

  // --- Checkpoints (see CheckpointWriter) ---

  // Called on the writer thread when this shard's part of a checkpoint is
  // durable (`commit`) or could not be written (`fail`). Set before the
  // model is registered or restored.
  void SetCheckpointCommit(CheckpointWriter::CommitFn commit,
                           CheckpointWriter::FailFn fail = nullptr);

  // Records trainer `rank`'s opaque resume state after `step` (its data
  // position and loss scale); a checkpoint at step N saves the states the
  // trainers reported with step N-1.
  void RecordTrainerState(uint32_t rank, uint64_t step, std::string state);

  // Takes a checkpoint at `step`: now, when every group is at `step`
  // (gradients of the next step may have begun to arrive); otherwise when
  // the groups reach it. FAILED_PRECONDITION when checkpoints are off or no
  // model is registered (asking again does not help); ABORTED when a group
  // is past `step` or another checkpoint is still being staged (ask again
  // with a later step).
  absl::Status ScheduleCheckpoint(uint64_t step);

  // What every shard must agree on for checkpoints to complete: "off" or
  // the interval, base period, chunk size and zstd level.
  std::string CheckpointSettings() const;

  // The writer (null until registered, or when checkpoints are off).
  CheckpointWriter* checkpoint_writer();

  // Installs a checkpoint's state instead of registering: the spec, every
  // group at `version`, AdamW's step per group from `applied`, and each
  // array's values for this shard's slices from `read` (which fills
  // elements [begin, end) of a group's array). FAILED_PRECONDITION when a
  // model is registered already; `read`'s error otherwise. On error nothing
  // changes.
  using RestoreReadFn =
      std::function<absl::Status(uint32_t group, StateArray array,
                                 uint64_t begin, uint64_t end, float* out)>;
  absl::Status Restore(const v1::ModelSpec& spec, uint64_t version,
                       const std::function<uint64_t(uint32_t group)>& applied,
                       const RestoreReadFn& read);

  // --- Data plane (options.transport set) ---

  // Waits (like ReadSlice) for `group`'s published version to reach
  // `min_version` and leases the newest published version to `rank` (the
  // update engine publishes each version as it makes it; a lease never
  // waits for a slot). FAILED_PRECONDITION without a transport or for a
  // group this shard owns nothing of.
  // `dtype`: the plain format (bf16 when publishing bf16, else fp32) or the
  // quantized one when quantized_parameters is (else FAILED_PRECONDITION).
  absl::StatusOr<LeaseGrant> Lease(uint32_t group, uint64_t min_version,
                                   v1::DType dtype, uint32_t rank,
                                   absl::Time deadline,
                                   const std::function<bool()>& cancelled);
  // Ends leases (see LeaseTable::Release).
  absl::Status Release(uint32_t rank, const std::vector<uint64_t>& ids);
  // A landing-pool slot for trainer `rank`'s contribution to (group, step,
  // micro_step), which it then puts there. Waits until `deadline` (or
  // `cancelled()`) while the pool has no slot this contribution may take:
  // one slot is kept for contributions whose predecessors in the fold order
  // all have one. DEADLINE_EXCEEDED naming the pool and the ranks the group
  // waits for; FAILED_PRECONDITION without a transport, for a group with no
  // trainable elements here (no slot needed), a contribution already
  // reserved or landed, or another step; INVALID_ARGUMENT for a rank or
  // micro-step out of range. On error nothing changes.
  // `dtype` must be the format gradients land in (GradientWire).
  absl::StatusOr<LandingGrant> ReserveLanding(
      uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
      v1::DType dtype, absl::Time deadline,
      const std::function<bool()>& cancelled);
  // ReserveLanding without the wait: nullopt (nothing changed) when the
  // pool has no slot this contribution may take now. Never blocks beyond
  // the store's locks; errors as ReserveLanding's.
  absl::StatusOr<std::optional<LandingGrant>> TryReserveLanding(
      uint32_t group, uint64_t step, uint32_t micro_step, uint32_t rank,
      v1::DType dtype);
  // Trainer `rank`'s contribution to (group, step, micro_step) is in the
  // landing slot `slot` it reserved, or, with `credit`, in its landing
  // credit `slot` (nullopt for a group with no trainable elements here):
  // taken as if pushed with AcceptGradient (same checks; FAILED_PRECONDITION
  // when `slot` is not the one reserved for it, or not its credit). On error
  // nothing changes. A non-empty `trainer_state` is recorded as `rank`'s
  // resume state with `step` (RecordTrainerState) before the contribution
  // counts, so a checkpoint or snapshot of the step it completes holds it.
  // Returns the contribution's size in bytes.
  absl::StatusOr<uint64_t> Landed(uint32_t group, uint64_t step,
                                  uint32_t micro_step, uint32_t rank,
                                  v1::DType dtype,
                                  std::optional<uint32_t> slot,
                                  bool credit = false,
                                  const std::string& trainer_state = "");
  // A landing credit for trainer `rank`'s next contribution, whatever its
  // group (see LandingPool::GrantCredit; `elements` is the slot's capacity
  // in the push dtype); nullopt when the pool cannot spare one, the rank
  // holds one already, or there is no transport or model.
  std::optional<LandingGrant> GrantCredit(uint32_t rank);
  // Gives back `rank`'s landing credit and the slots quarantined for it (it
  // joined again: a new process).
  void ForgetCredit(uint32_t rank);

  // --- Membership (DESIGN.md, "Coordinator and membership"; see Roster) ---

  // The trainer ranks this shard's steps wait for.
  const Roster& roster() const { return *roster_; }
  // Admission, phase 1: `rank` becomes a member from the lowest step this
  // shard can still admit it at (one no group here has begun), at least
  // `min_step`, which is returned (no group here passes it until Admit). Runs
  // on the update engine between folds; DEADLINE_EXCEEDED if it cannot by
  // `deadline`, INVALID_ARGUMENT for a rank out of range.
  absl::StatusOr<uint64_t> PrepareAdmit(uint32_t rank, uint64_t min_step,
                                        const std::string& identity,
                                        absl::Time deadline);
  // Phase 2: `rank` contributes from `step` (>= what PrepareAdmit returned).
  absl::Status Admit(uint32_t rank, uint64_t step);
  // `rank` is gone (`reason` is what it is told if it comes back): every
  // step waiting for it goes on with what it landed (idempotent). Its leases
  // end now; the roster changes on the update engine, which records, per
  // group, what the rank had contributed (DropRecords).
  void DropTrainer(uint32_t rank, const std::string& reason);
  // What each drop left, group by group: the rank contributed to every
  // step of the group before `step` since it was admitted, to the
  // micro-steps in `landed_mask` of `step`, and to none after. The last
  // 4096, oldest first.
  struct DropRecord {
    uint32_t rank = 0;
    uint32_t group = 0;
    uint64_t step = 0;
    uint64_t landed_mask = 0;
  };
  std::vector<DropRecord> DropRecords() const;
  // Leases by trainer rank (empty without a transport).
  std::map<uint32_t, LeaseTable::RankStats> LeaseStats();

  // Last contribution landed -> first lease of the version it produced.
  PublishLatency::Summary PublishLatencySummary() const;

  // --- In-memory snapshots (server/snapshot/; options.snapshot_interval) ---

  // How a complete snapshot reaches the buddy (see SnapshotKeeper::SendFn).
  // `prepared` (may be empty) is called, blocking, each time a model is set
  // up with the values one of this shard's snapshots holds (the neighbour
  // whose buddy this shard is has about as many: its buffers can be made
  // then). Set before the model is registered or restored.
  void SetSnapshotSend(SnapshotKeeper::SendFn send, SnapshotKeeper::SkipFn skip,
                       std::function<void(uint64_t floats)> prepared = {});
  // Steps of this shard's own complete snapshots (empty when off), and the
  // one of `step` (null when not kept).
  std::vector<uint64_t> OwnSnapshotSteps() const;
  std::shared_ptr<const Snapshot> OwnSnapshot(uint64_t step) const;
  SnapshotStats SnapshotStatistics() const;
  // Goes back to the own snapshot of `step`: a new set of stages from that
  // state (every group at version `step`, every trainer rank expected again
  // from there for `ranks`); every wait in the old ones ends with ABORTED
  // saying `reason`; leases, landed contributions and the step in progress are
  // forgotten. FAILED_PRECONDITION when no such snapshot is kept (nothing
  // changes).
  // As RollBack, to the state of a checkpoint at `step` of this model (its
  // buddy's copy is gone too), read as Restore reads it. FAILED_PRECONDITION
  // for another model or none registered; INTERNAL when the files fail
  // (this shard then serves nothing).
  absl::Status RollBackToCheckpoint(
      const v1::ModelSpec& spec, uint64_t step,
      const std::function<uint64_t(uint32_t group)>& applied,
      const RestoreReadFn& read, const std::vector<uint32_t>& ranks,
      const std::string& reason);
  absl::Status RollBack(uint64_t step, const std::vector<uint32_t>& ranks,
                        const std::string& reason);
  // The replacement's part of a rollback: steps from `step` wait for
  // `ranks` (its state is at `step` already).
  void ResetRoster(const std::vector<uint32_t>& ranks, uint64_t step);
  // A replacement's state: instead of registering, the buddy's copy of
  // this shard (its header checked against `spec`'s partition:
  // INVALID_ARGUMENT). FAILED_PRECONDITION when a model is registered.
  absl::Status RestoreSnapshot(const v1::ModelSpec& spec, const Snapshot& snap);
  // Rollbacks so far.
  uint64_t rollbacks() const;

  // Blocks until the update engine has finished the work handed to it so far
  // (updates, publishes, checkpoint staging), or `deadline`
  // (DEADLINE_EXCEEDED). OK at once before registration.
  absl::Status Drain(absl::Time deadline);

  // Progress of every group; empty when not registered.
  std::vector<GroupProgress> Progress() const;

  // Total elements this shard owns (0 when not registered).
  uint64_t slice_elements() const;

  // What the training state takes (zeros when not registered).
  StoreMemory Memory() const;
  // The update engine's optimizer time and step period (zeros when not
  // registered).
  UpdateEngine::UpdateStats Timings() const;

 private:
  // The registered model's stages, built once by Register or Restore.
  struct Model {
    std::unique_ptr<PartitionMap> map;
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<LandingPool> pool;  // before the buffers that use it
    std::vector<std::unique_ptr<ContributionBuffer>> contributions;
    std::unique_ptr<Publisher> publisher;
    std::unique_ptr<StepBarrier> barrier;      // with a step barrier only
    std::unique_ptr<CheckpointStager> stager;  // with checkpoints only
    std::unique_ptr<SnapshotKeeper> keeper;    // with snapshots only
    std::unique_ptr<UpdateEngine> engine;      // last: stopped first
    // The most trainable elements of any group here: what a landing slot
    // holds (in GradientWire).
    uint64_t landing_capacity = 0;
    // Set by a rollback: waits in this model's stages end (ABORTED).
    std::atomic<bool> retired{false};
  };
  // Fills a new group's state (sized for `shape`): initial values or a
  // checkpoint's.
  using FillFn = std::function<absl::Status(
      uint32_t group, const GroupShape& shape, Optimizer::State& state)>;

  explicit ShardStore(const ShardStoreOptions& options);
  // Builds every stage for this shard's slices of `map` at `version`, fills
  // the state (master weights: `masters` moved in when given, per group),
  // publishes it and starts the engine. mu_ held; on error nothing is
  // installed.
  absl::Status InstallLocked(PartitionMap map, const v1::ModelSpec& spec,
                             uint64_t version, const FillFn& fill,
                             std::vector<std::vector<float>> masters = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InstallLocked's parts: the optimizer, contribution buffers and publisher
  // for `shapes`; the checkpoint stager (with checkpoints); the update engine
  // over the stages built.
  absl::Status CreateDataStages(const std::vector<GroupShape>& shapes,
                                uint64_t version,
                                std::vector<std::vector<float>> masters,
                                Model* m) const;
  absl::Status CreateStagerLocked(uint64_t version, Model* m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEngineLocked(Model* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The installed model (FAILED_PRECONDITION before), and a group's index
  // checked (NOT_FOUND for an unknown group).
  std::shared_ptr<Model> Current() const;
  absl::StatusOr<std::shared_ptr<Model>> Installed() const;
  absl::StatusOr<std::shared_ptr<Model>> ForGroup(uint32_t group) const;
  // `cancelled`, or `m` retired by a rollback; a wait's error turned into
  // ABORTED (naming the rollback) when `m` was retired meanwhile.
  static std::function<bool()> Watch(const Model& m,
                                     const std::function<bool()>& cancelled);
  absl::Status RolledBack(const Model& m, absl::Status st) const;
  // A rollback: retires the installed model (every wait in it ends ABORTED
  // saying `reason`), expects `ranks` from `step`, and runs `install` (with
  // mu_ held) for the new one.
  absl::Status RollBackWith(uint64_t step, const std::vector<uint32_t>& ranks,
                            const std::string& reason,
                            const std::function<absl::Status()>& install);
  // The fill of a restore from a checkpoint (Restore, RollBackToCheckpoint).
  static FillFn CheckpointFill(
      const std::function<uint64_t(uint32_t group)>& applied,
      const RestoreReadFn& read);
  // The own snapshot's state put back (RollBack) or a buddy's copy
  // (RestoreSnapshot): InstallLocked from `snap`. mu_ held.
  absl::Status InstallSnapshotLocked(const v1::ModelSpec& spec,
                                     const Snapshot& snap)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks until the model is installed, `deadline` or `cancelled()`.
  absl::Status AwaitInstalled(absl::Time deadline,
                              const std::function<bool()>& cancelled,
                              const char* what);
  // A contribution landed: the engine folds what it can.
  void Arrived(Model& m, uint32_t group, const ContributionBuffer::Arrival& a);
  // FAILED_PRECONDITION without a transport or for the wrong push dtype.
  absl::Status CheckLanding(v1::DType dtype) const;
  // What parameters (plain copy) and gradients travel as.
  WireFormat PlainWire() const {
    return options_.publish_bf16 ? WireFormat::Bf16() : WireFormat::Fp32();
  }
  WireFormat GradientWire() const {
    return options_.quantized_gradients.quantized()
               ? options_.quantized_gradients
               : PlainWire();
  }
  // Takes a pool slot for the contribution (as ReserveLanding describes) and
  // reserves it in the group's buffer.
  absl::StatusOr<uint32_t> TakeSlot(Model& m, uint32_t group, uint64_t step,
                                    uint32_t micro_step, uint32_t rank,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled);
  // TakeSlot's one attempt: nullopt when the pool has no slot for it now.
  absl::StatusOr<std::optional<uint32_t>> TryTakeSlot(Model& m, uint32_t group,
                                                      uint64_t step,
                                                      uint32_t micro_step,
                                                      uint32_t rank);
  // ReserveLanding's checks; the group's model.
  absl::StatusOr<std::shared_ptr<Model>> CheckReserve(uint32_t group,
                                                      uint64_t step,
                                                      uint32_t micro_step,
                                                      uint32_t rank,
                                                      v1::DType dtype);
  LandingGrant GrantOf(const Model& m, uint32_t group, uint32_t slot) const;
  size_t NonEmptyGroups(const PartitionMap& map) const;

  const ShardStoreOptions options_;
  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  v1::ModelSpec spec_ ABSL_GUARDED_BY(mu_);
  uint64_t spec_hash_ ABSL_GUARDED_BY(mu_) = 0;
  NormExchange* exchange_ ABSL_GUARDED_BY(mu_) = nullptr;
  CheckpointWriter::CommitFn commit_ ABSL_GUARDED_BY(mu_);
  CheckpointWriter::FailFn commit_failed_ ABSL_GUARDED_BY(mu_);
  SnapshotKeeper::SendFn snapshot_send_ ABSL_GUARDED_BY(mu_);
  SnapshotKeeper::SkipFn snapshot_skip_ ABSL_GUARDED_BY(mu_);
  std::function<void(uint64_t)> snapshot_prepared_ ABSL_GUARDED_BY(mu_);
  // What a wait in a retired model answers.
  std::string rolled_back_ ABSL_GUARDED_BY(mu_);
  uint64_t rollbacks_ ABSL_GUARDED_BY(mu_) = 0;
  // Installed at registration (then ready_); a rollback installs another
  // and keeps the one before in retired_ until the next (RPC handlers and
  // trainers' in-flight transfers may still use it).
  mutable absl::Mutex model_mu_;
  std::shared_ptr<Model> model_ ABSL_GUARDED_BY(model_mu_);
  std::shared_ptr<Model> retired_ ABSL_GUARDED_BY(model_mu_);
  std::unique_ptr<PartitionMap> map_;  // set once with the first model
  std::atomic<bool> ready_{false};
  // Created with the store; the buffers and barrier consult it.
  const std::unique_ptr<Roster> roster_;
  mutable absl::Mutex drops_mu_;
  std::deque<DropRecord> drops_ ABSL_GUARDED_BY(drops_mu_);
  std::atomic<uint64_t> landed_reserved_{0};
  std::atomic<uint64_t> landed_credit_{0};
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SHARD_STORE_H_
