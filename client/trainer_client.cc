#include "client/trainer_client.h"

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

absl::Status TrainerClient::EndStep() {
  ZS_RETURN_IF_ERROR(pusher_->Flush());
  ++step_;
  cache_->BeginStep(step_);
  return absl::OkStatus();
}

TrainerClientStats TrainerClient::stats() const {
  TrainerClientStats s;
  s.params = cache_->stats();
  s.grads = pusher_->stats();
  s.resident_bound = cache_->ResidentBound();
  return s;
}

}  // namespace zshard
