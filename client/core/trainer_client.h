// TrainerClient: the trainer-side library's entry point. Connects to the
// shards, registers or verifies the model, and then per step: Acquire /
// Release groups (prefetched), PushGradient per group (asynchronous unless
// overlap_comm is off), EndStep. Holds no optimizer state.
//
// Thread-safety: methods may be called from any thread, but a step's calls
// are expected in program order from one training loop.
#ifndef ZSHARD_CLIENT_CORE_TRAINER_CLIENT_H_
#define ZSHARD_CLIENT_CORE_TRAINER_CLIENT_H_

#include <map>
#include <memory>

#include "client/core/cluster.h"
#include "client/core/data_plane.h"
#include "client/core/gradient_pusher.h"
#include "client/core/group_access.h"
#include "client/core/local_optimizer.h"
#include "client/core/parameter_cache.h"
#include "client/core/step_reporter.h"
#include "common/config/training_config.h"

namespace zshard {

struct TrainerClientOptions {
  ClusterOptions cluster;
  ParameterCacheOptions cache;
  GradientPusherOptions push;
  // False: PushGradient returns only once the shards acknowledged.
  bool overlap_comm = true;
  // How long a fetch, push or commit that a shard holds for late trainers
  // is asked again (client/core/peer_wait.h).
  absl::Duration peer_wait = kDefaultPeerWait;
  // How long non-zero ranks wait for rank 0 to register the model.
  absl::Duration register_timeout = absl::Seconds(120);
  // ZeRO stage on the trainer side (the servers must agree; the config hash
  // checks it): 3 = only live groups resident, gradients sent per group;
  // 2 = every group resident, gradients sent in buckets of
  // reduce_bucket_bytes; 1 = every group and every gradient resident until
  // the step ends; 0 = the trainer keeps fp32 parameters and AdamW state and
  // updates them itself from the averaged gradient the servers publish.
  uint32_t stage = 3;
  // bf16 on the wire and in compute (stages 1-3): parameters arrive as the
  // servers' bf16 copy, gradients leave as bf16. Master weights stay fp32 on
  // the servers.
  bool bf16 = false;
  uint64_t reduce_bucket_bytes = 500000000ull * 4;
  // ZeRO++'s hpZ (zero_hpz_partition_size): > 1 makes the trainers of ranks
  // k x size .. k x size + size - 1 one host's, sharing what they fetch
  // through shared memory (client/core/host_cache.h). Stages 1-3; must
  // divide the number of trainers.
  uint32_t hpz_partition_size = 1;
  // Stage 0's optimizer (the same keys the servers use in stages 1-3).
  AdamWParams adamw;
  SchedulerConfig scheduler;
};

// Applies what the trainers act on of a ds_config (ZeRO stage, bf16, the
// prefetch window, live and reuse limits, bucket size, overlap_comm, stage
// 0's optimizer, the fingerprint checked at join) to `options`.
// `prefetch_bytes` < 0 takes 4 x stage3_prefetch_bucket_size.
void ApplyTrainingConfig(const TrainingConfig& config, int64_t prefetch_bytes,
                         TrainerClientOptions* options);

// How a step ended.
struct StepResult {
  // Inf/NaN somewhere: no shard applied this step (fp16 overflow).
  bool skipped = false;
  // Global L2 norm of the averaged gradient before clipping (NaN when the
  // cluster runs without a step barrier).
  double grad_norm = 0;
};

struct TrainerClientStats {
  ParameterCacheStats params;  // stage 0: the fetched averaged gradients
  GradientPusherStats grads;
  uint64_t resident_bound = 0;
  // Peak resident bytes by kind.
  uint64_t param_bytes = 0;
  uint64_t grad_bytes = 0;
  uint64_t optimizer_bytes = 0;
  uint64_t buffer_bytes = 0;
};

class TrainerClient : public GroupAccess {
 public:
  ~TrainerClient() override;
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

  absl::StatusOr<const void*> Acquire(size_t g) override;
  absl::Status Release(size_t g) override;
  absl::Status PushGradient(size_t g, const void* grad,
                            uint32_t micro_step) override;
  // The pusher's buffer for group g (GradientPusher::Lend).
  void* GradientBuffer(size_t g) override { return pusher_->Lend(g); }
  // PushGradient from the trainable elements only (trainable_numel(g) of
  // them, in order).
  absl::Status PushTrainableGradient(size_t g, const void* grad,
                                     uint32_t micro_step);

