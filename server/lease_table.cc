#include "server/lease_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zshard {

uint64_t LeaseTable::Grant(uint32_t group, int slot, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  leases_[id] = Entry{group, slot, rank, absl::Now() + timeout_};
  ++active_[{group, slot}];
  RankStats& s = stats_[rank];
  ++s.active;
  ++s.granted;
  return id;
}

void LeaseTable::EndLocked(std::map<uint64_t, Entry>::iterator it, bool expired) {
  const Entry& e = it->second;
  auto a = active_.find({e.group, e.slot});
  if (a != active_.end() && --a->second == 0) active_.erase(a);
  RankStats& s = stats_[e.rank];
  --s.active;
  if (expired) ++s.expired;
  leases_.erase(it);
}

absl::Status LeaseTable::Release(uint32_t rank, const std::vector<uint64_t>& ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    if (id == 0 || id >= next_id_) {
      return absl::InvalidArgumentError(absl::StrCat("lease ", id, " was never granted"));
    }
    auto it = leases_.find(id);
    if (it != leases_.end() && it->second.rank != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease ", id, " belongs to trainer ", it->second.rank, ", not ", rank));
    }
  }
  for (uint64_t id : ids) {
    auto it = leases_.find(id);
    if (it != leases_.end()) EndLocked(it, /*expired=*/false);
  }
  return absl::OkStatus();
}

size_t LeaseTable::ReleaseRank(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.rank == rank) {
      EndLocked(it++, /*expired=*/false);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

size_t LeaseTable::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline <= now) {
      EndLocked(it++, /*expired=*/true);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int LeaseTable::Active(uint32_t group, int slot) {
  Expire(absl::Now());
  absl::MutexLock lock(&mu_);
  auto it = active_.find({group, slot});
  return it == active_.end() ? 0 : it->second;
}

absl::Time LeaseTable::LastDeadline(uint32_t group, int slot) {
  absl::MutexLock lock(&mu_);
  absl::Time last = absl::InfinitePast();
  for (const auto& [id, e] : leases_) {
    if (e.group == group && e.slot == slot) last = std::max(last, e.deadline);
  }
  return last;
}

std::map<uint32_t, LeaseTable::RankStats> LeaseTable::Stats() {
  Expire(absl::Now());
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zshard
