// zshard's trainer library, public face: everything a training loop (C++ or,
// through a binding, Python) needs, and nothing of gRPC, protobuf or the
// library's internals. A Trainer connects to the shard servers, registers
// (rank 0) or verifies the model, and per step lends each group's
// parameters (prefetched in the background), takes each group's gradient
// as soon as backward has it, and ends the step. It never holds optimizer
// state (except at ZeRO stage 0, where the config asks for it).
//
// Thread-safety: one Trainer per training loop; a step's calls come in
// program order from one thread. Every call that waits has a deadline
// (TrainerOptions); errors name the shard or the input that was wrong, and
// a refused call changes nothing on the servers.
#ifndef ZSHARD_CLIENT_INCLUDE_ZSHARD_CLIENT_TRAINER_H_
#define ZSHARD_CLIENT_INCLUDE_ZSHARD_CLIENT_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

// The model as groups (the fetch unit, normally one layer) of fp32 tensors.
struct TensorDesc {
  std::string name;
  std::vector<int64_t> shape;
  // False: frozen (no gradient is pushed for it; no optimizer state).
  bool trainable = true;
};
struct GroupDesc {
  std::string name;
  std::vector<TensorDesc> tensors;
};
struct ModelDesc {
  std::string name;
  std::vector<GroupDesc> groups;
};

struct TrainerOptions {
  // host:port of shard 0 (required).
  std::string coordinator;
  // -1: the coordinator assigns the next free rank.
  int rank = -1;
  // Shown in the servers' status ("" = host:pid).
  std::string trainer_id;
  // A DeepSpeed-style ds_config.json, the same file the servers read ("":
  // DeepSpeed's defaults). Its ZeRO stage, bf16, prefetch window, live and
  // reuse limits, bucket size, overlap_comm and (stage 0) optimizer apply.
  std::string config_path;
  // "ucx" or "inline"; "" takes the servers' data plane.
  std::string transport;
  // Prefetch window in bytes; -1: 4 x stage3_prefetch_bucket_size.
  int64_t prefetch_bytes = -1;
  // Deadlines, in seconds: joining the servers and waiting for the model's
  // registration; every fetch and push.
  double connect_timeout_s = 60;
  double rpc_timeout_s = 30;
  // Security (file paths; all empty: plaintext, no token). tls_ca: the CA
  // the servers' certificates are checked against (set: TLS); tls_cert and
  // tls_key: a client certificate for servers that require one; token_file:
  // the trainer token (--auth_token_file of the servers), or the admin
  // token, which RequestCheckpoint needs.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;
};

// How a step ended.
struct TrainerStepResult {
  bool skipped = false;  // Inf/NaN somewhere (fp16): no shard applied it
  double grad_norm = 0;  // global norm before clipping (with a step barrier)
};

// A checkpoint the servers completed (Trainer::RequestCheckpoint).
struct TrainerCheckpoint {
  uint64_t step = 0;           // the step boundary it holds
  bool base = false;           // a full base (else a delta on the chain)
  uint64_t bytes_written = 0;  // by all shards, for this checkpoint
  std::string directory;
};

struct TrainerStats {
  uint64_t bytes_fetched = 0;  // over the network
  // hpZ (zero_hpz_partition_size > 1): read from this host's shared memory
  // instead of the network.
  uint64_t bytes_from_host = 0;
  uint64_t bytes_pushed = 0;
  uint64_t peak_param_bytes = 0;  // resident parameters, at most
  uint64_t peak_grad_bytes = 0;
  uint64_t group_fetches = 0;
  uint64_t prefetch_hits = 0;  // acquisitions already fetched or in flight
};

class Trainer {
 public:
  // Fills group g's initial values (group_elements(g) fp32 values); called
  // on rank 0 only, one group at a time.
  using InitFn = std::function<absl::Status(size_t group, float* out)>;

