#include "server/landing_pool.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<LandingPool>> LandingPool::Create(
    const LandingPoolOptions& options) {
  if (options.slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options.shard_id,
                     ": the landing pool needs at least 1 slot"));
  }
  std::unique_ptr<LandingPool> p(new LandingPool(options));
  const size_t bytes = p->bytes();
  if (bytes > 0 && options.transport) {
    ZS_ASSIGN_OR_RETURN(p->region_, options.transport->Allocate(bytes));
    p->base_ = static_cast<char*>(p->region_->data());
  } else if (bytes > 0) {
    p->own_.reset(new (std::nothrow) char[bytes]);
    if (!p->own_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shard ", options.shard_id, ": no memory for the ",
                       bytes, "-byte landing pool"));
    }
    p->base_ = p->own_.get();
  }
  absl::MutexLock lock(&p->mu_);
  // Lowest slot first (pop_back).
  for (uint32_t s = options.slots; s-- > 0;) p->free_.push_back(s);
  return p;
}

uint32_t LandingPool::TakeLocked() {
  const uint32_t s = free_.back();
  free_.pop_back();
  ++stats_.taken;
  stats_.in_use = options_.slots - static_cast<uint32_t>(free_.size());
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return s;
}

void LandingPool::ReleaseExpiredLocked(absl::Time now) {
  for (auto it = quarantine_.begin(); it != quarantine_.end();) {
    auto& slots = it->second;
    for (size_t i = 0; i < slots.size();) {
      if (slots[i].second <= now) {
        free_.push_back(slots[i].first);
        --stats_.quarantined;
        ++epoch_;
        slots[i] = slots.back();
        slots.pop_back();
      } else {
        ++i;
      }
    }
    it = slots.empty() ? quarantine_.erase(it) : std::next(it);
  }
  stats_.in_use = options_.slots - static_cast<uint32_t>(free_.size());
}

std::optional<uint32_t> LandingPool::TryTake(uint32_t keep_free) {
  absl::MutexLock lock(&mu_);
  ReleaseExpiredLocked(absl::Now());
  if (free_.size() <= keep_free) return std::nullopt;
  return TakeLocked();
}

std::optional<uint32_t> LandingPool::GrantCredit(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  ReleaseExpiredLocked(absl::Now());
  // Credits leave two slots to reservations (the last one for in-order
  // contributions, one for another).
  const size_t most = options_.slots > 2 ? options_.slots - 2 : 0;
  if (free_.size() <= 1 || credit_.size() >= most || credit_.count(rank) > 0) {
    return std::nullopt;
  }
  const uint32_t s = TakeLocked();
  credit_[rank] = s;
  stats_.credits = static_cast<uint32_t>(credit_.size());
  return s;
}

bool LandingPool::RedeemCredit(uint32_t slot, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = credit_.find(rank);
  if (it == credit_.end() || it->second != slot) return false;
  credit_.erase(it);
  stats_.credits = static_cast<uint32_t>(credit_.size());
  return true;
}

void LandingPool::QuarantineLocked(uint32_t rank, uint32_t slot) {
  quarantine_[rank].emplace_back(slot, absl::Now() + options_.quarantine);
  ++stats_.quarantined;
}

void LandingPool::Quarantine(uint32_t rank, uint32_t slot) {
  absl::MutexLock lock(&mu_);
  QuarantineLocked(rank, slot);
}

void LandingPool::DropRank(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = credit_.find(rank);
  if (it == credit_.end()) return;
  QuarantineLocked(rank, it->second);
  credit_.erase(it);
  stats_.credits = static_cast<uint32_t>(credit_.size());
}

void LandingPool::ForgetCredit(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto q = quarantine_.find(rank);
  if (q != quarantine_.end()) {
    for (const auto& [slot, until] : q->second) free_.push_back(slot);
    stats_.quarantined -= static_cast<uint32_t>(q->second.size());
    quarantine_.erase(q);
  }
  auto it = credit_.find(rank);
  if (it != credit_.end()) {
    free_.push_back(it->second);
    credit_.erase(it);
  }
  stats_.credits = static_cast<uint32_t>(credit_.size());
  stats_.in_use = options_.slots - static_cast<uint32_t>(free_.size());
  ++epoch_;
}

void LandingPool::Give(uint32_t slot) {
  absl::MutexLock lock(&mu_);
  free_.push_back(slot);
  stats_.in_use = options_.slots - static_cast<uint32_t>(free_.size());
  ++epoch_;
}

void LandingPool::Notify() {
  absl::MutexLock lock(&mu_);
  ++epoch_;
}

uint64_t LandingPool::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

bool LandingPool::AwaitChange(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto moved = [this, seen]()
                   ABSL_NO_THREAD_SAFETY_ANALYSIS { return epoch_ != seen; };
  return mu_.AwaitWithDeadline(absl::Condition(&moved), deadline);
}

LandingPool::Stats LandingPool::stats() {
  absl::MutexLock lock(&mu_);
  ReleaseExpiredLocked(absl::Now());
  return stats_;
}

}  // namespace zshard
