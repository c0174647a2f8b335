#include "client/core/trainer_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/core/peer_wait.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/config/adamw_step.h"

namespace zshard {

void ApplyTrainingConfig(const TrainingConfig& config, int64_t prefetch_bytes,
                         TrainerClientOptions* o) {
  o->cluster.expected_config_hash = config.hash;
  o->cluster.expected_config_canonical = config.canonical;
  o->overlap_comm = config.overlap_comm;
  o->stage = config.zero_stage;
  o->bf16 = config.bf16_enabled;
  o->cache.quantized =
      config.quantization.weights ? config.ParameterWire() : WireFormat();
  o->push.quantized =
      config.quantization.gradients ? config.GradientWire() : WireFormat();
  o->hpz_partition_size = config.hpz_partition_size;
  o->cache.max_live_bytes = config.stage3_max_live_parameters * sizeof(float);
  o->cache.max_reuse_distance = config.stage3_max_reuse_distance;
  o->reduce_bucket_bytes = config.reduce_bucket_size * sizeof(float);
  o->adamw = config.adamw;
  o->scheduler = config.scheduler;
  o->cache.prefetch_bytes =
      prefetch_bytes >= 0 ? static_cast<uint64_t>(prefetch_bytes)
                          : config.stage3_prefetch_bucket_size * sizeof(float);
}

TrainerClient::~TrainerClient() {
  // The cluster's heartbeat thread outlives the data plane its hook aborts
  // and its heartbeats go through.
  if (cluster_) {
    cluster_->SetLostHook(nullptr);
    cluster_->SetBeatSender(nullptr);
  }
  // What is still in flight is of no use now: the next step's prefetch
  // (EndStep starts it), which waits on the shards for as long as they wait
  // for a late or dead trainer (up to peer_wait: two minutes by default),
  // and the pushes of a step that never ended. The threads waiting on them
  // are freed at once; the shards release this trainer's leases when it
  // leaves (the cluster's Leave, below).
  if (data_plane_) data_plane_->Abort("the trainer client is closing");
}

void TrainerClient::Silence() {
  // Threads blocked on a shard that stopped answering are freed at once.
  if (cluster_) cluster_->SetLostHook(nullptr);
  if (data_plane_) data_plane_->Abort("this trainer joins the cluster again");
}

void TrainerClient::StopTraffic() {
  Silence();
  reporter_.reset();
  local_.reset();
  pusher_.reset();
  cache_.reset();
  if (cluster_) cluster_->SetBeatSender(nullptr);
  data_plane_.reset();
}

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
  if (options.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeRO stage ", options.stage, " does not exist (0..3)"));
  }
  if (options.bf16 && options.stage == 0) {
    return absl::UnimplementedError(
        "bf16 with stage 0 (trainers run AdamW) is not implemented");
  }
  if (options.stage == 0 && (options.cache.quantized.quantized() ||
                             options.push.quantized.quantized())) {
    return absl::UnimplementedError(
        "quantized transfers with stage 0 (trainers run AdamW) are not "
        "implemented");
  }
  ParameterCacheOptions cache = options.cache;
  GradientPusherOptions push = options.push;
  cache.bf16 = options.bf16;
  push.bf16 = options.bf16;
  cache.keep_all_resident = options.stage < 3;
  if (options.stage == 2) push.bucket_bytes = options.reduce_bucket_bytes;
  if (options.stage == 1) push.hold_until_flush = true;
  if (c->cluster_->transport().empty()) {
    return absl::FailedPreconditionError(
        "the shards run without a data plane transport (start them with "
        "--transport=ucx or "
        "--transport=inline)");
  }
  ZS_ASSIGN_OR_RETURN(c->data_plane_,
                      DataPlane::Create(c->cluster_.get(), options.peer_wait));
  // Dropped, or the coordinator moved: every wait on a shard ends now (the
  // trainer then joins again) instead of at its deadline.
  c->cluster_->SetLostHook(
      [plane = c->data_plane_.get()](const absl::Status& why) {
        plane->Abort(std::string(why.message()));
      });
  // Heartbeats over the transport: no gRPC call while the data plane is up.
  c->cluster_->SetBeatSender([plane = c->data_plane_.get()](
                                 const v1::HeartbeatRequest& req,
                                 absl::Time deadline) {
    return plane->Heartbeat(req, deadline);
  });
  cache.data_plane = c->data_plane_.get();
  push.data_plane = c->data_plane_.get();
  ZS_RETURN_IF_ERROR(c->OpenHostCache(&cache));
  c->cache_ =
      std::make_unique<ParameterCache>(c->cluster_.get(), c->map_.get(), cache);
  c->pusher_ =
      std::make_unique<GradientPusher>(c->cluster_.get(), c->map_.get(), push);
  // Each accepted step report stands for a heartbeat.
  Cluster* cluster = c->cluster_.get();
  c->reporter_ = std::make_unique<StepReporter>(
      &cluster->stub(0), cluster->rank(), cluster->instance_id(),
      [cluster](absl::Time sent) { cluster->Vouched(sent); });
  ZS_ASSIGN_OR_RETURN(c->step_,
                      c->cluster_->Admit(options.cluster.connect_timeout));
  c->cache_->BeginStep(c->step_);
  if (options.stage == 0) {
    if (c->step_ != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage 0 trainers hold the parameters themselves and cannot join a "
          "run at step ",
          c->step_));
    }
    ZS_ASSIGN_OR_RETURN(
        c->local_, LocalOptimizer::Create(c->cache_.get(), c->map_.get(),
                                          options.adamw, options.scheduler));
  }
  // The first step's report counts from here, not the joining.
  c->rpcs_reported_ = c->cluster_->rpcs().Total();
  c->cluster_->Hold();  // joined again: the rank is this client's now
  return c;
}

