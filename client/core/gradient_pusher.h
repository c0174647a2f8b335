// GradientPusher: sends each group's gradient to the shards that own it, in
// the background, so backward overlaps communication. Push copies the
// gradient into a pooled buffer and returns; Flush waits for every push.
// Thread-safe; pushes run on an internal pool of threads.
#ifndef ZSHARD_CLIENT_CORE_GRADIENT_PUSHER_H_
#define ZSHARD_CLIENT_CORE_GRADIENT_PUSHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/core/cluster.h"
#include "client/core/data_plane.h"
#include "client/core/scratch_buffers.h"
#include "common/model/wire_format.h"
#include "zshard/kernels/cpu_kernels.h"
#include "common/base/thread_pool.h"
#include "common/model/partition_map.h"

namespace zshard {

struct GradientPusherOptions {
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Groups sent at once (a thread each; a group's slices to every shard go
  // from one thread). 0: one per shard.
  int push_threads = 0;
  // ZeRO stage 2: gradients are held until this many bytes are waiting, then
  // sent together once the previous bucket is acknowledged (0: each group at
  // once, stage 3).
  uint64_t bucket_bytes = 0;
  // ZeRO stage 1: every gradient is held until Flush.
  bool hold_until_flush = false;
  // Gradients are bf16 (2 bytes per element) instead of fp32.
  bool bf16 = false;
  // A quantized format (ZeRO++'s qgZ): each slice is quantized block-wise
  // (from fp32, or bf16 widened) before it goes; a block holding Inf or NaN
  // goes with a NaN scale (see PackQuantizedOrNan). Plain (default): off.
  WireFormat quantized;
  // Put into the shards' landing slots over the transport. Required; not
  // owned.
  DataPlane* data_plane = nullptr;
};

struct GradientPusherStats {
  uint64_t bytes_pushed = 0;
  uint64_t buffer_bytes = 0;
  uint64_t peak_buffer_bytes = 0;
};

class GradientPusher {
 public:
  // `cluster` and `map` must outlive the pusher.
  GradientPusher(Cluster* cluster, const PartitionMap* map,
                 const GradientPusherOptions& options);
  // Waits for pushes in flight (each bounded by its deadline).
  ~GradientPusher();

  // Copies the trainable elements of `grad` (GroupNumel(g) elements, fp32 or
  // bf16 per the options; with `trainable_only`, just the
  // trainable_numel(g) trainable ones, in order) and starts sending them as
  // this trainer's contribution to (step, micro_step). NOT_FOUND for an
  // unknown group. Errors of the sends are reported by Flush.
  absl::Status Push(size_t g, const void* grad, uint64_t step,
                    uint32_t micro_step, bool trainable_only = false);
  // A buffer for group g's gradient (GroupNumel(g) elements) that Push(g,
  // buffer, ...) takes over instead of copying: the caller writes the
  // gradient there, not into a buffer of its own. Null for an unknown group
  // or one with frozen elements (Push then copies, as always). The same
  // buffer until that Push; one given to no Push goes back to the pool at
  // the group's next Push.
  void* Lend(size_t g);

  // Attaches `state` (opaque, at most 64 KiB) to the current step: the
  // trainer's resume state at the start of it, sent once, with the step's
  // first push to shard 0 (the coordinator, whose copy checkpoints keep).
  // Call between steps.
  void SetTrainerState(std::string state);

  // Sends what is held, then blocks until every push so far has been
  // acknowledged by its shard (or failed, or its deadline passed). Returns the
  // first error, naming the shard, and clears it.
  absl::Status Flush();

  GradientPusherStats stats() const;

 private:
  // How long a wait for the sends in flight may take.
  absl::Duration SendBound() const;
  struct Pending {
    std::unique_ptr<uint8_t[]> data;
    size_t numel = 0;
    int shards_left = 0;
  };
  struct Held {
    std::shared_ptr<Pending> pending;
    size_t group;
    uint64_t step;
    uint32_t micro_step;
  };
  // Records a slice's outcome and recycles the buffer after the last one.
  void Finished(std::shared_ptr<Pending> p, size_t g, uint32_t shard,
                uint64_t step, const absl::Status& st, uint64_t sent);
  // Sends group g's slices to every shard that owns one: all started, then
  // their answers waited for together (a thread per slice, each waking for
  // its own answer, cost more context switches than the slices' work). A
  // pool thread.
  void SendGroup(std::shared_ptr<Pending> p, size_t g, uint64_t step,
                 uint32_t micro_step);
  // A slice started (StartPush), with the quantized bytes it put (kept until
  // its answer is in) and how many bytes it sent.
  struct Sent {
    DataPlane::StartedPush push;
    std::vector<float> packed;
    uint64_t bytes = 0;
  };
  Sent StartSlice(const Pending& p, size_t g, uint32_t shard, uint64_t step,
                  uint32_t micro_step);
  // Encodes `numel` values at `data` (fp32 or bf16) in options.quantized
  // into `out` (a scratch buffer it sizes). Any push thread.
  absl::Status Quantize(const void* data, size_t numel,
                        std::vector<float>* out);
  void SendLocked(const Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer of `numel` elements: a pooled one, else a new one (in bucket
  // mode after dropping pooled buffers of other sizes to stay under the cap).
  std::unique_ptr<uint8_t[]> TakeBufferLocked(uint64_t numel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendHeldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Bytes of buffers (held, in flight and pooled) kept at most in bucket
  // mode: two buckets (one filling, one in flight), each at most the bucket
  // plus the largest group; unbounded otherwise.
  uint64_t BufferCap() const;

  Cluster* const cluster_;
  const PartitionMap* const map_;
  const GradientPusherOptions options_;
  const size_t elem_;  // bytes per element
  uint64_t max_group_bytes_ = 0;

  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // shard sends outstanding
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> pool_ ABSL_GUARDED_BY(mu_);
  // Lend's buffers, by group, until their Push.
  std::map<size_t, std::unique_ptr<uint8_t[]>> lent_ ABSL_GUARDED_BY(mu_);
  GradientPusherStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string trainer_state_ ABSL_GUARDED_BY(mu_);
  // The step whose push to shard 0 carried trainer_state_ already.
  uint64_t state_sent_step_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;

  // Quantized pushes: their staging memory and (one thread's) kernels,
  // which every push thread may call at once.
  ScratchBuffers scratch_;
  std::unique_ptr<kernels::CpuKernels> kernels_;
  absl::Status kernels_error_;  // why kernels_ is null (quantized only)

  std::unique_ptr<ThreadPool> threads_;  // last: joined first
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_GRADIENT_PUSHER_H_
