// Membership: which trainer process holds each rank, and what happened to
// the ranks (DESIGN.md, "Coordinator and membership"). A Join names the
// process (host, pid, a random instance id) and holds a rank while the
// process heartbeats; Admit lets every shard expect it from a step; a
// trainer that stops heartbeating for the timeout, leaves, or is replaced
// by a new join of its rank is dropped on every shard, so no step waits for
// it. A join never admitted (a half-finished or garbage one) expires after
// the timeout and holds nothing.
//
// The shards are reached through a ShardFanout (the coordinator's); a
// watchdog thread drops expired trainers. Thread-safety: every method may be
// called from any thread; changes to the shards' rosters are serialized.
#ifndef ZSHARD_SERVER_COORDINATOR_MEMBERSHIP_H_
#define ZSHARD_SERVER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint/manifest.h"
#include "zshard/v1/admin.pb.h"

namespace zshard {

// How the membership reaches every shard's roster (see server/roster.h).
class ShardFanout {
 public:
  virtual ~ShardFanout() = default;
  // Phase 1 on every shard: the highest step any answered.
  virtual absl::StatusOr<uint64_t> PrepareAdmit(uint32_t rank,
                                                uint64_t min_step,
                                                const std::string& identity,
                                                absl::Time deadline) = 0;
  // Phase 2 on every shard.
  virtual absl::Status Admit(uint32_t rank, uint64_t step,
                             absl::Time deadline) = 0;
  // On every shard it can reach (best effort; errors are returned joined).
  virtual absl::Status Drop(uint32_t rank, const std::string& reason,
                            absl::Time deadline) = 0;
  // The step in progress as shard 0 sees it (its newest group version).
  virtual uint64_t CurrentStep() = 0;
};

// A history event as a checkpoint's manifest keeps it, and back.
MembershipRecord ToRecord(const v1::MembershipEvent& e);
v1::MembershipEvent FromRecord(const MembershipRecord& r);

struct TrainerIdentity {
  std::string host;
  uint32_t pid = 0;
  uint64_t instance = 0;
  std::string ToString() const;  // "host:pid (instance 1a2b...)"
};

struct MembershipOptions {
  uint32_t ranks = 1;
  // No heartbeat for this long: dropped (or, never admitted, expired).
  absl::Duration trainer_timeout = absl::Seconds(10);
};

class Membership {
 public:
  // `fanout` is not owned and outlives this object. Starts the watchdog.
  Membership(const MembershipOptions& options, ShardFanout* fanout);
  // Stops the watchdog.
  ~Membership();
  // Stops the watchdog now (nobody is dropped for silence from then on):
  // for a server that stops, before the store the fanout reads goes.
  // Idempotent.
  void StopWatchdog();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const MembershipOptions& options() const { return options_; }
  // How often a trainer should heartbeat.
  absl::Duration heartbeat_interval() const {
    return options_.trainer_timeout / 5;
  }

  // A rank for `who`: `requested` (0..ranks-1) or the lowest free one (-1).
  // INVALID_ARGUMENT without an instance id; ALREADY_EXISTS when the rank
  // asked for is held by another live process (named); RESOURCE_EXHAUSTED
  // when every rank is. A rank held by a process not seen for the timeout is
  // taken over (that one is dropped first). The same instance joining again
  // gets its rank again.
  absl::StatusOr<uint32_t> Join(int64_t requested, const TrainerIdentity& who);
  // FAILED_PRECONDITION naming why when `instance` does not hold `rank`
  // (dropped, replaced, never joined): the process must join again.
  absl::Status Heartbeat(uint32_t rank, uint64_t instance);
  // Admits the holder of `rank` on every shard; the step it starts at.
  absl::StatusOr<uint64_t> Admit(uint32_t rank, uint64_t instance,
                                 absl::Time deadline);
  // The holder leaves: dropped everywhere with `reason`.
  absl::Status Leave(uint32_t rank, uint64_t instance,
                     const std::string& reason);

  // A shard was replaced and the cluster goes back to `step`: `apply` runs
  // (no admission or drop meanwhile) with the admitted ranks, which it makes
  // every shard expect from `step` (refusing their contributions until
  // they are admitted again: their old clients' pushes must not land); each
  // of those holders must Admit again, and the history says so. `apply`'s
  // error changes nothing here.
  absl::Status RollBack(
      uint64_t step, const std::string& reason,
      const std::function<absl::Status(const std::vector<uint32_t>& ranks)>&
          apply);

  // A new coordinator took over (shard 0 was replaced) with the cluster at
  // `step`, whose shards expect `ranks` from there: each rank is held for
  // the trainer that held it until it joins again (any join asking for that
  // rank takes it) or twice the timeout passes (then it is dropped
  // everywhere).
  // Call before trainers join.
  void Adopt(const std::vector<uint32_t>& ranks, uint64_t step,
             const std::string& reason);

  // The history (oldest first; the newest 256 events), and a history to
  // continue from (a new coordinator keeps its predecessor's).
  std::vector<v1::MembershipEvent> History() const;
  void RestoreHistory(const std::vector<v1::MembershipEvent>& events);

  // For status: the ranks held and the history (newest last).
  void Fill(v1::GetStatusResponse* status) const;
  // The identity of `rank`'s holder and how long ago it was seen ("" when
  // none), for messages.
  std::string Describe(uint32_t rank) const;

 private:
  struct Member {
    TrainerIdentity who;
    bool admitted = false;
    // After a rollback until it is admitted again: the shards still wait
    // for it (and refuse its contributions), so a drop must reach them.
    bool expected = false;
    uint64_t start_step = 0;
    absl::Time last_seen;
  };
  // Checks `instance` holds `rank`. mu_ held.
  absl::Status CheckHolderLocked(uint32_t rank, uint64_t instance) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void RecordLocked(v1::MembershipEvent::Kind kind, uint32_t rank,
                    const TrainerIdentity& who, uint64_t step,
                    const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `rank`'s holder if it is still `instance` and, when it was
  // admitted, drops it on every shard. Takes change_mu_ (not mu_).
  void Remove(uint32_t rank, uint64_t instance, v1::MembershipEvent::Kind kind,
              const std::string& reason);
  void Watch();

  const MembershipOptions options_;
  ShardFanout* const fanout_;
  // Held across the shards' roster changes (not while answering status).
  absl::Mutex change_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<uint32_t, Member> members_ ABSL_GUARDED_BY(mu_);
  // Why instances lost their rank (the last 256), for their heartbeats.
  std::map<uint64_t, std::string> gone_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::MembershipEvent> events_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;  // last: started once the rest is built
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_COORDINATOR_MEMBERSHIP_H_
