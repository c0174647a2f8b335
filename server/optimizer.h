// Optimizer: the training state one shard owns for its slice of every group
// (fp32 master weights, AdamW moments, versions) and the update that turns a
// reduced gradient into the next version (DESIGN.md, "The server's step as a
// pipeline"). The update writes the compute-dtype copy of the result straight
// into the publish slot it is given (bf16 in the same pass as AdamW).
//
// Thread-safety: Update, GradCheck, WriteCopy and kernels() belong to the
// update engine (one thread); Read may run on any thread and sees one whole
// version (each group has its own lock, which Update holds exclusively).
// Write is for registration and restore, before the engine runs.
#ifndef ZSHARD_SERVER_OPTIMIZER_H_
#define ZSHARD_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config/training_config.h"
#include "common/model/partition_map.h"
#include "common/model/wire_format.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {

struct OptimizerOptions {
  AdamWParams adamw;
  // Learning-rate schedule (kNone: adamw.lr throughout).
  SchedulerConfig scheduler;
  // ZeRO stage 0: the new "values" are the averaged gradient itself (the
  // trainers run AdamW).
  bool sum_only = false;
  // The published copy is bf16 (else fp32).
  bool publish_bf16 = false;
  // A quantized format: WriteQuantized encodes the master weights in it.
  WireFormat quantized;
  // Instruction set and threads per update.
  kernels::CpuKernelsOptions kernels;
};

// One group's slice on this shard and the element ranges (relative to the
// slice) of its trainable tensors: only these are updated.
struct GroupShape {
  Slice slice;
  std::vector<std::pair<uint64_t, uint64_t>> trainable;
  // Elements in the trainable ranges: the length of the AdamW moments.
  uint64_t trainable_size() const;
};

// The AdamW moments are kept for the trainable elements only (frozen
// tensors have none). Expand writes them at their slice positions into
// `full` (slice.size() floats; frozen positions become 0); Compact takes
// them back from such an array into `compact` (trainable_size() floats).
void ExpandMoments(const GroupShape& shape, const float* compact, float* full);
void CompactMoments(const GroupShape& shape, const float* full, float* compact);

class Optimizer {
 public:
  // State zeroed, every group at version 0; with `masters` (one per group,
  // each its slice's size), those become the master weights (moved in, no
  // copy). INVALID_ARGUMENT when the kernel options are (see
  // CpuKernels::Create) or a master has the wrong size.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerOptions& options, std::vector<GroupShape> groups,
      std::vector<std::vector<float>> masters = {});
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // master: the slice; m, v: its trainable elements only, range after
  // range (GroupShape::trainable).
  struct State {
    std::vector<float> master, m, v;
    uint64_t version = 0;  // steps applied or skipped
    uint64_t applied = 0;  // updates applied: AdamW's step
  };

  size_t num_groups() const { return groups_.size(); }
  const GroupShape& shape(uint32_t group) const {
    return groups_[group]->shape;
  }
  uint64_t version(uint32_t group) const;

  // Runs `fn` on `group`'s state, which no update changes meanwhile.
  void Read(uint32_t group, const std::function<void(const State&)>& fn) const;
  // Registration / restore: `fn` may change the state.
  void Write(uint32_t group, const std::function<void(State&)>& fn);

  // Engine: the next version of `group` from `grad` (the reduced gradient
  // of the trainable elements, GroupShape::trainable_size() values, times
  // grad_scale; consumed), or the same values again when `skip`.
  // Writes its compute-dtype copy to `out` (the publish slot of the new
  // version; null when the group is empty here); `current` holds the copy of
  // the version before (copied forward when skipping at bf16).
  void Update(uint32_t group, float* grad, float grad_scale, bool skip,
              void* out, const void* current);
  // Engine: writes the compute-dtype copy of `group`'s current values to
  // `out` (an initial or restored version).
  void WriteCopy(uint32_t group, void* out);
  // Engine: encodes `group`'s current master weights in the quantized
  // format into `out` (OptimizerOptions::quantized.Bytes(slice size) bytes;
  // nothing for a null `out` or an empty slice). A block holding Inf or NaN
  // gets scale NaN, so a trainer sees NaN there as it would unquantized.
  void WriteQuantized(uint32_t group, void* out);
  // Engine: the kernels (unscale + inf/nan check, bf16 widening).
  kernels::CpuKernels& kernels() { return *kernels_; }

 private:
  struct Group {
    GroupShape shape;
    mutable absl::Mutex mu;
    State state ABSL_GUARDED_BY(mu);
  };
  Optimizer(const OptimizerOptions& options,
            std::unique_ptr<kernels::CpuKernels> kernels);
  // The copy of `g`'s master in the published dtype.
  void CopyOutLocked(Group& g, void* out) ABSL_SHARED_LOCKS_REQUIRED(g.mu);

  const OptimizerOptions options_;
  const std::unique_ptr<kernels::CpuKernels> kernels_;
  std::vector<std::unique_ptr<Group>> groups_;  // fixed at Create
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_OPTIMIZER_H_
