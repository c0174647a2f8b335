// Waiting on late trainers. A shard holds a lease (until the version asked
// for is published), a landing reservation (until the fold order reaches
// it) or a step commit (until every trainer committed) while other trainers
// have not contributed yet. When such a wait runs out, the shard answers
// DEADLINE_EXCEEDED naming what it waits for, shortly before the call's own
// deadline (server/rpc/shard_service.h, Deadline). That answer says the
// shard is alive and the step waits on trainers, which the coordinator
// either drops (after --trainer_timeout_s: the step goes on without them)
// or which catch up: one that joins again after a shard was replaced may
// take several deadlines (it notices the dead shard at its own deadline,
// then waits for the replacement). So the call is made again. A call that
// ends at its deadline without an answer (the shard stopped answering) is
// not: the trainer learns of a dead shard within one deadline.
#ifndef ZSHARD_CLIENT_CORE_PEER_WAIT_H_
#define ZSHARD_CLIENT_CORE_PEER_WAIT_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zshard {

// How long a trainer waits on late trainers by default: enough for one that
// notices a dead shard at a 30 s deadline, waits for the replacement and
// redoes its step.
inline constexpr absl::Duration kDefaultPeerWait = absl::Seconds(120);

// Calls `call(deadline)` with a deadline `per_call` ahead, again each time
// it returns DEADLINE_EXCEEDED before that deadline after waiting at least
// min(per_call / 2, 1 s) (the shard waited), until it returns
// anything else, ends at its deadline, or `patience` has passed since the
// first call; returns the last call's status. `*last_deadline` (may be
// null) is set to the last call's deadline. Blocks the calling thread;
// `call` must leave nothing behind when it fails.
absl::Status CallWhilePeersAreLate(
    absl::Duration per_call, absl::Duration patience,
    const std::function<absl::Status(absl::Time deadline)>& call,
    absl::Time* last_deadline = nullptr);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_PEER_WAIT_H_
