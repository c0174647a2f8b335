// LeaseTable: which trainer is reading which published slot (DESIGN.md,
// "Data plane"). A shard publishes each group's values at version v in slot
// v % 2 and may overwrite a slot only when no lease on it is active; a lease
// ends when its trainer releases it or at its deadline (a trainer that died
// holds nothing for longer). Thread-safe.
#ifndef ZSHARD_SERVER_LEASE_TABLE_H_
#define ZSHARD_SERVER_LEASE_TABLE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zshard {

class LeaseTable {
 public:
  explicit LeaseTable(absl::Duration timeout) : timeout_(timeout) {}

  absl::Duration timeout() const { return timeout_; }

  // A new lease of (group, slot) for `rank` until now + timeout; its id.
  uint64_t Grant(uint32_t group, int slot, uint32_t rank);
  // Ends `rank`'s leases `ids`. Ids that already ended are ignored;
  // INVALID_ARGUMENT for an id never granted or granted to another rank
  // (nothing is released then).
  absl::Status Release(uint32_t rank, const std::vector<uint64_t>& ids);
  // Ends every lease `rank` holds (a dropped trainer); how many.
  size_t ReleaseRank(uint32_t rank);
  // Ends every lease past its deadline; how many.
  size_t Expire(absl::Time now);
  // Active leases of (group, slot) (after expiring old ones).
  int Active(uint32_t group, int slot);
  // The latest deadline of (group, slot)'s active leases: by then the slot
  // is free whatever its readers do. InfinitePast when none is active.
  absl::Time LastDeadline(uint32_t group, int slot);

  struct RankStats {
    uint64_t active = 0;
    uint64_t granted = 0;
    uint64_t expired = 0;  // ended by their deadline, not released
  };
  std::map<uint32_t, RankStats> Stats();

 private:
  struct Entry {
    uint32_t group;
    int slot;
    uint32_t rank;
    absl::Time deadline;
  };
  void EndLocked(std::map<uint64_t, Entry>::iterator it, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, int>, int> active_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, RankStats> stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_LEASE_TABLE_H_
