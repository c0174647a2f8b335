// UpdateEngine: the thread that does a shard's step work (DESIGN.md, "The
// server's step as a pipeline"; BytePS's server engine is the model). RPC
// handlers only validate and record (contributions landing, trainers
// committing) and hand the rest here: fold a group's contributions into
// its accumulator in their fixed order as they land, decide the step when there
// is a barrier (norm and inf/nan over all shards), update it (AdamW into the
// free publish slot), publish it, and tell the subscribers "group g is at
// version v" (checkpoint staging).
//
// One thread; work items run in the order they were posted. Thread-safety:
// every public method may be called from any thread. The stages it is given
// must outlive it.
#ifndef ZSHARD_SERVER_UPDATE_ENGINE_H_
#define ZSHARD_SERVER_UPDATE_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/contribution_buffer.h"
#include "server/norm_exchange.h"
#include "server/optimizer.h"
#include "server/publisher.h"
#include "server/step_barrier.h"

namespace zshard {

struct UpdateEngineStages {
  uint32_t shard_id = 0;
  // Per group, indexed like the optimizer's groups.
  std::vector<ContributionBuffer*> contributions;
  Optimizer* optimizer = nullptr;
  Publisher* publisher = nullptr;
  // Null without a barrier: each group is updated once reduced.
  StepBarrier* barrier = nullptr;
  // Null: this shard's totals are the step's (one shard).
  NormExchange* exchange = nullptr;
  // Clip the averaged gradient to this global L2 norm (0: off; barrier only).
  double gradient_clipping = 0;
  // Longest the barrier's decision waits for the other shards.
  absl::Duration decision_timeout = absl::Seconds(120);
};

class UpdateEngine {
 public:
  // Called on the engine thread after `group` was published at `version`
  // (`skipped`: by a step skipped everywhere).
  using PublishedFn = std::function<void(uint32_t group, uint64_t version, bool skipped)>;

  // Starts the thread. `published` may be empty.
  UpdateEngine(const UpdateEngineStages& stages, PublishedFn published);
  // Stops the thread after the item in progress; items not started are
  // dropped.
  ~UpdateEngine();
  // The same, now (a rollback retires the engine while RPC handlers may
  // still post to it): later items are dropped, Run answers ABORTED.
  // Idempotent; never from the engine thread.
  void Stop();
  UpdateEngine(const UpdateEngine&) = delete;
  UpdateEngine& operator=(const UpdateEngine&) = delete;

  // A contribution of `group` landed that may be folded now.
  void ContributionLanded(uint32_t group);
  // The barrier's step became ready by a commit.
  void DecideStep();
  // The membership changes: on the engine thread `change` runs (it changes
  // the roster; no fold runs meanwhile), every group is folded again (a
  // dropped trainer's missing contributions are excused), the barrier is
  // re-checked, then `after` runs. Either may be empty.
  void RosterChanged(std::function<void()> change, std::function<void()> after);
  // Runs `fn` on the engine thread, between other items, and returns its
  // status; DEADLINE_EXCEEDED if it has not finished by `deadline` (it
  // still runs later, so it must own what it uses).
  absl::Status Run(std::function<absl::Status()> fn, absl::Time deadline);

  // The reduce's work so far: contributions folded, their elements, and the
  // time folding took.
  struct ReduceStats {
    uint64_t contributions = 0;
    uint64_t elements = 0;
    double seconds = 0;
  };
  ReduceStats reduce_stats() const;

  // The optimizer's work so far, and the step period: the interval between
  // successive versions of the first group with elements on this shard
  // (every group advances once per step, so over a run its period is the
  // step time as this shard sees it).
  struct UpdateStats {
    uint64_t updates = 0;
    double update_seconds = 0;
    uint64_t steps_timed = 0;
    double step_seconds_sum = 0;
    double last_step_seconds = 0;
  };
  UpdateStats update_stats() const;

 private:
  void Post(std::function<void()> item);
  void Loop();
  // Folds what `group` can; on the step's last fold, updates (or, with a
  // barrier, reports the group reduced).
  void Fold(uint32_t group);
  void Decide();
  void UpdateAndPublish(uint32_t group, float* grad, float grad_scale, bool skip);

  const UpdateEngineStages stages_;
  const PublishedFn published_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> items_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex stats_mu_;
  ReduceStats reduce_stats_ ABSL_GUARDED_BY(stats_mu_);
  UpdateStats update_stats_ ABSL_GUARDED_BY(stats_mu_);
  // Per group: contributions in the collected step's sum once reduced (the
  // averaging divisor; engine thread only).
  std::vector<uint32_t> summed_;
  // The group whose versions time the steps (engine thread only).
  uint32_t timed_group_ = 0;
  absl::Time last_timed_version_ = absl::InfinitePast();
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_UPDATE_ENGINE_H_
