// TrainerClient: the trainer-side library's entry point. Connects to the
// shards, registers or verifies the model, and then per step: Acquire /
// Release groups (prefetched), PushGradient per group (asynchronous unless
// overlap_comm is off), EndStep. Holds no optimizer state.
//
// Thread-safety: methods may be called from any thread, but a step's calls
// are expected in program order from one training loop.
#ifndef ZSHARD_CLIENT_TRAINER_CLIENT_H_
#define ZSHARD_CLIENT_TRAINER_CLIENT_H_

#include <memory>

#include "client/cluster.h"
#include "client/gradient_pusher.h"
#include "client/group_access.h"
#include "client/parameter_cache.h"

namespace zshard {

struct TrainerClientOptions {
  ClusterOptions cluster;
  ParameterCacheOptions cache;
  GradientPusherOptions push;
  // False: PushGradient returns only once the shards acknowledged.
  bool overlap_comm = true;
  // How long non-zero ranks wait for rank 0 to register the model.
  absl::Duration register_timeout = absl::Seconds(120);
};

// How a step ended.
struct StepResult {
  // Inf/NaN somewhere: no shard applied this step (fp16 overflow).
  bool skipped = false;
  // Global L2 norm of the averaged gradient before clipping (NaN when the
  // cluster runs without a step barrier).
  double grad_norm = 0;
};

struct TrainerClientStats {
  ParameterCacheStats params;
  GradientPusherStats grads;
  uint64_t resident_bound = 0;
};

class TrainerClient : public GroupAccess {
 public:
  // Connects, then registers (rank 0, with `init`'s values) or verifies the
  // model. The first step is the version the shards are at (0 for a fresh
  // model), so a trainer restarted between steps continues where it was.
  static absl::StatusOr<std::unique_ptr<TrainerClient>> Connect(
      const TrainerClientOptions& options, const v1::ModelSpec& spec,
      const Cluster::InitFn& init);

  uint32_t rank() const { return cluster_->rank(); }
  uint32_t world_size() const { return cluster_->world_size(); }
  uint32_t accumulation_steps() const { return cluster_->accumulation_steps(); }
  uint64_t step() const { return step_; }
  const PartitionMap& map() const { return *map_; }

  absl::StatusOr<const float*> Acquire(size_t g) override;
  absl::Status Release(size_t g) override;
  absl::Status PushGradient(size_t g, const float* grad,
                            uint32_t micro_step) override;

  // Waits until every gradient of this step is acknowledged; with a step
  // barrier, then commits the step on every shard (in parallel) reporting
  // `overflow` (Inf/NaN in this trainer's gradients) and the `loss_scale`
  // they carry, and waits for the shards' common decision. Then moves to the
  // next step. Returns the first error, naming the shard.
  absl::StatusOr<StepResult> EndStep(bool overflow = false,
                                     double loss_scale = 1.0);

  TrainerClientStats stats() const;

 private:
  TrainerClient() = default;

  TrainerClientOptions options_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<PartitionMap> map_;
  std::unique_ptr<ParameterCache> cache_;
  std::unique_ptr<GradientPusher> pusher_;
  uint64_t step_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_TRAINER_CLIENT_H_
