// ContributionBuffer: the first stage of a shard's step (DESIGN.md, "The
// server's step as a pipeline"). One group's gradient contributions for the
// current step on this shard: each (trainer rank, micro-step) lands in a
// slot of the shard's LandingPool (trainers put into it directly), and the
// reduce folds the contributions into one fp32 accumulator in a fixed order
// (micro-step, then rank), each as soon as every one before it has been
// folded, giving its slot back. The sum's bits do not depend on the order
// trainers arrived in, and the memory is the accumulator alone (4 bytes per
// trainable element) whatever the number of trainers and micro-steps.
//
// Thread-safety: CheckNew, InOrder, Reserve, Land, Accept, Abort, Progress
// and Quiet may be called from any thread (the buffer's own lock). Fold, sum
// and Reset belong to the update engine; until Reset the accumulator is the
// engine's (every contribution names the step, and the step moves only at
// Reset).
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
#include "common/model/wire_format.h"
#include "server/landing_pool.h"
#include "server/roster.h"

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
  // Trainers land bf16 gradients (widened to fp32 as they are folded).
  bool bf16 = false;
  // A quantized format: trainers land their gradients in it instead
  // (ZeRO++'s qgZ; dequantized as they are folded, in the same fixed order).
  WireFormat quantized;
  // Where contributions land; its slots hold at least contribution_bytes().
  // Required when the slice has trainable elements. Not owned.
  LandingPool* pool = nullptr;
  // Which ranks a step waits for (world_size is then the roster's
  // max_ranks); null: every rank below world_size, always. Not owned. A rank
  // the roster does not expect at the step collected is refused; what it
  // landed before counts, what it only reserved is excused at the next Fold
  // (its slot quarantined in the pool until the rank joins again: the
  // dropped process may still write it).
  const Roster* roster = nullptr;
};

class ContributionBuffer {
 public:
  // Collects `step` first. INVALID_ARGUMENT without a pool (or with slots
  // too small) where one is needed; RESOURCE_EXHAUSTED when memory cannot be
  // had.
  static absl::StatusOr<std::unique_ptr<ContributionBuffer>> Create(
      const ContributionBufferOptions& options, uint64_t step);
  ContributionBuffer(const ContributionBuffer&) = delete;
  ContributionBuffer& operator=(const ContributionBuffer&) = delete;

  // Elements of one contribution: the slice's trainable ones.
  size_t elements() const { return elements_; }
  // Bytes of one contribution in its landing slot (fp32, bf16 or quantized).
  size_t contribution_bytes() const {
    if (options_.quantized.quantized())
      return options_.quantized.Bytes(elements_);
    return elements_ * (options_.bf16 ? sizeof(uint16_t) : sizeof(float));
  }
  // Bytes the buffer itself holds (the accumulator).
  size_t bytes() const { return sums_.size() * sizeof(float); }

  // A contribution of trainer `rank` to (step, micro_step) that has not
  // arrived yet: OK, or INVALID_ARGUMENT for a rank or micro-step out of
  // range, FAILED_PRECONDITION for another step than the one collected, an
  // empty slice, or a contribution already (partly) there.
  absl::Status CheckNew(uint64_t step, uint32_t micro_step,
                        uint32_t rank) const;
  // Whether every contribution before this one in the fold order has a slot
  // or has been folded (so this one, once landed, is folded at once and
  // frees its slot). CheckNew's errors.
  absl::StatusOr<bool> InOrder(uint64_t step, uint32_t micro_step,
                               uint32_t rank) const;
  // The contribution will land in pool slot `slot` (taken by the caller;
  // from now on the buffer's: it gives it back once folded, or on Abort).
  // CheckNew's errors; on error the slot stays the caller's.
  absl::Status Reserve(uint64_t step, uint32_t micro_step, uint32_t rank,
                       uint32_t slot);
  // The slot reserved for the contribution (nullopt when none).
  std::optional<uint32_t> ReservedSlot(uint64_t step, uint32_t micro_step,
                                       uint32_t rank) const;

  // What an arrival did: `fold` when the engine should fold now.
  struct Arrival {
    bool fold = false;
    uint64_t bytes = 0;
  };

  // Trainer `rank`'s contribution to (step, micro_step) is in its reserved
  // slot (without trainable elements: no slot, no bytes). CheckNew's
  // range and step errors; FAILED_PRECONDITION when no slot was reserved
  // for it or it is already there. On error nothing changes.
  absl::StatusOr<Arrival> Land(uint64_t step, uint32_t micro_step,
                               uint32_t rank);

