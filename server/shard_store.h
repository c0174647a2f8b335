// ShardStore: the training state one shard owns (fp32 master weights, AdamW
// moments, per-contribution gradient buffers) for its slice of every group,
// and the synchronous-step logic over it. Independent of gRPC so tests can
// drive it directly.
//
// Thread-safety: every method may be called from any thread. Each group has
// its own lock; an optimizer update holds it exclusively, readers share it,
// so a fetch never sees a half-written update.
//
// Defined in shard_store.cc (registration, gradients, steps),
// shard_store_checkpoint.cc and shard_store_data_plane.cc.
#ifndef ZSHARD_SERVER_SHARD_STORE_H_
#define ZSHARD_SERVER_SHARD_STORE_H_

#include <atomic>
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
#include "common/config.h"
#include "common/partition_map.h"
#include "common/transport.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/lease_table.h"
#include "server/publish_latency.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/v1/zshard.pb.h"

namespace zshard {

struct ShardStoreOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint64_t alignment = 64;
  uint64_t persistence_threshold = 100000;
  // Trainers (T) and micro-steps per step (A): an update waits for T x A
  // gradient contributions per group.
  uint32_t world_size = 1;
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
  // How long a shard waits for the others to report a step's decision.
  absl::Duration decision_timeout = absl::Seconds(120);
  // Checkpoints (off while checkpoint.root is empty): the writer's options
  // (shard_id and num_shards are filled in from above) and the period.
  CheckpointWriterOptions checkpoint;
  uint64_t checkpoint_interval = 0;  // 0: only scheduled ones
  // Data plane (DESIGN.md, "Data plane"): the transport whose registered
  // memory publishes each group's values (two slots, leased) and receives
  // gradient contributions in place; null: only the Fetch and PushGradients
  // RPCs. Not owned; outlives the store.
  Transport* transport = nullptr;
  // A lease not released by then ends by itself.
  absl::Duration lease_timeout = absl::Seconds(30);
};

// What Lease grants: one version of a group's slice in registered memory,
// and where the group's contributions land.
struct LeaseGrant {
  uint64_t version = 0;
  uint64_t lease_id = 0;
  uint64_t offset = 0;    // global element offset of the slice
  uint64_t elements = 0;
  RemoteRegion values;    // the slice at `version` (bf16 when publishing bf16)
  RemoteRegion landing;   // slots of `elements` values, (rank * A + micro)
};

// The global part of a step's decision, summed over every shard.
struct NormTotals {
  double sum_squares = 0;
  bool non_finite = false;
};

// What CommitStep answers once a step is decided.
struct StepDecision {
  bool skipped = false;
  double grad_norm = 0;
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
  uint64_t offset = 0;  // global element offset of values[0]
  std::vector<float> values;     // fp32 fetch
  std::vector<uint16_t> bf16;    // bf16 fetch
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
  // exactly. Returns true when it registered, false when an identical spec
  // was already registered (values ignored). FAILED_PRECONDITION naming the
  // first difference for another spec; INVALID_ARGUMENT for bad values (out
  // of the slice, overlapping, missing). On error nothing changes.
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

  // Validates and stores one gradient chunk (`n` fp32 values at `data`, any
  // alignment) of one trainer's contribution.
  // Chunks of a contribution arrive in order (offset = slice begin + what was
  // received). When the last contribution of a group's step completes, the
  // contributions are reduced in a fixed order (rank, then micro-step), AdamW
  // is applied and the version bumps, on the calling thread. On error the
  // state is unchanged.
  absl::Status AcceptGradient(uint32_t group, uint64_t step,
                              uint32_t micro_step, uint32_t rank,
                              uint64_t offset, const void* data, size_t n,
                              bool bf16 = false);

  // Sends this shard's (sum of squares, non-finite) for `step` to every other
  // shard's decision and returns the totals over all shards; blocks until all
  // have reported or `deadline`. Set by the service before any step.
  using NormExchange = std::function<absl::StatusOr<NormTotals>(
      uint64_t step, double sum_squares, bool non_finite, absl::Time deadline)>;
  void SetNormExchange(NormExchange exchange);

  // Barrier mode: trainer `rank` ends `step` (all its gradients are in),
  // reporting whether its gradients overflowed and their loss scale. Blocks
  // until the step is decided on this shard or `deadline` (DEADLINE_EXCEEDED
  // naming the ranks not yet committed). FAILED_PRECONDITION without a
  // barrier, for a step other than the current one (an already decided step
  // is answered again), or a loss scale that differs from another trainer's.
  absl::StatusOr<StepDecision> CommitStep(uint64_t step, uint32_t rank,
                                          bool overflow, double loss_scale,
                                          absl::Time deadline,
                                          const std::function<bool()>& cancelled);

  // Forgets a partially received contribution (a push stream that broke).
  // A contribution already complete is kept.
  void AbortContribution(uint32_t group, uint64_t step, uint32_t micro_step,
                         uint32_t rank);