  // Connects and registers or verifies `model`. INVALID_ARGUMENT for bad
  // options or a malformed model; FAILED_PRECONDITION naming the first
  // difference when another model is registered; UNAVAILABLE naming the
  // shard that cannot be reached within connect_timeout_s.
  static absl::StatusOr<std::unique_ptr<Trainer>> Connect(
      const TrainerOptions& options, const ModelDesc& model,
      const InitFn& init);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  uint32_t rank() const;
  uint32_t world_size() const;
  uint32_t accumulation_steps() const;
  // The step being computed (the servers' version: a restarted trainer
  // continues where the cluster is).
  uint64_t step() const;
  size_t num_groups() const;
  uint64_t group_elements(size_t group) const;
  // Bytes per element of parameters and gradients: 4 (fp32) or 2 (bf16).
  size_t element_size() const;
  // The data plane in use ("ucx" or "inline").
  std::string transport() const;

  // Group `group`'s flat parameters, read-only, valid until Release.
  // NOT_FOUND for an unknown group.
  absl::StatusOr<const void*> Acquire(size_t group);
  absl::Status Release(size_t group);
  // Group `group`'s flat gradient for `micro_step` of this step (copied
  // before this returns; sent in the background unless overlap_comm is off).
  // Only the trainable tensors' elements are read and sent; `grad` may be
  // null for a group whose tensors are all frozen.
  absl::Status PushGradient(size_t group, const void* grad,
                            uint32_t micro_step = 0);
  // The same from the trainable elements only: trainable_elements(group)
  // values, the trainable tensors' in order (no buffer for frozen ones).
  absl::Status PushTrainableGradient(size_t group, const void* grad,
                                     uint32_t micro_step = 0);
  // Elements of group `group`'s trainable tensors (0 for an unknown group).
  uint64_t trainable_elements(size_t group) const;
  // Waits until every gradient of the step is acknowledged (and, with a step
  // barrier, the shards' decision), then moves to the next step.
  // `loss_scale` is the scale the pushed gradients carry; < 0 takes
  // loss_scale(). The trainer's loss scaler then follows the outcome.
  absl::StatusOr<TrainerStepResult> EndStep(bool overflow = false,
                                            double loss_scale = -1);
  // After a call failed with `why` (a shard died and was replaced, or a
  // replacement of shard 0 took over: the cluster went back to a snapshot
  // or checkpoint step): joins the cluster again as this process and rank,
  // for at most `timeout_s`, and returns the step the cluster went back to;
  // step() is that step then and the trainer's resume state is the one
  // saved there. Every group lent before is given back (its buffer stays
  // readable until this Trainer is destroyed, but holds stale values).
  // `why`, with what the rejoin found, when the cluster did not roll back.
  absl::StatusOr<uint64_t> Rejoin(const absl::Status& why, double timeout_s);
  // The resume state saved at the step the cluster restored or rolled back
  // to ("" when none).
  std::string ResumeState() const;
  // How many times Rejoin replaced the connection: a group acquired under
  // an earlier value belongs to a client given up, and must not be
  // released to the new one.
  uint64_t joins() const;
  // Reports the step EndStep just finished to shard 0's status page and
  // metrics: this rank's mean `loss`, the `samples` (sequences) it trained
  // on and the step's wall time. Never blocks; a report that cannot be sent
  // is dropped.
  void ReportStep(double loss, uint64_t samples, double step_seconds);
  // fp16 (DeepSpeed's dynamic or static loss scaling): the scale to multiply
  // this step's loss by; 1 without fp16.
  double loss_scale() const;
  // The learning rate the servers apply at the end of this step (the
  // config's schedule at the number of steps applied so far; a trainer that
  // joins late counts the cluster's steps as applied).
  double learning_rate() const;
  // Asks the coordinator for a checkpoint at the next step boundary (now,
  // when every trainer has ended the step) and waits until all shards have
  // committed it, at most `timeout_s`. FAILED_PRECONDITION when the servers
  // run without --checkpoint_dir. Blocks; changes nothing else.
  absl::StatusOr<TrainerCheckpoint> RequestCheckpoint(double timeout_s);
  // Opaque resume state at the start of the current step (saved in
  // checkpoints). Call before the step's first PushGradient.
  void SetResumeState(std::string state);

  TrainerStats stats() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  // NOT_FOUND / INVALID_ARGUMENT for a push that names a bad group,
  // micro-step or a null gradient of trainable tensors.
  absl::Status CheckPush(size_t group, const void* grad,
                         uint32_t micro_step) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_INCLUDE_ZSHARD_CLIENT_TRAINER_H_
