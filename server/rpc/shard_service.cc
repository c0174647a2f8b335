#include "server/rpc/shard_service.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"
#include "common/model/partition_map.h"

namespace zshard {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

ShardService::ShardService(const ShardServiceOptions& options,
                           std::unique_ptr<ShardStore> store)
    : options_(options), store_(std::move(store)) {
  store_->SetNormExchange(this);
  if (!options.store.checkpoint.root.empty()) {
    store_->SetCheckpointCommit(
        [this](const ShardManifest& m, uint32_t crc) {
          return CommitToCoordinator(m, crc);
        },
        [this](uint64_t step, const absl::Status& error) {
          ReportCheckpointFailure(step, error);
        });
  }
}

ShardService::~ShardService() {
  waits_.Stop();
  store_.reset();
}

absl::StatusOr<NormTotals> ShardService::Exchange(uint64_t step,
                                                  double sum_squares,
                                                  bool non_finite,
                                                  absl::Time deadline) {
  if (options_.coordinator_host) {
    return options_.coordinator_host->CollectNorm(step, 0, sum_squares,
                                                  non_finite, deadline);
  }
  auto stub = CoordinatorStub();
  if (!stub) {
    return absl::FailedPreconditionError("no coordinator address to report to");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ExchangeNormRequest req;
  req.set_step(step);
  req.set_shard_id(options_.store.shard_id);
  req.set_sum_squares(sum_squares);
  req.set_non_finite(non_finite);
  v1::ExchangeNormResponse resp;
  absl::Status st = FromGrpcStatus(stub->ExchangeNorm(&ctx, req, &resp));
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("coordinator ", CoordinatorEndpoint(), ": ",
                                st.message()));
  }
  return NormTotals{resp.sum_squares(), resp.non_finite()};
}

void ShardService::SetEndpoint(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  endpoint_ = endpoint;
  if (options_.coordinator_host)
    options_.coordinator_host->SetLocalEndpoint(endpoint);
}

absl::Time ShardService::Deadline(const grpc::ServerContext* ctx) const {
  const absl::Time now = absl::Now();
  const absl::Time cap = now + options_.wait_timeout;
  const absl::Time client = absl::FromChrono(ctx->deadline());
  const absl::Duration ahead = std::min(
      absl::Seconds(1), std::max(client - now, absl::ZeroDuration()) / 10);
  return std::min(cap, client - ahead);
}

absl::Time ShardService::CallDeadline(uint64_t timeout_ms) const {
  const absl::Duration timeout = std::min(
      options_.wait_timeout,
      absl::Milliseconds(std::min<uint64_t>(timeout_ms, uint64_t{1} << 40)));
  return absl::Now() + timeout - std::min(absl::Seconds(1), timeout / 10);
}

void ShardService::Touch(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(rank);
  if (it != trainers_.end()) it->second.last_seen = absl::Now();
}

void ShardService::CountBytes(uint32_t rank, uint64_t fetched,
                              uint64_t pushed) {
  bytes_fetched_ += fetched;
  bytes_pushed_ += pushed;
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(rank);
  if (it == trainers_.end()) return;
  it->second.bytes_fetched += fetched;
  it->second.bytes_pushed += pushed;
}

grpc::Status ShardService::ReportStep(grpc::ServerContext* ctx,
                                      const v1::ReportStepRequest* req,
                                      v1::ReportStepResponse* /*resp*/) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "ReportStep");
      !denied.ok()) {
    return denied;
  }
  if (options_.store.shard_id != 0) {
    return Error(absl::FailedPreconditionError(
        "ReportStep: steps are reported to shard 0 (the coordinator)"));
  }
  if (req->trainer_rank() >= options_.store.world_size) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "ReportStep: trainer_rank ", req->trainer_rank(), " out of range for ",
        options_.store.world_size, " trainers")));
  }
  if (req->step() == 0 || !std::isfinite(req->step_seconds()) ||
      req->step_seconds() < 0) {
    return Error(absl::InvalidArgumentError(
        "ReportStep: step must be >= 1 and step_seconds finite and >= 0"));
  }
  if (absl::Status alive = Vouch(req->trainer_rank(), req->instance_id());
      !alive.ok()) {
    return ToGrpcStatus(alive);
  }
  history_.Add(req->step(), req->trainer_rank(), req->loss(), req->samples(),
               req->step_seconds(), req->rpcs(), absl::Now());
  Touch(req->trainer_rank());
  return grpc::Status::OK;
}

