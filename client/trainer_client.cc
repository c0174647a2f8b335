#include "client/trainer_client.h"

#include <cmath>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<TrainerClient>> TrainerClient::Connect(
    const TrainerClientOptions& options, const v1::ModelSpec& spec,
    const Cluster::InitFn& init) {
  std::unique_ptr<TrainerClient> c(new TrainerClient());
  c->options_ = options;
  ZS_ASSIGN_OR_RETURN(c->cluster_, Cluster::Connect(options.cluster));
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      c->cluster_->RegisterOrVerify(spec, init, options.register_timeout));
  c->map_ = std::make_unique<PartitionMap>(std::move(map));
  c->cache_ = std::make_unique<ParameterCache>(c->cluster_.get(), c->map_.get(),
                                               options.cache);
  c->pusher_ = std::make_unique<GradientPusher>(c->cluster_.get(),
                                                c->map_.get(), options.push);
  ZS_ASSIGN_OR_RETURN(c->step_,
                      c->cluster_->AgreedVersion(options.cluster.connect_timeout));
  c->cache_->BeginStep(c->step_);
  return c;
}

absl::StatusOr<const float*> TrainerClient::Acquire(size_t g) {
  return cache_->Acquire(g);
}

absl::Status TrainerClient::Release(size_t g) { return cache_->Release(g); }

absl::Status TrainerClient::PushGradient(size_t g, const float* grad,
                                         uint32_t micro_step) {
  ZS_RETURN_IF_ERROR(pusher_->Push(g, grad, step_, micro_step));
  if (!options_.overlap_comm) return pusher_->Flush();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> TrainerClient::EndStep(bool overflow,
                                                  double loss_scale) {
  ZS_RETURN_IF_ERROR(pusher_->Flush());
  StepResult result;
  result.grad_norm = std::nan("");
  if (cluster_->step_barrier()) {
    const uint32_t shards = cluster_->num_shards();
    std::vector<absl::Status> status(shards);
    std::vector<v1::CommitStepResponse> resp(shards);
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < shards; ++s) {
      threads.emplace_back([&, s] {
        grpc::ClientContext ctx;
        // Every trainer and shard takes part: allow for the slowest.
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + 2 * options_.push.rpc_timeout));
        v1::CommitStepRequest req;
        req.set_step(step_);
        req.set_trainer_rank(cluster_->rank());
        req.set_overflow(overflow);
        req.set_loss_scale(loss_scale);
        status[s] = cluster_->Annotate(
            s, FromGrpcStatus(cluster_->stub(s).CommitStep(&ctx, req, &resp[s])));
      });
    }
    for (auto& t : threads) t.join();
    for (uint32_t s = 0; s < shards; ++s) ZS_RETURN_IF_ERROR(status[s]);
    for (uint32_t s = 1; s < shards; ++s) {
      if (resp[s].skipped() != resp[0].skipped() ||
          resp[s].grad_norm() != resp[0].grad_norm()) {
        return cluster_->Annotate(s, absl::InternalError(absl::StrCat(
                                         "decided step ", step_,
                                         " differently from shard 0")));
      }
    }
    result.skipped = resp[0].skipped();
    result.grad_norm = resp[0].grad_norm();
  }
  ++step_;
  cache_->BeginStep(step_);
  return result;
}

TrainerClientStats TrainerClient::stats() const {
  TrainerClientStats s;
  s.params = cache_->stats();
  s.grads = pusher_->stats();
  s.resident_bound = cache_->ResidentBound();
  return s;
}

}  // namespace zshard
