#include "server/step_barrier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

// How often a blocked wait re-checks its caller's cancellation.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

StepBarrier::StepBarrier(uint32_t shard_id, uint32_t world_size, size_t groups,
                         uint64_t step, const Roster* roster)
    : shard_id_(shard_id),
      groups_(groups),
      roster_(roster),
      step_(step),
      committed_(world_size, 0) {}

bool StepBarrier::ReadyLocked() const {
  if (finishing_ || !error_.ok() || groups_reduced_ < groups_) return false;
  for (uint32_t r = 0; r < committed_.size(); ++r) {
    if (!committed_[r] && ExpectedLocked(r)) return false;
  }
  return true;
}

absl::StatusOr<StepBarrier::CommitResult> StepBarrier::Commit(uint64_t step, uint32_t rank,
                                                              bool overflow,
                                                              double loss_scale) {
  absl::MutexLock lock(&mu_);
  CommitResult r;
  auto done = decided_.find(step);
  if (done != decided_.end()) {
    r.decided = true;
    r.decision = done->second;
    return r;
  }
  if (!error_.ok()) return error_;
  if (step != step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "commit of step ", step, " is from the ", step < step_ ? "past" : "future", ": shard ",
        shard_id_, " is collecting step ", step_));
  }
  if (roster_) {
    absl::Status member = roster_->CheckContributor(rank, step);
    if (!member.ok()) {
      return absl::Status(member.code(), absl::StrCat("shard ", shard_id_, ": ",
                                                      member.message()));
    }
  }
  if (loss_scale_ != 0 && loss_scale_ != loss_scale) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " commits step ", step, " with loss scale ", loss_scale,
        " but another trainer used ", loss_scale_));
  }
  committed_[rank] = 1;
  overflow_ |= overflow;
  loss_scale_ = loss_scale;
  r.ready = ReadyLocked();
  if (r.ready) finishing_ = true;
  return r;
}

bool StepBarrier::GroupReduced() {
  absl::MutexLock lock(&mu_);
  ++groups_reduced_;
  const bool ready = ReadyLocked();
  if (ready) finishing_ = true;
  return ready;
}

bool StepBarrier::RosterChanged() {
  absl::MutexLock lock(&mu_);
  const bool ready = ReadyLocked();
  if (ready) finishing_ = true;
  return ready;
}

StepBarrier::Pending StepBarrier::pending() const {
  absl::MutexLock lock(&mu_);
  return Pending{step_, overflow_, loss_scale_};
}

void StepBarrier::Decided(uint64_t step, const StepDecision& decision) {
  absl::MutexLock lock(&mu_);
  decided_[step] = decision;
  while (decided_.size() > 8) decided_.erase(decided_.begin());
  step_ = step + 1;
  std::fill(committed_.begin(), committed_.end(), 0);
  overflow_ = false;
  loss_scale_ = 0;
  groups_reduced_ = 0;
  finishing_ = false;
}

void StepBarrier::Failed(const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  error_ = error;
  finishing_ = false;
}

absl::StatusOr<StepDecision> StepBarrier::Await(uint64_t step, absl::Time deadline,
                                                const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return decided_.count(step) > 0 || !error_.ok();
  };
  while (!ready()) {
    if (cancelled && cancelled()) return absl::CancelledError("commit cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::string missing;
      for (uint32_t r = 0; r < committed_.size(); ++r) {
        if (!committed_[r] && ExpectedLocked(r)) {
          absl::StrAppend(&missing, missing.empty() ? "" : ",", r);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", shard_id_, ": step ", step, " not decided by the deadline",
          missing.empty() ? " (waiting for gradients or the other shards)"
                          : absl::StrCat(" (trainer ranks ", missing, " have not committed)")));
    }
    mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, now + kCancelPoll));
  }
  auto done = decided_.find(step);
  if (done == decided_.end()) return error_;
  return done->second;
}

void StepBarrier::Reset(uint64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
}

}  // namespace zshard
