#include "server/rpc/admin_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/checkpoint/manifest.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/coordinator/coordinator.h"

namespace zshard {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

grpc::Status AdminService::GetStatus(grpc::ServerContext* ctx,
                                     const v1::GetStatusRequest* /*req*/,
                                     v1::GetStatusResponse* resp) {
  if (grpc::Status denied =
          shard_->options().auth->Check(*ctx, RpcRole::kAdmin, "GetStatus");
      !denied.ok()) {
    return denied;
  }
  FillStatus(resp);
  return grpc::Status::OK;
}

grpc::Status AdminService::ReadValues(grpc::ServerContext* ctx,
                                      const v1::ReadValuesRequest* req,
                                      v1::ReadValuesResponse* resp) {
  if (grpc::Status denied =
          shard_->options().auth->Check(*ctx, RpcRole::kAdmin, "ReadValues");
      !denied.ok()) {
    return denied;
  }
  if (req->dtype() != v1::DTYPE_UNSPECIFIED && req->dtype() != v1::FLOAT32 &&
      req->dtype() != v1::BFLOAT16) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("ReadValues: dtype ", v1::DType_Name(req->dtype()),
                     " is not served (FLOAT32 or BFLOAT16)")));
  }
  const bool bf16 = req->dtype() == v1::BFLOAT16;
  auto snap = shard_->store().ReadValues(req->group(), req->version(),
                                         req->begin(), req->end(), bf16);
  if (!snap.ok()) return Error(snap.status());
  resp->set_version(snap->version);
  resp->set_begin(snap->offset);
  resp->set_dtype(bf16 ? v1::BFLOAT16 : v1::FLOAT32);
  if (bf16) {
    resp->set_values(reinterpret_cast<const char*>(snap->bf16.data()),
                     snap->bf16.size() * sizeof(uint16_t));
  } else {
    resp->set_values(reinterpret_cast<const char*>(snap->values.data()),
                     snap->values.size() * sizeof(float));
  }
  return grpc::Status::OK;
}

void AdminService::FillStatus(v1::GetStatusResponse* resp) const {
  const ShardServiceOptions& options = shard_->options();
  ShardStore* const store = &shard_->store();
  resp->set_shard_id(options.store.shard_id);
  resp->set_num_shards(options.store.num_shards);
  resp->set_coordinator(shard_->CoordinatorEndpoint());
  resp->set_world_size(options.store.world_size);
  resp->set_gradient_accumulation_steps(options.store.accumulation_steps);
  resp->set_registered(store->registered());
  const ShardService::Activity activity = shard_->activity();
  resp->set_bytes_fetched(activity.bytes_fetched);
  resp->set_bytes_pushed(activity.bytes_pushed);
  resp->set_slice_elements(store->slice_elements());
  auto spec = store->spec();
  if (spec.ok()) resp->set_spec_hash(store->spec_hash());
  uint64_t min_v = UINT64_MAX, max_v = 0;
  const auto progress = store->Progress();
  for (size_t g = 0; g < progress.size(); ++g) {
    const GroupProgress& p = progress[g];
    auto* gs = resp->add_groups();
    gs->set_group(static_cast<uint32_t>(g));
    if (spec.ok()) gs->set_name(spec->groups(static_cast<int>(g)).name());
    gs->set_version(p.version);
    gs->set_slice_begin(p.slice.begin);
    gs->set_slice_end(p.slice.end);
    for (uint32_t r : p.waiting_for_ranks) gs->add_waiting_for_ranks(r);
    gs->set_contributions_received(p.contributions_received);
    if (p.slice.size() == 0) continue;  // owns nothing of this group
    min_v = std::min(min_v, p.version);
    max_v = std::max(max_v, p.version);
  }
  resp->set_min_version(min_v == UINT64_MAX ? 0 : min_v);
  resp->set_max_version(max_v);
  FillCheckpointStatus(resp->mutable_checkpoint());
  {
    ShardStore& store = shard_->store();
    v1::SnapshotStatus* snap = resp->mutable_snapshots();
    const SnapshotStats st = store.SnapshotStatistics();
    snap->set_interval_steps(store.options().snapshot_interval);
    snap->set_taken(st.taken);
    snap->set_failed(st.failed);
    snap->set_newest_complete_step(st.newest_complete);
    snap->set_bytes(st.bytes);
    snap->set_stage_seconds(st.stage_seconds);
    snap->set_skipped(st.skipped);
    snap->set_send_seconds(st.send_seconds);
    for (uint64_t s : store.OwnSnapshotSteps()) snap->add_own_steps(s);
    snap->set_rollbacks(store.rollbacks());
    if (fill_snapshots_) fill_snapshots_(snap);
  }
  const StoreMemory mem = store->Memory();
  v1::ShardMemory* m = resp->mutable_memory();
  m->set_state_bytes(mem.state);
  m->set_published_bytes(mem.published);
  m->set_landing_bytes(mem.landing);
  m->set_accumulator_bytes(mem.accumulators);
  m->set_total_bytes(mem.total());
  m->set_landing_slots(mem.landing_slots);
  m->set_landing_slots_peak(mem.landing_slots_peak);
  m->set_reduced_contributions(mem.reduced_contributions);
  m->set_reduced_elements(mem.reduced_elements);
  m->set_reduce_seconds(mem.reduce_seconds);
  m->set_landed_reserved(mem.landed_reserved);
  m->set_landed_credit(mem.landed_credit);
  const UpdateEngine::UpdateStats timing = store->Timings();
  v1::ShardTimings* t = resp->mutable_timings();
  t->set_optimizer_updates(timing.updates);
  t->set_optimizer_seconds(timing.update_seconds);
  t->set_steps_timed(timing.steps_timed);
  t->set_step_seconds_sum(timing.step_seconds_sum);
  t->set_last_step_seconds(timing.last_step_seconds);
  t->set_reduce_seconds(mem.reduce_seconds);
  if (options.store.transport)
    resp->set_transport(options.store.transport->name());
  const auto leases = store->LeaseStats();
  resp->set_endpoint(activity.endpoint);
  for (const auto& [rank, t] : activity.trainers) {
    auto* ts = resp->add_trainers();
    ts->set_rank(rank);
    ts->set_trainer_id(t.id);
    ts->set_last_seen_unix_ms(absl::ToUnixMillis(t.last_seen));
    ts->set_bytes_fetched(t.bytes_fetched);
    ts->set_bytes_pushed(t.bytes_pushed);
    auto l = leases.find(rank);
    if (l != leases.end()) {
      ts->set_active_leases(l->second.active);
      ts->set_expired_leases(l->second.expired);
    }
  }
  const std::vector<std::string> endpoints =
      options.coordinator_host ? options.coordinator_host->ShardEndpoints()
                               : std::vector<std::string>{};
  for (size_t s = 0; s < endpoints.size(); ++s) {
    if (endpoints[s].empty()) continue;
    auto* e = resp->add_shards();
    e->set_shard_id(static_cast<uint32_t>(s));
    e->set_endpoint(endpoints[s]);
  }
  if (options.coordinator_host) {
    options.coordinator_host->membership().Fill(resp);
  }
  for (const ShardStore::DropRecord& d : shard_->store().DropRecords()) {
    v1::TrainerDrop* t = resp->add_trainer_drops();
    t->set_rank(d.rank);
    t->set_group(d.group);
    t->set_step(d.step);
    t->set_landed_mask(d.landed_mask);
  }
}

