#include "client/core/rejoin.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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
  }
  // A dropped process does not come back (the coordinator refuses its
  // join too); a rollback keeps every trainer a member.
  auto dropped = [&old]() -> absl::Status {
    absl::Status m = old.membership();
    if (m.ok() || !old.coordinator_moved_to().empty()) return absl::OkStatus();
    return m;
  };
  // Short attempts, growing: one that learned the shards before a
  // replacement registered waits on the dead one's address.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration attempt = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<TrainerClient>> fresh;
  bool stale = false;  // the last join found the old epoch
  do {
    if (absl::Status d = dropped(); !d.ok()) return d;
    o.cluster.connect_timeout = std::max(
        absl::Milliseconds(100), std::min(attempt, deadline - absl::Now()));
    fresh = TrainerClient::Connect(o, spec, init);
    stale = fresh.ok() && (*fresh)->resume().epoch <= epoch;
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
  tell(absl::StrCat("rank ", (*fresh)->rank(), ": the cluster rolled back to ",
                    "step ", (*fresh)->resume().step, " (epoch ",
                    (*fresh)->resume().epoch, ")"));
  return std::move(*fresh);
}

}  // namespace zshard