  // --- Checkpoints (see CheckpointWriter) ---

  // Called on the writer thread when this shard's part of a checkpoint is
  // durable. Set before the model is registered or restored.
  void SetCheckpointCommit(CheckpointWriter::CommitFn commit);

  // Records trainer `rank`'s opaque resume state after `step` (its data
  // position and loss scale); a checkpoint at step N saves the states the
  // trainers reported with step N-1.
  void RecordTrainerState(uint32_t rank, uint64_t step, std::string state);

  // Takes a checkpoint at `step`: now, when every group is at `step` and no
  // gradient of the next step has arrived; otherwise when the groups reach
  // it. FAILED_PRECONDITION when checkpoints are off, no model is registered,
  // or a group is already at or past `step` (ask again with a later step).
  absl::Status ScheduleCheckpoint(uint64_t step);

  // What every shard must agree on for checkpoints to complete: "off" or
  // the interval, base period, chunk size and zstd level.
  std::string CheckpointSettings() const;

  // The writer (null until registered, or when checkpoints are off).
  CheckpointWriter* checkpoint_writer() { return writer_.get(); }

  // Installs a checkpoint's state instead of registering: the spec, every
  // group at `version`, AdamW's step per group from `applied`, and each
  // array's values for this shard's slices from `read` (which fills
  // elements [begin, end) of a group's array). FAILED_PRECONDITION when a
  // model is registered already; `read`'s error otherwise. On error nothing
  // changes.
  using RestoreReadFn = std::function<absl::Status(uint32_t group, StateArray array,
                                                   uint64_t begin, uint64_t end, float* out)>;
  absl::Status Restore(const v1::ModelSpec& spec, uint64_t version,
                       const std::function<uint64_t(uint32_t group)>& applied,
                       const RestoreReadFn& read);

  // --- Data plane (options.transport set) ---

  // Waits (like ReadSlice) for `group` to reach `min_version`, publishes the
  // current version in its slot if not yet there (waiting, until
  // `deadline`, for the slot's earlier version to be released or to expire)
  // and leases it to `rank`. FAILED_PRECONDITION without a transport or for
  // a group this shard owns nothing of.
  absl::StatusOr<LeaseGrant> Lease(uint32_t group, uint64_t min_version, bool bf16,
                                   uint32_t rank, absl::Time deadline,
                                   const std::function<bool()>& cancelled);
  // Ends leases (see LeaseTable::Release).
  absl::Status Release(uint32_t rank, const std::vector<uint64_t>& ids);
  // Trainer `rank`'s contribution to (group, step, micro_step) is in its
  // landing slot: taken as if pushed with AcceptGradient (same checks; bf16
  // slots are widened to fp32 first). On error nothing changes.
  // Returns the contribution's size in bytes.
  absl::StatusOr<uint64_t> Landed(uint32_t group, uint64_t step, uint32_t micro_step,
                                  uint32_t rank, bool bf16);
  // Leases by trainer rank (empty without a transport).
  std::map<uint32_t, LeaseTable::RankStats> LeaseStats();

  // Last contribution landed -> first lease of the version it produced.
  PublishLatency::Summary PublishLatencySummary() const { return publish_latency_.Summarize(); }

  // Progress of every group; empty when not registered.
  std::vector<GroupProgress> Progress() const;

  // Total elements this shard owns (0 when not registered).
  uint64_t slice_elements() const;

 private:
  struct GroupState {
    mutable absl::Mutex mu;
    uint32_t index = 0;
    Slice slice;
    // Ranges (relative to slice.begin) of trainable tensors: the optimizer
    // updates only these; frozen elements keep their values.
    std::vector<std::pair<uint64_t, uint64_t>> trainable;
    std::vector<float> master ABSL_GUARDED_BY(mu);
    std::vector<uint16_t> bf16 ABSL_GUARDED_BY(mu);  // publish_bf16 only
    std::vector<float> m ABSL_GUARDED_BY(mu);
    std::vector<float> v ABSL_GUARDED_BY(mu);
    // (rank * A + micro) * slice.size() + i. With a transport, memory it
    // allocated (trainers put fp32 contributions straight into it).
    struct Contributions {
      float* ptr = nullptr;
      size_t n = 0;
      std::vector<float> own;
      float* data() { return ptr; }
      const float* data() const { return ptr; }
      size_t size() const { return n; }
    };
    Contributions contrib ABSL_GUARDED_BY(mu);
    std::unique_ptr<MemoryRegion> contrib_region;
    std::vector<uint64_t> received ABSL_GUARDED_BY(mu);
    uint32_t complete ABSL_GUARDED_BY(mu) = 0;
    uint64_t version ABSL_GUARDED_BY(mu) = 0;
    // Optimizer updates applied (skipped steps excluded): AdamW's step.
    uint64_t applied ABSL_GUARDED_BY(mu) = 0;
    // Data plane: version v published in slot v % 2 (registered memory),
    // and the contributions' registered landing area (the fp32 contribution
    // buffers themselves, or bf16 slots widened on Landed).
    uint64_t pub_version[2] ABSL_GUARDED_BY(mu) = {UINT64_MAX, UINT64_MAX};
    std::unique_ptr<MemoryRegion> pub_region[2];
    // bf16 contributions land here (widened on Landed); else contrib_region.
    std::unique_ptr<MemoryRegion> landing_bf16;
    // When the last contribution of the current step landed, and the newest
    // version a lease was granted for (publish latency).
    absl::Time last_landed ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    uint64_t first_leased ABSL_GUARDED_BY(mu) = UINT64_MAX;
  };