v1::Layout ShardService::MakeLayout() const {
  v1::Layout layout;
  layout.set_num_shards(options_.store.num_shards);
  layout.set_alignment(options_.store.alignment);
  layout.set_persistence_threshold(options_.store.persistence_threshold);
  layout.set_layout_version(
      LayoutVersion(options_.store.num_shards, options_.store.alignment,
                    options_.store.persistence_threshold));
  return layout;
}

grpc::Status ShardService::Join(grpc::ServerContext* ctx,
                                const v1::JoinRequest* req,
                                v1::JoinResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Join");
      !denied.ok()) {
    return denied;
  }
  const uint32_t world = options_.store.world_size;
  const bool coordinator = options_.store.shard_id == 0;
  if (req->requested_rank() < -1 ||
      req->requested_rank() >= static_cast<int64_t>(world)) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "requested rank ", req->requested_rank(), " out of range (world size ",
        world, "; -1 asks for any)")));
  }
  if (req->requested_rank() == -1 && !coordinator) {
    return Error(absl::InvalidArgumentError(
        "only the coordinator (shard 0) assigns ranks; join it first"));
  }
  Transport* t = options_.store.transport;
  if (!t && !req->transport().empty()) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.store.shard_id,
                     " runs without a data plane transport")));
  }
  if (t && !req->transport().empty() && req->transport() != t->name()) {
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "trainer asks for the ", req->transport(), " data plane but shard ",
        options_.store.shard_id, " runs --transport=", t->name(),
        "; start the trainer with --transport=", t->name(),
        " or without the flag")));
  }
  uint32_t rank =
      static_cast<uint32_t>(std::max<int64_t>(0, req->requested_rank()));
  std::vector<std::string> endpoints;
  if (Coordinator* c = options_.coordinator_host) {
    // The coordinator answers once every shard has announced itself.
    absl::Status st = c->AwaitShards(Deadline(ctx));
    if (!st.ok()) return Error(st);
    TrainerIdentity who;
    who.host = req->host().substr(0, 256);
    who.pid = req->pid();
    who.instance = req->instance_id();
    auto assigned = c->membership().Join(req->requested_rank(), who);
    if (!assigned.ok()) return Error(assigned.status());
    rank = *assigned;
    endpoints = c->ShardEndpoints();
    resp->set_epoch(c->epoch());
    const absl::Duration beat = c->membership().heartbeat_interval();
    resp->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(beat)));
    resp->set_trainer_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(c->membership().options().trainer_timeout)));
  }
  // A rank joining is a new trainer process (the coordinator dropped the
  // last one): what that one held of the landing pool is free again.
  store_->ForgetCredit(rank);
  absl::MutexLock lock(&mu_);
  TrainerSeen& seen = trainers_[rank];
  seen = TrainerSeen{req->trainer_id(), absl::Now()};
  // Not a secret from the trainer's peers on this host, but never sent
  // except over the authenticated Join.
  seen.call_token = absl::Uniform<uint64_t>(token_bits_, 1, UINT64_MAX);
  resp->set_rank(rank);
  resp->set_call_token(seen.call_token);
  resp->set_world_size(world);
  resp->set_shard_id(options_.store.shard_id);
  *resp->mutable_layout() = MakeLayout();
  resp->set_gradient_accumulation_steps(options_.store.accumulation_steps);
  resp->set_config_hash(options_.config_hash);
  resp->set_config_canonical(options_.config_canonical);
  resp->set_step_barrier(options_.store.step_barrier);
  if (t) {
    resp->set_transport(t->name());
    resp->set_transport_address(t->address());
  }
  if (restored_) {
    resp->set_restored(true);
    resp->set_restored_step(restored_step_);
    resp->set_last_step_skipped(restored_last_skipped_);
    // A rank the checkpoint has no state for (it was taken with fewer
    // trainers) resumes from the lowest rank's: the states are the run's
    // (its step and loss scale), not the rank's.
    auto st = restored_states_.find(rank);
    if (st == restored_states_.end()) st = restored_states_.begin();
    if (st != restored_states_.end()) resp->set_trainer_state(st->second);
  }
  for (size_t s = 0; s < endpoints.size(); ++s) {
    auto* e = resp->add_shards();
    e->set_shard_id(static_cast<uint32_t>(s));
    e->set_endpoint(endpoints[s]);
  }
  return grpc::Status::OK;
}