  // One chunk (`n` values at `data`, any alignment; bf16 when the buffer is)
  // of a contribution pushed in process into its reserved slot, in the
  // slice's full layout (values of frozen elements are ignored); chunks
  // arrive in order (`offset` is the global element offset, = slice begin +
  // what was received). Land's errors (a contribution with trainable
  // elements needs a reserved slot), plus INVALID_ARGUMENT for a range
  // outside the slice or out of order. On error nothing changes.
  absl::StatusOr<Arrival> Accept(uint64_t step, uint32_t micro_step,
                                 uint32_t rank, uint64_t offset,
                                 const void* data, size_t n);

  // Forgets a contribution not yet landed (a push that broke), giving its
  // slot back; a landed one is kept.
  void Abort(uint64_t step, uint32_t micro_step, uint32_t rank);

  // Engine: folds, in order, the landed contributions whose predecessors
  // are all folded into the accumulator (bf16 widened exactly first; the
  // first one is copied, each later one added), and gives their slots back.
  // A position whose rank the roster does not expect at the step is passed
  // over (excused) unless its contribution landed. Call again when the
  // roster changes.
  struct Folded {
    size_t contributions = 0;  // folded by this call
    bool complete = false;     // this call resolved the step's last position
    // Contributions in the step's sum (the averaging divisor; 0: nobody
    // contributed, the group's step is skipped). Valid once complete.
    uint32_t summed = 0;
  };
  Folded Fold();
  // Engine: the accumulator (elements() values: the slice's trainable
  // elements); the step's sum once Fold reported it complete, valid and
  // writable until Reset.
  float* sum() { return sums_.data(); }
  // Engine: collects `next_step` from now on, nothing arrived.
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
  // Nothing of the current step has arrived or been reserved (positions
  // passed over for absent ranks do not count): !Begun().
  bool Quiet() const;
  // Whether `rank` reserved, landed or was excused anything of the current
  // step (a new process with that rank can join only from the next step).
  bool RankTouched(uint32_t rank) const;
  // Engine: forgets the positions passed over in a step that has not begun
  // (a trainer admitted at it contributes after all). No-op once begun.
  void Rewind();
  // The step collected and which of `rank`'s micro-steps of it have landed
  // (bit m: micro-step m; the first 64).
  std::pair<uint64_t, uint64_t> LandedMask(uint32_t rank) const;
  size_t contributions() const { return slots_; }

 private:
  enum class State : uint8_t { kNone, kReserved, kLanded, kFolded, kExcused };

  explicit ContributionBuffer(const ContributionBufferOptions& options);
  // Range and step checks (INVALID_ARGUMENT / FAILED_PRECONDITION).
  absl::Status CheckLocked(uint64_t step, uint32_t micro_step,
                           uint32_t rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckNewLocked(uint64_t step, uint32_t micro_step,
                              uint32_t rank) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<uint32_t> MissingRanksLocked() const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Marks contribution k landed.
  Arrival LandLocked(size_t k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Anything of the current step reserved or landed.
  bool AnyLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Anything reserved, landed or folded, or a reservation excused.
  bool BegunLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether the step collected waits for `rank`.
  bool ExpectedLocked(uint32_t rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !options_.roster || options_.roster->Expected(rank, step_);
  }
  // Moves reserved_prefix_ past every contribution with a slot (or not
  // expected).
  void AdvancePrefixLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (or, for the first, copies) slot `slot`'s contribution into the
  // accumulator. Engine only.
  void FoldSlot(uint32_t slot, bool first);
  // The first two plain fp32 contributions (slots `slot` and `second`, in
  // fold order) into the accumulator in one pass: the bits of FoldSlot's
  // copy of the first and then its add of the second. Engine only.
  void FoldPair(uint32_t slot, uint32_t second);
  // Fold order: micro-step, then rank.
  size_t index(uint32_t rank, uint32_t micro_step) const {
    return static_cast<size_t>(micro_step) * options_.world_size + rank;
  }

  const ContributionBufferOptions options_;
  const size_t slots_;     // world_size x accumulation_steps
  const size_t elements_;  // per contribution
  std::vector<float> sums_;  // the accumulator
  // Fold's kernels (null without elements) and, for quantized
  // contributions, their dequantized values.
  std::unique_ptr<kernels::CpuKernels> kernels_;
  std::vector<float> unpacked_;

  mutable absl::Mutex mu_;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  // Per contribution (fold order): its state, its pool slot while reserved
  // or landed, and elements received (Accept: of the slice).
  std::vector<State> state_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> slot_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> received_ ABSL_GUARDED_BY(mu_);
  size_t folded_ ABSL_GUARDED_BY(mu_) = 0;           // the first folded_ are
  size_t reserved_prefix_ ABSL_GUARDED_BY(mu_) = 0;  // the first have slots
  uint32_t landed_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t summed_ ABSL_GUARDED_BY(mu_) = 0;  // folded into the sum
  uint32_t excused_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_landed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time completed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_CONTRIBUTION_BUFFER_H_
