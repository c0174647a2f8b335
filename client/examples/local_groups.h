// LocalGroups: a whole model trained in this process with no communication
// at all — every group's fp32 parameters, gradient sum and AdamW moments
// held here, updated with the servers' own AdamW kernel. zshard-train's
// --local_world mode runs on it: the compute floor that tests/bench's
// step_bench compares a zshard run with (same model, batches, threads and
// activation policy; no fetch, no push, no server).
//
// Thread-compatible: used from the training loop.
#ifndef ZSHARD_CLIENT_EXAMPLES_LOCAL_GROUPS_H_
#define ZSHARD_CLIENT_EXAMPLES_LOCAL_GROUPS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/core/group_access.h"
#include "client/torch/torch_group_runner.h"
#include "common/config/training_config.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {

class LocalGroups : public GroupAccess {
 public:
  // Initializes every group from `model` (which must outlive this).
  // UNIMPLEMENTED with bf16 (the floor runs fp32).
  static absl::StatusOr<std::unique_ptr<LocalGroups>> Create(
      const GroupedModel& model, const TrainingConfig& config);

  absl::StatusOr<const void*> Acquire(size_t g) override;
  absl::Status Release(size_t g) override;
  // Micro-step 0 overwrites the group's sum, later ones add to it.
  absl::Status PushGradient(size_t g, const void* grad,
                            uint32_t micro_step) override;
  // AdamW on every group from the mean of the step's micro-steps.
  absl::Status Step();

 private:
  LocalGroups() = default;

  TrainingConfig config_;
  std::unique_ptr<kernels::CpuKernels> kernels_;
  std::vector<std::vector<float>> params_, grads_, m_, v_;  // per group
  uint64_t applied_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_EXAMPLES_LOCAL_GROUPS_H_
