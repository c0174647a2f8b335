// Roster: which trainer ranks a shard's step waits for (DESIGN.md,
// "Coordinator and membership"). The coordinator decides the membership;
// every shard keeps this copy of it, which its contribution buffers and step
// barrier consult. A rank is expected at step s while it is a member and s is
// at or after the step it was admitted at. A dropped rank is expected at no
// step: what it landed of a step still counts, what it had not is excused.
//
// At start the ranks [0, initial) are members from the start step (the number
// a first step waits for); the other ranks up to `max_ranks` may join later.
// A step passes over ranks it no longer expects only while at least
// `min_members` ranks are members (a quorum); with fewer, it waits, since the
// next trainer admitted may still contribute to it. Admission is in two phases
// so no group passes the admission step on any shard before every shard knows
// it: Prepare makes the rank a member from the lowest step this shard can still
// admit it at (which holds the shard's groups there), Admit moves that to the
// step the coordinator chose (the highest any shard answered).
//
// Thread-safety: every method may be called from any thread. Callers may hold
// their own locks (the roster never calls out).
#ifndef ZSHARD_SERVER_ROSTER_H_
#define ZSHARD_SERVER_ROSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace zshard {

class Roster {
 public:
  // `max_ranks` ranks exist; [0, initial) are members from `start_step`;
  // a quorum is `min_members` members (at least 1).
  Roster(uint32_t max_ranks, uint32_t initial, uint64_t start_step,
         uint32_t min_members = 1);
  Roster(const Roster&) = delete;
  Roster& operator=(const Roster&) = delete;

  uint32_t max_ranks() const { return max_ranks_; }

  // Whether a step at `step` waits for `rank`'s contributions.
  bool Expected(uint32_t rank, uint64_t step) const;
  // OK when `rank` may contribute to `step`; otherwise FAILED_PRECONDITION
  // saying why (dropped, not admitted yet, admitted at a later step),
  // INVALID_ARGUMENT for a rank out of range.
  absl::Status CheckContributor(uint32_t rank, uint64_t step) const;

  // Phase 1: `rank` (INVALID_ARGUMENT out of range) becomes a member from
  // `from_step`, shown as `identity`.
  absl::Status Prepare(uint32_t rank, uint64_t from_step,
                       const std::string& identity);
  // Phase 2: the member `rank` is expected from `from_step` on (a later step
  // than Prepare's, or the same). FAILED_PRECONDITION when it is not a member.
  absl::Status Admit(uint32_t rank, uint64_t from_step);
  // `rank` is no member any more (idempotent); `reason` is what
  // CheckContributor tells it.
  void Drop(uint32_t rank, const std::string& reason);

  // A rollback: `members` (ranks out of range ignored) are members from
  // `start_step`, the others not; nobody counts as dropped. The members'
  // contributions are refused until they are prepared and admitted again
  // (a trainer's client from before the rollback may still push).
  void Reset(const std::vector<uint32_t>& members, uint64_t start_step);

  // Members and the step each is expected from (status).
  struct Member {
    uint32_t rank = 0;
    uint64_t from_step = 0;
    std::string identity;
  };
  std::vector<Member> Members() const;
  // Whether at least the quorum of ranks are members: only then does a step
  // go on without the ranks it no longer expects (and a step nobody
  // contributed to is skipped); otherwise a group waits for a trainer.
  bool Quorate() const;
  // The identity of `rank` ("" when unknown), for messages.
  std::string Identity(uint32_t rank) const;
  // Moves on every change.
  uint64_t epoch() const;

 private:
  struct Entry {
    bool member = false;
    uint64_t from_step = 0;
    std::string identity;
    std::string dropped_because;  // set once dropped
    bool sealed = false;          // rolled back, not admitted again yet
  };
  const uint32_t max_ranks_;
  const uint32_t min_members_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_ROSTER_H_
