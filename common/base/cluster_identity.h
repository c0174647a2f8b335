// Where a process learns its place in a cluster from its scheduler: a
// Kubernetes StatefulSet pod's ordinal from its hostname, an Indexed Job's
// completion index, a Slurm step's task id and count. Pure functions of
// their inputs (the environment is passed in), so they are unit-tested.
#ifndef ZSHARD_COMMON_BASE_CLUSTER_IDENTITY_H_
#define ZSHARD_COMMON_BASE_CLUSTER_IDENTITY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zshard {

// Looks up an environment variable; empty when unset.
using EnvLookup = std::function<std::string(const char* name)>;

// The process's environment (getenv).
EnvLookup ProcessEnv();

// The ordinal of a StatefulSet pod's hostname "NAME-N" (N decimal, below
// 2^31; a domain after the first '.' is ignored). INVALID_ARGUMENT naming
// the hostname when it does not end in "-N".
absl::StatusOr<uint32_t> OrdinalFromHostname(absl::string_view hostname);

// This machine's hostname (gethostname). UNAVAILABLE when it cannot be read.
absl::StatusOr<std::string> LocalHostname();

// The default of a trainer's --rank: $JOB_COMPLETION_INDEX (a Kubernetes
// Indexed Job), else $SLURM_PROCID inside a Slurm step, else "-1" (the
// coordinator assigns one).
std::string DefaultTrainerRank(const EnvLookup& env);

// Refuses a --num_shards that disagrees with the Slurm step the server runs
// in ($SLURM_STEP_NUM_TASKS, one server per task); OK outside a step.
absl::Status CheckSlurmTaskCount(int64_t num_shards, const EnvLookup& env);

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_CLUSTER_IDENTITY_H_
