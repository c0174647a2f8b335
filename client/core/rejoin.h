// Joining the cluster again after a failure mid-run (issue 16): a shard was
// replaced (every shard rolled back to a snapshot or checkpoint step), or
// shard 0 was and a new coordinator took over. The trainer joins again as
// the same process (instance id) and rank, finding a moved coordinator
// through the shards, and resumes at the step the cluster went back to.
//
// Blocking; every wait has a deadline.
#ifndef ZSHARD_CLIENT_CORE_REJOIN_H_
#define ZSHARD_CLIENT_CORE_REJOIN_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/core/trainer_client.h"

namespace zshard {

// After `why` failed `old` (whose traffic the caller has stopped or
// silenced: nothing of it may land once the new client is admitted): joins
// with `options` as `old`'s process and rank until `timeout`, in attempts
// that grow from 2 s, and returns the new client when the cluster moved to
// a newer epoch (a join that finds the old epoch, as from a replacement of
// shard 0 still taking over, is left and made again until `timeout`). `options->cluster.coordinator` follows a coordinator that
// moved. The coordinator's word when it dropped `old` (FAILED_PRECONDITION:
// a dropped process does not come back); otherwise `why`, with what the
// rejoin found. `log` (may be null)
// gets one line per thing worth telling an operator. The model is only
// verified (`init` is not called).
absl::StatusOr<std::unique_ptr<TrainerClient>> RejoinCluster(
    const TrainerClient& old, const absl::Status& why,
    TrainerClientOptions* options, const v1::ModelSpec& spec,
    const Cluster::InitFn& init, absl::Duration timeout,
    const std::function<void(const std::string&)>& log);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_REJOIN_H_
