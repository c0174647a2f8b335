#include "client/core/rejoin.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<TrainerClient>> RejoinCluster(
    const TrainerClient& old, const absl::Status& why,
    TrainerClientOptions* options, const v1::ModelSpec& spec,
    const Cluster::InitFn& init, absl::Duration timeout,
    const std::function<void(const std::string&)>& log) {
  auto tell = [&](const std::string& line) {
    if (log) log(line);
  };
  const uint64_t epoch = old.resume().epoch;
  TrainerClientOptions o = *options;
  o.cluster.instance_id = old.instance_id();
  o.cluster.requested_rank = static_cast<int>(old.rank());
  o.cluster.verify_only = true;  // the servers hold the model
  auto move_to = [&](const std::string& coordinator) {
    tell(absl::StrCat("rank ", old.rank(), ": the coordinator moved to ",
                      coordinator));
    o.cluster.coordinator = coordinator;
    options->cluster.coordinator = coordinator;
  };
  if (const std::string moved = old.coordinator_moved_to(); !moved.empty()) {
    move_to(moved);
  } else {
    // `why` may have come before the old client's heartbeat learned that
    // shard 0 was replaced: the shards are asked first, briefly, so that
    // the first attempt is not spent waiting on a coordinator that is gone
    // (a rank whose takeover hold expires meanwhile is dropped).
    absl::StatusOr<std::string> found = Cluster::FindCoordinator(
        old.shard_endpoints(), epoch, *o.cluster.credentials,
        absl::Now() + std::min(absl::Seconds(1), timeout));
    if (found.ok() && *found != o.cluster.coordinator) move_to(*found);
  }
  // A dropped process does not come back (the coordinator refuses its
  // join too); a rollback keeps every trainer a member.
  auto dropped = [&old]() -> absl::Status {
    absl::Status m = old.membership();
    return absl::IsFailedPrecondition(m) ? m : absl::OkStatus();
  };
  // Short attempts, growing: one that learned the shards before a
  // replacement registered waits on the dead one's address.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration attempt = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<TrainerClient>> fresh;
  bool stale = false;  // the last join found the old epoch
  const absl::Time started = absl::Now();
  int attempts = 0;
  do {
    if (absl::Status d = dropped(); !d.ok()) return d;
    ++attempts;
    o.cluster.connect_timeout = std::max(
        absl::Milliseconds(100), std::min(attempt, deadline - absl::Now()));
    fresh = TrainerClient::Connect(o, spec, init);
    stale = fresh.ok() && (*fresh)->resume().epoch <= epoch;
    if (!fresh.ok() || stale) {
      tell(absl::StrFormat(
          "rank %u: join %d at %s failed after %.2f s: %s", old.rank(),
          attempts, o.cluster.coordinator,
          absl::ToDoubleSeconds(absl::Now() - started),
          stale ? absl::StrCat("it found epoch ", (*fresh)->resume().epoch,
                               ", not a newer one than ", epoch)
                : std::string(fresh.status().message())));
    }
    if (stale) {
      (*fresh)->Detach();  // the rank stays the process's
      // A coordinator that is still taking over (a replacement of shard 0
      // answers before every shard rolled back) or a cluster that did not
      // roll back: the join is dropped (the rank kept) and made again after
      // a pause, until the deadline.
      fresh = absl::Status(why.code(),
                           absl::StrCat(why.message(),
                                        " (the cluster was not rolled back: "
                                        "epoch ",
                                        epoch, ")"));
      absl::SleepFor(std::min(attempt / 4, deadline - absl::Now()));
    } else if (!fresh.ok()) {
      // A replacement of shard 0 may serve elsewhere: the shards name it.
      absl::StatusOr<std::string> moved = Cluster::FindCoordinator(
          old.shard_endpoints(), epoch, *o.cluster.credentials,
          std::min(deadline, absl::Now() + absl::Seconds(2)));
      if (moved.ok() && *moved != o.cluster.coordinator) {
        move_to(*moved);
        continue;  // at once, with the same attempt length
      }
    }
    attempt = std::min(2 * attempt, absl::Seconds(8));
  } while (!fresh.ok() && absl::Now() < deadline);
  if (!fresh.ok()) {
    if (stale) return fresh.status();
    return absl::Status(why.code(),
                        absl::StrCat(why.message(), "; joining again failed: ",
                                     fresh.status().message()));
  }
  tell(absl::StrFormat(
      "rank %u: the cluster rolled back to step %u (epoch %u); joined again "
      "in %.2f s",
      (*fresh)->rank(), (*fresh)->resume().step, (*fresh)->resume().epoch,
      absl::ToDoubleSeconds(absl::Now() - started)));
  return std::move(*fresh);
}

}  // namespace zshard