grpc::Status ShardService::RegisterModel(
    grpc::ServerContext* ctx,
    grpc::ServerReader<v1::RegisterModelChunk>* reader,
    v1::RegisterModelResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "RegisterModel");
      !denied.ok()) {
    return denied;
  }
  v1::RegisterModelChunk chunk;
  if (!reader->Read(&chunk)) {
    return Error(absl::InvalidArgumentError("RegisterModel: empty stream"));
  }
  if (!chunk.has_spec()) {
    return Error(absl::InvalidArgumentError(
        "RegisterModel: the first message must carry the model spec"));
  }
  v1::ModelSpec spec = chunk.spec();
  auto map = PartitionMap::Create(spec, options_.store.num_shards,
                                  options_.store.alignment,
                                  options_.store.persistence_threshold);
  if (!map.ok()) return Error(map.status());
  // Identical spec registered already: the values would be ignored, so
  // they are not kept (a different spec is refused by Register).
  const bool registered = store_->registered();
  InitialValues values(*map, options_.store.shard_id);
  do {
    if (chunk.data().size() % sizeof(float) != 0) {
      return Error(absl::InvalidArgumentError(absl::StrCat(
          "RegisterModel: data of group ", chunk.group(), " is ",
          chunk.data().size(), " bytes, not a whole number of fp32 values")));
    }
    if (chunk.data().empty() || registered) continue;
    absl::Status st =
        values.Add(chunk.group(), chunk.offset(), chunk.data().data(),
                   chunk.data().size() / sizeof(float));
    if (!st.ok()) {
      return Error(absl::Status(st.code(),
                                absl::StrCat("RegisterModel: ", st.message())));
    }
  } while (reader->Read(&chunk));
  auto created = store_->Register(spec, std::move(values));
  if (!created.ok()) return Error(created.status());
  // The stream's buffers (megabytes of gRPC messages) are free now; hand
  // them back to the OS rather than keep them resident beside the state.
  malloc_trim(0);
  resp->set_created(*created);
  resp->set_spec_hash(store_->spec_hash());
  return grpc::Status::OK;
}

grpc::Status ShardService::GetLayout(grpc::ServerContext* ctx,
                                     const v1::GetLayoutRequest* /*req*/,
                                     v1::GetLayoutResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "GetLayout");
      !denied.ok()) {
    return denied;
  }
  resp->set_shard_id(options_.store.shard_id);
  *resp->mutable_layout() = MakeLayout();
  auto spec = store_->spec();
  if (spec.ok()) {
    resp->set_registered(true);
    *resp->mutable_spec() = *spec;
    resp->set_spec_hash(store_->spec_hash());
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const GroupProgress& p : store_->Progress()) {
    if (p.slice.size() == 0) continue;  // owns nothing of this group
    lo = std::min(lo, p.version);
    hi = std::max(hi, p.version);
  }
  if (lo != UINT64_MAX) {
    resp->set_owns_slices(true);
    resp->set_min_version(lo);
    resp->set_max_version(hi);
  }
  if (CoordinatorChannel* c = options_.coordinator_channel) {
    resp->set_coordinator(c->endpoint());
    resp->set_epoch(c->epoch());
  }
  return grpc::Status::OK;
}

std::shared_ptr<v1::Coordinator::Stub> ShardService::CoordinatorStub() const {
  return options_.coordinator_channel ? options_.coordinator_channel->stub()
                                      : nullptr;
}

std::string ShardService::CoordinatorEndpoint() const {
  return options_.coordinator_channel ? options_.coordinator_channel->endpoint()
                                      : "";
}

ShardService::Activity ShardService::activity() const {
  Activity a;
  a.bytes_fetched = bytes_fetched_.load();
  a.bytes_pushed = bytes_pushed_.load();
  absl::MutexLock lock(&mu_);
  a.endpoint = endpoint_;
  a.trainers = trainers_;
  return a;
}

grpc::Status ShardService::CommitStep(grpc::ServerContext* ctx,
                                      const v1::CommitStepRequest* req,
                                      v1::CommitStepResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "CommitStep");
      !denied.ok()) {
    return denied;
  }
  auto d = store_->CommitStep(req->step(), req->trainer_rank(), req->overflow(),
                              req->loss_scale(), Deadline(ctx),
                              [ctx] { return ctx->IsCancelled(); });
  if (!d.ok()) return Error(d.status());
  Touch(req->trainer_rank());
  resp->set_skipped(d->skipped);
  resp->set_grad_norm(d->grad_norm);
  return grpc::Status::OK;
}

}  // namespace zshard