  // Barrier mode: the step being collected and what is known of it.
  struct Barrier {
    uint64_t step = 0;
    std::vector<char> committed;  // per rank
    bool overflow = false;
    double loss_scale = 0;  // 0: no commit yet
    size_t groups_reduced = 0;
    bool finishing = false;
    absl::Status error;  // set when the step could not be decided
    std::map<uint64_t, StepDecision> decided;  // recent steps
  };

  // Sums the contributions into slot 0 in a fixed order.
  void ReduceLocked(GroupState& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu);
  // AdamW on slot 0 (times grad_scale) unless `skip`; bumps the version and
  // clears the contributions.
  void UpdateLocked(GroupState& g, float grad_scale, bool skip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu);
  // Barrier mode: decides and applies the step once everything is in.
  void MaybeFinishStep();
  size_t NonEmptyGroups() const;
  // Allocates every group's state for this shard's slices of `map`.
  absl::StatusOr<std::vector<std::unique_ptr<GroupState>>> MakeGroups(
      const PartitionMap& map, const v1::ModelSpec& spec) const;
  // Counts a complete chunk sequence of a contribution; reduces (and without
  // a barrier updates) when it was the last. True when the barrier must be
  // told a group was reduced.
  bool ContributionCompleteLocked(GroupState& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu);
  // INVALID_ARGUMENT for a trainer rank or micro-step out of range.
  absl::Status CheckContributor(uint32_t rank, uint32_t micro_step) const;
  // FAILED_PRECONDITION for a step other than the group's version, or a
  // group this shard owns nothing of.
  absl::Status CheckContributionStepLocked(const GroupState& g, uint32_t group,
                                           uint64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(g.mu);
  // Tells the barrier a group was reduced.
  void GroupReduced();
  // Waits until `g` reaches `min_version` (lock held on return).
  absl::Status AwaitVersionLocked(GroupState& g, uint32_t group, uint64_t min_version,
                                  absl::Time deadline, const std::function<bool()>& cancelled)
      ABSL_SHARED_LOCKS_REQUIRED(g.mu);
  // Publishes built groups as the registered model (mu_ held).
  absl::Status InstallLocked(PartitionMap map, const v1::ModelSpec& spec,
                             std::vector<std::unique_ptr<GroupState>> groups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `g` to the checkpoint writer when its version is a checkpoint step.
  void MaybeStageLocked(GroupState& g, bool skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu);
  bool IsCheckpointStep(uint64_t version);
  absl::StatusOr<GroupState*> Group(uint32_t group) const;

  ShardStore(const ShardStoreOptions& options,
             std::unique_ptr<kernels::CpuKernels> kernels);

  const ShardStoreOptions options_;
  // One optimizer update at a time uses the kernels (and their threads).
  absl::Mutex kernels_mu_ ;
  std::unique_ptr<kernels::CpuKernels> kernels_ ABSL_GUARDED_BY(kernels_mu_);
  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  v1::ModelSpec spec_ ABSL_GUARDED_BY(mu_);
  uint64_t spec_hash_ ABSL_GUARDED_BY(mu_) = 0;
  // Set once at registration, read-only afterwards.
  std::unique_ptr<PartitionMap> map_;
  std::vector<std::unique_ptr<GroupState>> groups_;
  std::atomic<bool> ready_{false};

  std::unique_ptr<CheckpointWriter> writer_;  // set with the groups
  std::unique_ptr<LeaseTable> leases_;
  absl::Mutex ckpt_mu_;
  CheckpointWriter::CommitFn commit_ ABSL_GUARDED_BY(ckpt_mu_);
  std::set<uint64_t> scheduled_ ABSL_GUARDED_BY(ckpt_mu_);
  // version -> whether the step that produced it was skipped (recent ones)
  std::map<uint64_t, bool> step_skipped_ ABSL_GUARDED_BY(ckpt_mu_);
  // rank -> step -> state (recent steps only)
  std::map<uint32_t, std::map<uint64_t, std::string>> trainer_states_
      ABSL_GUARDED_BY(ckpt_mu_);

  PublishLatency publish_latency_;

  absl::Mutex step_mu_;
  Barrier barrier_ ABSL_GUARDED_BY(step_mu_);
  NormExchange exchange_ ABSL_GUARDED_BY(step_mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SHARD_STORE_H_
