// A new coordinator taking over (issue 16: shard 0 replaced from its buddy's
// in-memory snapshot). The replacement learns the cluster from a live shard,
// restores shard 0's slices from shard 1's copy, and then rolls every other
// shard back to that step, moving them to itself with a newer epoch.
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "server/coordinator/coordinator.h"

namespace zshard {

absl::StatusOr<v1::PrepareReplaceResponse> Coordinator::PrepareTakeover(
    const std::string& peer, absl::Time deadline) {
  if (options_.num_shards < 2) {
    return absl::FailedPreconditionError(
        "a single shard has no buddy holding its snapshot; restart it with "
        "--restore from the last checkpoint");
  }
  v1::ClusterViewResponse view;
  {
    auto stub = v1::ShardControl::NewStub(options_.peers->Channel(peer));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    absl::Status st = FromGrpcStatus(
        stub->ClusterView(&ctx, v1::ClusterViewRequest(), &view));
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("--peer ", peer, ": ", st.message()));
    }
  }
  if (view.num_shards() != options_.num_shards || view.shard_id() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer ", peer, " is shard ", view.shard_id(), " of ",
        view.num_shards(),
        "; a replacement of shard 0 with --num_shards=", options_.num_shards,
        " needs a live shard 1..", options_.num_shards - 1, " of its cluster"));
  }
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t s = 1; s < options_.num_shards; ++s) {
      const std::string e = s < static_cast<uint32_t>(view.endpoints_size())
                                ? view.endpoints(s)
                                : "";
      if (e.empty()) {
        return absl::UnavailableError(absl::StrCat(
            "--peer ", peer, " does not know shard ", s, "'s endpoint yet"));
      }
      shard_endpoints_[s] = e;
    }
    peers_.reset();
  }
  {
    absl::MutexLock lock(&snap_mu_);
    epoch_ = view.epoch();
  }
  std::set<uint32_t> unreachable;
  ZS_ASSIGN_OR_RETURN(auto inv, Inventories(0, deadline, &unreachable));
  std::set<uint32_t> ranks;
  for (uint32_t s = 1; s < options_.num_shards; ++s) {
    ranks.insert(inv[s].member_ranks().begin(), inv[s].member_ranks().end());
  }
  absl::MutexLock one(&replace_mu_);
  takeover_ranks_.assign(ranks.begin(), ranks.end());
  return OrFromCheckpoint(0, ChooseReplacementStep(0, inv));
}

absl::StatusOr<uint64_t> Coordinator::TakeOver(const std::string& endpoint,
                                               const v1::SnapshotHeader& header,
                                               bool from_checkpoint,
                                               absl::Time deadline) {
  absl::MutexLock one(&replace_mu_);
  SetLocalEndpoint(endpoint);
  RollBackPlan plan;
  plan.replaced = 0;
  plan.step = header.step();
  plan.epoch = this->epoch() + 1;
  plan.coordinator = endpoint;
  plan.from_checkpoint = from_checkpoint;
  plan.reason = absl::StrCat(
      "shard 0 (the coordinator) was replaced by ", endpoint,
      from_checkpoint ? " from the disk checkpoint (its buddy's snapshot is "
                        "gone too)"
                      : " from its buddy's snapshot");
  std::set<uint32_t> missing;
  ZS_RETURN_IF_ERROR(RollBackShards(plan, takeover_ranks_, &missing, deadline));
  membership_->RestoreHistory(std::vector<v1::MembershipEvent>(
      header.membership_history().begin(), header.membership_history().end()));
  membership_->Adopt(takeover_ranks_, plan.step, plan.reason);
  FinishRollBack(plan, header, takeover_ranks_, missing);
  std::cerr << "zshard-server: coordinator: shard 0 replaced by " << endpoint
            << "; every shard rolled back to "
            << (from_checkpoint ? "the checkpoint at " : "") << "step "
            << plan.step << " (epoch " << plan.epoch << ")\n";
  return plan.epoch;
}

}  // namespace zshard