absl::Status TrainerClient::OpenHostCache(ParameterCacheOptions* cache) {
  const uint32_t k = options_.hpz_partition_size;
  if (k <= 1) return absl::OkStatus();
  if (options_.stage == 0) {
    return absl::UnimplementedError(
        "zero_optimization.zero_hpz_partition_size: a per-host parameter "
        "cache with stage 0 (trainers hold the parameters) is not "
        "implemented");
  }
  const uint32_t world = cluster_->world_size();
  if (world % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.zero_hpz_partition_size: ", k,
        " trainers per host do not divide the ", world, " trainers"));
  }
  std::vector<std::string> addresses;
  for (uint32_t s = 0; s < cluster_->num_shards(); ++s) {
    addresses.push_back(cluster_->transport_address(s));
  }
  const uint32_t rank = cluster_->rank();
  std::vector<uint64_t> group_bytes;
  const size_t elem = options_.bf16 ? sizeof(uint16_t) : sizeof(float);
  for (size_t g = 0; g < map_->num_groups(); ++g) {
    group_bytes.push_back(map_->group_numel(g) * elem);
  }
  ZS_ASSIGN_OR_RETURN(
      host_cache_,
      HostCache::Open(HostCacheName(cluster_->endpoints(), addresses,
                                    cluster_->config_hash(), rank / k),
                      group_bytes, cluster_->num_shards(), k, rank % k));
  cache->host_cache = host_cache_.get();
  cache->host_trainers = k;
  cache->host_index = rank % k;
  cache->host_wait = cache->rpc_timeout;
  return absl::OkStatus();
}

absl::StatusOr<const void*> TrainerClient::Acquire(size_t g) {
  if (local_) return local_->Params(g);
  return cache_->Acquire(g);
}

absl::Status TrainerClient::Release(size_t g) {
  if (local_) return absl::OkStatus();
  return cache_->Release(g);
}

absl::Status TrainerClient::PushGradient(size_t g, const void* grad,
                                         uint32_t micro_step) {
  ZS_RETURN_IF_ERROR(pusher_->Push(g, grad, step_, micro_step));
  if (!options_.overlap_comm) return pusher_->Flush();
  return absl::OkStatus();
}

