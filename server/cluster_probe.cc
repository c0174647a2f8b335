#include "server/cluster_probe.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "zshard/v1/coordinator.grpc.pb.h"

namespace zshard {

ClusterProbe ProbeCluster(const std::shared_ptr<const RpcCredentials>& peers,
                          const std::string& contact, absl::Time deadline) {
  ClusterProbe out;
  auto stub = v1::ShardControl::NewStub(peers->Channel(contact));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ClusterViewResponse view;
  const absl::Status st =
      FromGrpcStatus(stub->ClusterView(&ctx, v1::ClusterViewRequest(), &view));
  if (!st.ok()) {
    out.why = absl::StrCat("the shard at ", contact, " does not answer (",
                           st.ToString(), "): the cluster is starting");
    return out;
  }
  out.running = view.running();
  out.why = absl::StrCat(
      "shard ", view.shard_id(), " at ", contact,
      view.running()
          ? absl::StrCat(
                " is training (epoch ", view.epoch(), ", coordinator ",
                view.coordinator().empty() ? contact : view.coordinator(), ")")
          : std::string(" has not joined a training cluster yet: the "
                        "cluster is starting"));
  return out;
}

}  // namespace zshard