void AdminService::FillCheckpointStatus(v1::CheckpointStatus* status) const {
  const ShardServiceOptions& options = shard_->options();
  ShardStore* const store = &shard_->store();
  const ShardService::Restored restored = shard_->restored();
  status->set_enabled(!options.store.checkpoint.root.empty());
  status->set_restored(restored.restored);
  status->set_restored_step(restored.step);
  if (CheckpointWriter* w = store->checkpoint_writer()) {
    const CheckpointWriteStats st = w->last_stats();
    status->set_writes_completed(w->writes_completed());
    status->set_last_written_step(st.step);
    status->set_last_bytes_written(st.bytes_written);
    status->set_last_stall_seconds(st.stall_seconds);
    status->set_last_write_seconds(st.write_seconds);
    status->set_last_error(std::string(w->last_error().message()));
  }
  uint64_t step = 0;
  if (options.coordinator_host &&
      options.coordinator_host->LastComplete(&step)) {
    status->set_has_complete(true);
    status->set_last_complete_step(step);
  }
}

grpc::Status AdminService::RequestCheckpoint(
    grpc::ServerContext* ctx, const v1::RequestCheckpointRequest* /*req*/,
    v1::RequestCheckpointResponse* resp) {
  if (grpc::Status denied = shard_->options().auth->Check(*ctx, RpcRole::kAdmin,
                                                          "RequestCheckpoint");
      !denied.ok()) {
    return denied;
  }
  const ShardServiceOptions& options = shard_->options();
  ShardStore* const store = &shard_->store();
  if (!options.coordinator_host) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are requested from the coordinator (shard 0)"));
  }
  if (!options.coordinator_host->checkpoints_on()) {
    return Error(absl::FailedPreconditionError(
        "checkpoints are off (start the servers with --checkpoint_dir)"));
  }
  if (!store->registered()) {
    return Error(absl::FailedPreconditionError("no model is registered yet"));
  }
  auto g = options.coordinator_host->TakeCheckpoint(shard_->Deadline(ctx));
  if (!g.ok()) return Error(g.status());
  resp->set_step(g->step);
  resp->set_base(g->base_step == g->step);
  resp->set_bytes_written(g->bytes_written);
  resp->set_directory(options.store.checkpoint.root + "/" +
                      StepDirName(g->step));
  return grpc::Status::OK;
}

}  // namespace zshard
