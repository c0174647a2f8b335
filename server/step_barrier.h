// StepBarrier: the decision stage of a shard's step when it needs one (fp16
// loss scaling or gradient clipping; DESIGN.md, "One training step"). Every
// trainer commits the step (CommitStep) with its overflow flag and loss
// scale; once every trainer has committed and every group with elements here
// is reduced, the update engine decides the step (norm and inf/nan over all
// shards through a NormExchange) and applies or skips it everywhere.
//
// Thread-safety: every method may be called from any thread. Commit and
// GroupReduced return true exactly once per step: to the caller whose event
// made the step ready, which must then have the engine decide it.
#ifndef ZSHARD_SERVER_STEP_BARRIER_H_
#define ZSHARD_SERVER_STEP_BARRIER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/roster.h"

namespace zshard {

// What CommitStep answers once a step is decided.
struct StepDecision {
  bool skipped = false;
  double grad_norm = 0;
};

class StepBarrier {
 public:
  // Collects `step` first; a step is ready once `groups` groups are reduced
  // and every trainer the roster expects at it (all `world_size` without a
  // roster; not owned) committed.
  StepBarrier(uint32_t shard_id, uint32_t world_size, size_t groups,
              uint64_t step, const Roster* roster = nullptr);

  // Trainer `rank` ends `step`. Returns the decision when `step` is decided
  // already (answered again), else whether this commit made the step ready.
  // FAILED_PRECONDITION for a step other than the one collected, after a
  // step failed (its error), or for a loss scale that differs from another
  // trainer's; nothing changes then.
  struct CommitResult {
    bool decided = false;
    StepDecision decision;
    bool ready = false;
  };
  absl::StatusOr<CommitResult> Commit(uint64_t step, uint32_t rank, bool overflow,
                                      double loss_scale);
  // Engine: one more group of the collected step is reduced; true when that
  // made the step ready.
  bool GroupReduced();
  // Engine: the roster changed (a trainer the step waited for was dropped);
  // true when that made the step ready.
  bool RosterChanged();

  // Engine: what the ready step's decision needs.
  struct Pending {
    uint64_t step = 0;
    bool overflow = false;
    double loss_scale = 1;
  };
  Pending pending() const;
  // Engine: the ready step is decided (and applied); the next is collected.
  void Decided(uint64_t step, const StepDecision& decision);
  // Engine: the ready step could not be decided; every later commit and
  // wait returns `error`.
  void Failed(const absl::Status& error);

  // Blocks until `step` is decided or failed, `deadline` (DEADLINE_EXCEEDED
  // naming the ranks that have not committed) or `cancelled()`.
  absl::StatusOr<StepDecision> Await(uint64_t step, absl::Time deadline,
                                     const std::function<bool()>& cancelled);

  // Restore: collects `step` next.
  void Reset(uint64_t step);

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ExpectedLocked(uint32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !roster_ || roster_->Expected(rank, step_);
  }

  const uint32_t shard_id_;
  const size_t groups_;
  const Roster* const roster_;
  mutable absl::Mutex mu_;
  uint64_t step_ ABSL_GUARDED_BY(mu_);
  std::vector<char> committed_ ABSL_GUARDED_BY(mu_);  // per rank
  bool overflow_ ABSL_GUARDED_BY(mu_) = false;
  double loss_scale_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no commit yet
  size_t groups_reduced_ ABSL_GUARDED_BY(mu_) = 0;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // handed to the engine
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, StepDecision> decided_ ABSL_GUARDED_BY(mu_);  // recent steps
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_STEP_BARRIER_H_
