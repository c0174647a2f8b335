// LocalOptimizer: ZeRO stage 0 on the trainer (the BytePS arrangement;
// DESIGN.md, "One training step"). The trainer keeps every group's fp32
// parameters and AdamW moments itself; the servers only average the
// gradients, which it fetches after each step through the parameter cache
// and applies here.
//
// Thread-safety: not thread-safe; used from the training loop.
#ifndef ZSHARD_CLIENT_CORE_LOCAL_OPTIMIZER_H_
#define ZSHARD_CLIENT_CORE_LOCAL_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/core/parameter_cache.h"
#include "common/config/training_config.h"
#include "common/model/partition_map.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {

class LocalOptimizer {
 public:
  // Takes a private copy of version 0 (the initial values) of every group
  // from `cache`, which must be at step 0. `cache` and `map` are not owned and
  // outlive the optimizer.
  static absl::StatusOr<std::unique_ptr<LocalOptimizer>> Create(
      ParameterCache* cache, const PartitionMap* map, const AdamWParams& adamw,
      const SchedulerConfig& scheduler);

  // Group `g`'s current fp32 parameters (valid until the next Step).
  // NOT_FOUND for an unknown group.
  absl::StatusOr<const void*> Params(size_t g) const;
  // AdamW on every group from the averaged gradient the servers published
  // for the step just ended (the cache is at the next step).
  absl::Status Step();
  // Parameters held (elements); the moments are twice as many.
  uint64_t elements() const;

 private:
  LocalOptimizer() = default;

  ParameterCache* cache_ = nullptr;
  const PartitionMap* map_ = nullptr;
  AdamWParams adamw_;
  SchedulerConfig scheduler_;
  std::unique_ptr<kernels::CpuKernels> kernels_;
  std::vector<std::vector<float>> params_, m_, v_;  // per group
  uint64_t applied_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_LOCAL_OPTIMIZER_H_