  // Waits until every gradient of this step is acknowledged; with a step
  // barrier, then commits the step on every shard (in parallel) reporting
  // `overflow` (Inf/NaN in this trainer's gradients) and the `loss_scale`
  // they carry, and waits for the shards' common decision. Then moves to the
  // next step. Returns the first error, naming the shard.
  absl::StatusOr<StepResult> EndStep(bool overflow = false,
                                     double loss_scale = 1.0);

  TrainerClientStats stats() const;
  // The gRPC calls this client made to the shards so far, by method
  // ("Lease", "Landed", "CommitStep", ...; RpcCounter).
  std::map<std::string, uint64_t> rpc_counts() const;
  // The control calls made over the data plane's transport instead, by
  // method ("Landed", "ReserveLanding"; DataPlane::transport_calls).
  std::map<std::string, uint64_t> transport_call_counts() const {
    return data_plane_->transport_calls();
  }

  // Tells shard 0 (its status page and metrics) that the step before the
  // current one finished with this rank's `loss` over `samples` sequences in
  // `step_seconds`, and the calls this client made to the shards since its
  // previous report (this one included). Never blocks (step_reporter.h);
  // call after EndStep, from one thread at a time.
  void ReportStep(double loss, uint64_t samples, double step_seconds);
  // What became of those reports so far; `settle` first waits, at most that
  // long, for the ones in flight to be answered.
  StepReporter::Counts report_counts(
      absl::Duration settle = absl::ZeroDuration()) const;

  // The data plane in use ("ucx" or "inline") and the transport's lanes per
  // shard.
  std::string transport() const { return data_plane_->transport_name(); }
  std::string transport_lanes() const { return data_plane_->Lanes(); }

  // Whether the shards were restored from a checkpoint, and what this rank
  // saved with it (see Cluster::Resume).
  const Cluster::Resume& resume() const { return cluster_->resume(); }
  // This process's membership identity, and giving the rank over to another
  // client of this process (see Cluster::Detach).
  uint64_t instance_id() const { return cluster_->instance_id(); }
  // Where the coordinator moved, once this client learned it (shard 0 was
  // replaced; "" otherwise).
  std::string coordinator_moved_to() const { return cluster_->moved_to(); }
  // OK while the coordinator holds this trainer's rank; why not once it
  // dropped the trainer, the cluster rolled back or the coordinator moved
  // (Cluster::membership).
  absl::Status membership() const { return cluster_->membership(); }
  // Every shard's endpoint, by shard id.
  const std::vector<std::string>& shard_endpoints() const {
    return cluster_->endpoints();
  }
  void Detach() { cluster_->Detach(); }
  // Ends every fetch and push of this client (waiting for those in flight
  // to return, within their deadlines) but keeps the heartbeats, so the
  // rank stays this process's while it joins again. Afterwards only
  // Detach, instance_id, rank, resume and destruction may be called.
  void StopTraffic();
  // The same without freeing anything: every call to a shard, in flight or
  // later, fails at once, while the parameters it lent stay readable (a
  // binding whose tensors may still view them keeps the client until they
  // are gone). Afterwards the same calls as after StopTraffic.
  void Silence();
  // The trainer's opaque resume state at the start of the current step (data
  // position, loss scale), sent with this step's gradients and saved in
  // checkpoints. Call before the step's first PushGradient.
  void SetTrainerState(std::string state) {
    pusher_->SetTrainerState(std::move(state));
  }

 private:
  TrainerClient() = default;
  // With hpz_partition_size > 1: attaches to this host's cache and points
  // `cache` at it. The errors of the checks (stage 0, a size that does not
  // divide the trainers) name the config key.
  absl::Status OpenHostCache(ParameterCacheOptions* cache);

  TrainerClientOptions options_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<PartitionMap> map_;
  // The transport data plane (null when the shards run none); used by the
  // cache and pusher, so destroyed after them.
  std::unique_ptr<DataPlane> data_plane_;
  // hpZ: this host's shared parameter memory (null: off); used by the
  // cache, so destroyed after it.
  std::unique_ptr<HostCache> host_cache_;
  std::unique_ptr<ParameterCache> cache_;
  std::unique_ptr<GradientPusher> pusher_;
  // Stage 0 only: the parameters and AdamW state this trainer keeps; uses
  // the cache, so destroyed before it.
  std::unique_ptr<LocalOptimizer> local_;
  // Uses the cluster's stub to shard 0, so destroyed before the cluster.
  std::unique_ptr<StepReporter> reporter_;
  // RPCs counted up to the last ReportStep (that call included).
  uint64_t rpcs_reported_ = 0;
  uint64_t step_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_TRAINER_CLIENT_H_
