// Whether a shard that starts belongs to a cluster that is already training
// (zshard-server --replace=auto): a pod or job restarted alone replaces its
// shard from the buddy's snapshot; one restarted with the whole cluster
// starts anew (or from disk with --restore).
#ifndef ZSHARD_SERVER_CLUSTER_PROBE_H_
#define ZSHARD_SERVER_CLUSTER_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/base/rpc_credentials.h"

namespace zshard {

struct ClusterProbe {
  bool running = false;
  // What was asked and what it answered, for the log.
  std::string why;
};

// Asks the shard at `contact` (the coordinator, or for shard 0 a live
// peer) for its view of the cluster (ShardControl.ClusterView), once,
// until `deadline`. Running: the contact serves a model and knows every
// shard's endpoint. A contact that does not answer, or answers that it is
// not running, means the cluster is starting: not running. Blocks the
// caller; never fails.
ClusterProbe ProbeCluster(const std::shared_ptr<const RpcCredentials>& peers,
                          const std::string& contact, absl::Time deadline);

}  // namespace zshard

#endif  // ZSHARD_SERVER_CLUSTER_PROBE_H_
