#include "client/core/peer_wait.h"

#include <algorithm>

namespace zshard {

absl::Status CallWhilePeersAreLate(
    absl::Duration per_call, absl::Duration patience,
    const std::function<absl::Status(absl::Time deadline)>& call,
    absl::Time* last_deadline) {
  const absl::Time give_up = absl::Now() + patience;
  // A shard that answers at once (a wait cap of its own) is not asked in a
  // tight loop: only a call that waited this long is made again.
  const absl::Duration waited_enough = std::min(per_call / 2, absl::Seconds(1));
  for (;;) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + per_call;
    if (last_deadline) *last_deadline = deadline;
    absl::Status st = call(deadline);
    const absl::Time now = absl::Now();
    const bool shard_waited = absl::IsDeadlineExceeded(st) && now < deadline &&
                              now - start >= waited_enough;
    if (!shard_waited || now >= give_up) return st;
  }
}

}  // namespace zshard
