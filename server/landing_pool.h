// LandingPool: the bounded set of slots a shard's gradient contributions
// land in (DESIGN.md, "The server's step as a pipeline"). One transport
// region of `slots` equal slots, each as large as the shard's largest
// contribution, shared by every group: a contribution holds a slot from
// its reservation until the reduce has folded it into its group's
// accumulator. Memory is slots x slot bytes whatever the number of
// trainers or accumulation steps; trainers wait (within their deadline)
// for a slot instead.
//
// Admission keeps a slot for the contributions that can be folded at once
// (see ContributionBuffer::InOrder): TryTake(keep_free = 1) for any other,
// so the pool never fills with contributions that wait for one that cannot
// land. A trainer may also hold one credit per shard: a slot granted with
// the answer to its last contribution, for its next one whatever the group
// (so a push needs no reservation round trip); at most slots - 2 credits
// are out at once, and never the last free slot.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZSHARD_SERVER_LANDING_POOL_H_
#define ZSHARD_SERVER_LANDING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"

namespace zshard {

struct LandingPoolOptions {
  uint32_t shard_id = 0;
  uint32_t slots = 4;
  size_t slot_bytes = 0;
  // Allocates the region (registered, so peers can put into it); null:
  // plain memory, filled only in process. Not owned.
  Transport* transport = nullptr;
  // How long a dropped trainer's slots stay out of use (see Quarantine).
  absl::Duration quarantine = absl::Seconds(10);
};

class LandingPool {
 public:
  // INVALID_ARGUMENT for 0 slots; RESOURCE_EXHAUSTED when the memory cannot
  // be had. A pool of 0-byte slots has no region.
  static absl::StatusOr<std::unique_ptr<LandingPool>> Create(
      const LandingPoolOptions& options);
  LandingPool(const LandingPool&) = delete;
  LandingPool& operator=(const LandingPool&) = delete;

  uint32_t slots() const { return options_.slots; }
  size_t slot_bytes() const { return options_.slot_bytes; }
  size_t bytes() const { return options_.slot_bytes * options_.slots; }
  // The registered region (slot i at i x slot_bytes()); null without a
  // transport or with 0-byte slots.
  const MemoryRegion* region() const { return region_.get(); }
  // Slot i's memory (valid for the pool's life).
  char* slot_data(uint32_t slot) const {
    return base_ + static_cast<size_t>(slot) * options_.slot_bytes;
  }

  // Takes a free slot when more than `keep_free` are free; nullopt
  // otherwise. Never blocks.
  std::optional<uint32_t> TryTake(uint32_t keep_free);
  // Returns a taken slot; wakes AwaitChange.
  void Give(uint32_t slot);

  // A credit for trainer `rank`: a slot for its next contribution, taken
  // only while more than one slot is free, fewer than slots - 2 credits
  // are out, and `rank` holds none yet.
  std::optional<uint32_t> GrantCredit(uint32_t rank);
  // `rank` uses its credit `slot`: the slot is the caller's from now on.
  // False (nothing changes) when `slot` is not `rank`'s credit.
  bool RedeemCredit(uint32_t slot, uint32_t rank);
  // Gives back the credit `rank` holds and the slots quarantined for it, if
  // any (a new trainer process joined with that rank).
  void ForgetCredit(uint32_t rank);
  // A taken slot of dropped trainer `rank` that it may still be writing
  // (its process may only be stopped): kept out of use for
  // options.quarantine, or until ForgetCredit(rank). A process stopped in
  // the middle of a put for longer than the trainer timeout plus that, then
  // resumed, could still write into a slot in use again: the price of never
  // leaving the survivors without slots.
  void Quarantine(uint32_t rank, uint32_t slot);
  // `rank` was dropped: its credit, if any, is quarantined.
  void DropRank(uint32_t rank);

  // Something a waiting reservation's admission depends on changed (a
  // contribution reserved or landed): wakes AwaitChange.
  void Notify();
  // A counter that moves on every Give and Notify.
  uint64_t epoch() const;
  // Blocks until epoch() differs from `seen` (true) or `deadline` (false).
  bool AwaitChange(uint64_t seen, absl::Time deadline) const;

  struct Stats {
    uint32_t in_use = 0;
    uint32_t peak_in_use = 0;
    uint64_t taken = 0;  // slots handed out so far
    uint32_t credits = 0;  // held by trainers now
    uint32_t quarantined = 0;  // of dropped trainers
  };
  // (Frees quarantined slots whose time is up first.)
  Stats stats();

 private:
  explicit LandingPool(const LandingPoolOptions& options) : options_(options) {}

  const LandingPoolOptions options_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<char[]> own_;  // without a transport
  char* base_ = nullptr;

  mutable absl::Mutex mu_;
  // Takes the lowest free slot. mu_ held; free_ not empty.
  uint32_t TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the quarantined slots whose time is up.
  void ReleaseExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QuarantineLocked(uint32_t rank, uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint32_t> credit_ ABSL_GUARDED_BY(mu_);  // rank -> slot
  // rank -> (slot, free again at)
  std::map<uint32_t, std::vector<std::pair<uint32_t, absl::Time>>> quarantine_
      ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_LANDING_POOL_H_