absl::Status TrainerClient::PushTrainableGradient(size_t g, const void* grad,
                                                  uint32_t micro_step) {
  ZS_RETURN_IF_ERROR(
      pusher_->Push(g, grad, step_, micro_step, /*trainable_only=*/true));
  if (!options_.overlap_comm) return pusher_->Flush();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> TrainerClient::EndStep(bool overflow,
                                                  double loss_scale) {
  // Dropped by the coordinator (stopped or cut off too long): say so rather
  // than whatever the shards refuse.
  ZS_RETURN_IF_ERROR(cluster_->membership());
  // Without a step barrier the next version needs nothing more from this
  // trainer than the pushes in flight, so the next step's fetches start now
  // (the shards answer their leases once it is published) and overlap the
  // wait for the acknowledgements: the last trainer to push no longer
  // fetches the first group only after its own flush.
  const bool barrier = cluster_->step_barrier();
  if (!barrier) cache_->BeginStep(step_ + 1);
  absl::Status flushed = pusher_->Flush();
  ZS_RETURN_IF_ERROR(cluster_->membership());
  ZS_RETURN_IF_ERROR(flushed);
  // The step's leases stay until the next lease to each shard carries their
  // release (every step leases from every shard that owns a slice): the
  // slot they pin is written again only after the next step's gradients,
  // so releasing them here would cost a round trip per shard on the step's
  // critical path for nothing. The data plane releases the rest on exit.
  StepResult result;
  result.grad_norm = std::nan("");
  if (cluster_->step_barrier()) {
    const uint32_t shards = cluster_->num_shards();
    std::vector<absl::Status> status(shards);
    std::vector<v1::CommitStepResponse> resp(shards);
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < shards; ++s) {
      threads.emplace_back([&, s] {
        v1::CommitStepRequest req;
        req.set_step(step_);
        req.set_trainer_rank(cluster_->rank());
        req.set_overflow(overflow);
        req.set_loss_scale(loss_scale);
        // Every trainer and shard takes part: allow for the slowest, and
        // commit again (it is idempotent) while the shard waits for late
        // trainers.
        status[s] = cluster_->Annotate(
            s, CallWhilePeersAreLate(
                   2 * options_.push.rpc_timeout, data_plane_->peer_wait(),
                   [&](absl::Time deadline) {
                     grpc::ClientContext ctx;
                     ctx.set_deadline(absl::ToChronoTime(deadline));
                     resp[s].Clear();
                     return FromGrpcStatus(
                         cluster_->stub(s).CommitStep(&ctx, req, &resp[s]));
                   }));
      });
    }
    for (auto& t : threads) t.join();
    for (uint32_t s = 0; s < shards; ++s) ZS_RETURN_IF_ERROR(status[s]);
    for (uint32_t s = 1; s < shards; ++s) {
      if (resp[s].skipped() != resp[0].skipped() ||
          resp[s].grad_norm() != resp[0].grad_norm()) {
        return cluster_->Annotate(
            s, absl::InternalError(absl::StrCat("decided step ", step_,
                                                " differently from shard 0")));
      }
    }
    result.skipped = resp[0].skipped();
    result.grad_norm = resp[0].grad_norm();
  }
  ++step_;
  if (barrier) cache_->BeginStep(step_);
  if (local_) ZS_RETURN_IF_ERROR(local_->Step());
  return result;
}

TrainerClientStats TrainerClient::stats() const {
  TrainerClientStats s;
  s.params = cache_->stats();
  s.grads = pusher_->stats();
  s.resident_bound = cache_->ResidentBound();
  s.grad_bytes = s.grads.peak_buffer_bytes;
  if (local_) {
    const uint64_t n = local_->elements();
    s.param_bytes = n * sizeof(float);
    s.optimizer_bytes = 2 * n * sizeof(float);
    s.buffer_bytes = s.params.peak_resident_bytes;
  } else {
    s.param_bytes = s.params.peak_resident_bytes;
  }
  return s;
}

std::map<std::string, uint64_t> TrainerClient::rpc_counts() const {
  return cluster_->rpcs().Counts();
}

StepReporter::Counts TrainerClient::report_counts(absl::Duration settle) const {
  if (settle > absl::ZeroDuration()) reporter_->WaitIdle(settle);
  return reporter_->counts();
}

void TrainerClient::ReportStep(double loss, uint64_t samples,
                               double step_seconds) {
  // The report is counted when it starts, so it is in the figure it carries
  // (a report the reporter drops, 8 being in flight, is counted though never
  // made: the next report then carries one call fewer).
  const uint64_t total = cluster_->rpcs().Total() + 1;
  reporter_->Report(step_, loss, samples, step_seconds,
                    total - std::min(total, rpcs_reported_));
  rpcs_reported_ = total;
}

}  // namespace zshard
