// ContributionBuffer: the first stage of a shard's step (DESIGN.md, "The
// server's step as a pipeline"). Where one group's gradient contributions
// for the current step land on this shard: one slot per (trainer rank,
// micro-step) in transport memory (trainers put into it directly), which
// contributions arrived, and the fixed-order reduce, so the sum's bits do not
// depend on the order trainers arrived in.
//
// Thread-safety: Land, Accept, Abort, Progress and Quiet may be called from
// any thread (the buffer's own lock). Reduce and Reset belong to the update
// engine: Reduce only after a Land or Accept reported the step complete, and
// until Reset nothing else touches the slots (every contribution names the
// step, and the step moves only at Reset).
#ifndef ZSHARD_SERVER_CONTRIBUTION_BUFFER_H_
#define ZSHARD_SERVER_CONTRIBUTION_BUFFER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/partition_map.h"
#include "common/transport/transport.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {

struct ContributionBufferOptions {
  uint32_t shard_id = 0;
  uint32_t group = 0;
  Slice slice;  // this shard's slice of the group
  // Slice-relative ranges of the slice's trainable elements: a contribution
  // holds only these, in order (frozen tensors get no gradient). nullopt:
  // the whole slice is trainable.
  std::optional<std::vector<std::pair<uint64_t, uint64_t>>> trainable;
  uint32_t world_size = 1;
  uint32_t accumulation_steps = 1;
  // Trainers land bf16 gradients (widened to fp32 by Reduce).
  bool bf16 = false;
  // Allocates the landing slots (registered, so peers can put into them);
  // null: plain memory, filled only in process (Accept). Not owned.
  Transport* transport = nullptr;
};

class ContributionBuffer {
 public:
  // Collects `step` first. RESOURCE_EXHAUSTED when memory cannot be had.
  static absl::StatusOr<std::unique_ptr<ContributionBuffer>> Create(
      const ContributionBufferOptions& options, uint64_t step);
  ContributionBuffer(const ContributionBuffer&) = delete;
  ContributionBuffer& operator=(const ContributionBuffer&) = delete;

  // The registered landing slots ((rank * A + micro) * elements(), fp32 or
  // bf16); null without a transport or when elements() is 0.
  const MemoryRegion* landing() const { return landing_region_.get(); }
  // Elements of one contribution: the slice's trainable ones.
  size_t elements() const { return elements_; }

  // What an arrival did: `complete` when it was the step's last one.
  struct Arrival {
    bool complete = false;
    uint64_t bytes = 0;
  };

  // Trainer `rank`'s contribution to (step, micro_step) is in its landing
  // slot. INVALID_ARGUMENT for a rank or micro-step out of range;
  // FAILED_PRECONDITION for another step than the one collected, an empty
  // slice, or a slot already (partly) pushed. On error nothing changes.
  absl::StatusOr<Arrival> Land(uint64_t step, uint32_t micro_step,
                               uint32_t rank);

  // One chunk (`n` values at `data`, any alignment; bf16 when the buffer is)
  // of a contribution pushed in process, in the slice's full layout (values
  // of frozen elements are ignored); chunks arrive in order (`offset` is the
  // global element offset, = slice begin + what was received). Same errors
  // as Land, plus INVALID_ARGUMENT for a range outside the slice or out of
  // order. On error nothing changes.
  absl::StatusOr<Arrival> Accept(uint64_t step, uint32_t micro_step,
                                 uint32_t rank, uint64_t offset,
                                 const void* data, size_t n);

  // Forgets a partly received contribution (a push stream that broke); a
  // complete one is kept.
  void Abort(uint64_t step, uint32_t micro_step, uint32_t rank);

  // Engine: widens bf16 slots (through `kernels`) and sums every slot into
  // slot 0 in (rank, micro-step) order. Returns the sum (elements() values:
  // the slice's trainable elements), valid and writable until Reset.
  float* Reduce(kernels::CpuKernels& kernels);
  // Engine: what the last Reduce returned.
  float* sum() { return sums_; }
  // Engine: collects `next_step` from now on, every slot empty.
  void Reset(uint64_t next_step);

  struct Progress {
    uint64_t step = 0;
    uint32_t complete = 0;  // contributions fully received
    std::vector<uint32_t>
        waiting_for;  // ranks still missing some (when any arrived)
    absl::Time completed_at = absl::InfinitePast();  // when the last one landed
  };
  Progress GetProgress() const;
  // Ranks with a contribution of the current step still missing, always.
  std::vector<uint32_t> MissingRanks() const;
  // Nothing of the current step has arrived.
  bool Quiet() const;
  size_t contributions() const { return slots_; }

 private:
  explicit ContributionBuffer(const ContributionBufferOptions& options);
  // INVALID_ARGUMENT / FAILED_PRECONDITION as Land describes.
  absl::Status CheckLocked(uint64_t step, uint32_t micro_step,
                           uint32_t rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<uint32_t> MissingRanksLocked() const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts a completed slot; true when it was the last.
  bool CompleteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t slot(uint32_t rank, uint32_t micro_step) const {
    return static_cast<size_t>(rank) * options_.accumulation_steps + micro_step;
  }

  const ContributionBufferOptions options_;
  const size_t slots_;     // world_size x accumulation_steps
  const size_t elements_;  // per contribution
  // What trainers put into (the fp32 slots, or the bf16 ones).
  std::unique_ptr<MemoryRegion> landing_region_;
  // fp32 slots: the reduce's input and output (the landing slots unless
  // trainers land bf16). In landing_region_ or own_sums_.
  float* sums_ = nullptr;
  std::vector<float> own_sums_;
  // bf16 landing slots, widened into sums_ by Reduce.
  uint16_t* bf16_ = nullptr;
  std::vector<uint16_t> own_bf16_;

  mutable absl::Mutex mu_;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  // Per slot: elements received (Accept: of the slice), and whether the
  // contribution is complete.
  std::vector<uint64_t> received_ ABSL_GUARDED_BY(mu_);
  std::vector<char> done_ ABSL_GUARDED_BY(mu_);
  uint32_t complete_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time completed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CONTRIBUTION_BUFFER_H_
