// The coordinator's side of in-memory snapshots and shard replacement
// (issue 16, "Shards: replacement from a peer's memory"): which snapshot
// steps are held everywhere, which one a replacement restores, the rollback
// of every other shard, and fencing a replaced process.
#include <algorithm>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/shard_restore.h"
#include "server/coordinator/coordinator.h"

namespace zshard {

void Coordinator::SetHeldSnapshots(const HeldSnapshots* held) { held_ = held; }

void Coordinator::SetRolledBackHook(RolledBackFn hook) {
  rolled_back_ = std::move(hook);
}

uint64_t Coordinator::epoch() const {
  absl::MutexLock lock(&snap_mu_);
  return epoch_;
}

absl::Status Coordinator::ReportSnapshot(uint32_t shard, uint64_t step,
                                         uint64_t epoch, absl::Time deadline,
                                         const absl::Status& failed) {
  if (shard >= options_.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportSnapshot: shard id ", shard, " out of range"));
  }
  absl::MutexLock lock(&snap_mu_);
  if (snap_closed_) return absl::AbortedError("the coordinator is stopping");
  if (epoch != epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard, " reported a snapshot of epoch ", epoch,
                     " but the cluster is at epoch ", epoch_,
                     " (a shard was replaced and every shard rolled back)"));
  }
  SnapshotReports& reports = snapshot_reports_[step];
  reports.held.resize(options_.num_shards, false);
  if (!failed.ok()) {
    if (reports.failed.empty()) {
      reports.failed = absl::StrCat("shard ", shard, "'s snapshot of step ",
                                    step, " was not taken: ", failed.message());
    }
  } else {
    reports.held[shard] = true;
  }
  while (snapshot_reports_.size() > 8) {
    snapshot_reports_.erase(snapshot_reports_.begin());
  }
  const uint64_t at = epoch_;
  auto done = [this, step, at]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (epoch_ != at || snap_closed_) return true;
    auto it = snapshot_reports_.find(step);
    return it == snapshot_reports_.end() || !it->second.failed.empty() ||
           std::all_of(it->second.held.begin(), it->second.held.end(),
                       [](bool b) { return b; });
  };
  const bool finished =
      snap_mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (snap_closed_) return absl::AbortedError("the coordinator is stopping");
  if (epoch_ != at) return absl::AbortedError("a shard was replaced meanwhile");
  auto it = snapshot_reports_.find(step);
  if (it == snapshot_reports_.end()) {
    return absl::AbortedError("newer snapshots were reported meanwhile");
  }
  if (!it->second.failed.empty()) return absl::AbortedError(it->second.failed);
  if (finished) return absl::OkStatus();
  std::string missing;
  for (size_t s = 0; s < it->second.held.size(); ++s) {
    if (!it->second.held[s]) {
      absl::StrAppend(&missing, missing.empty() ? "" : ",", s);
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the snapshot of step ", step,
      " is not held for every shard yet; missing shards ", missing));
}

absl::StatusOr<std::vector<v1::SnapshotInventoryResponse>>
Coordinator::Inventories(uint32_t except, absl::Time deadline,
                         std::set<uint32_t>* unreachable) {
  std::vector<v1::SnapshotInventoryResponse> out(options_.num_shards);
  for (uint64_t step : local_->OwnSnapshotSteps()) out[0].add_own_steps(step);
  if (held_) {
    for (const auto& [shard, step] : held_->Inventory()) {
      v1::HeldSnapshot* h = out[0].add_held();
      h->set_shard_id(shard);
      h->set_step(step);
    }
  }
  ZS_ASSIGN_OR_RETURN(auto peers, Peers());
  for (uint32_t s = 1; s < options_.num_shards; ++s) {
    if (s == except) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::SnapshotInventoryRequest req;
    absl::Status st = FromGrpcStatus(
        (*peers)[s].control->SnapshotInventory(&ctx, req, &out[s]));
    if (!st.ok()) {
      // Gone too (or stopped): it holds nothing anybody can use.
      std::cerr << "zshard-server: coordinator: shard " << s
                << " could not be asked which snapshots it holds: "
                << st.message() << "\n";
      out[s].Clear();
      unreachable->insert(s);
    }
  }
  return out;
}

absl::StatusOr<v1::PrepareReplaceResponse> Coordinator::PrepareReplace(
    uint32_t shard, uint32_t num_shards, absl::Time deadline) {
  if (num_shards != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the replacement was started with --num_shards=", num_shards,
        " but the coordinator has ", options_.num_shards));
  }
  if (shard == 0) {
    return absl::FailedPreconditionError(
        "shard 0 answers here (it hosts this coordinator); a dead shard 0 is "
        "replaced with --replace=0 --peer=<a live shard>");
  }
  if (shard >= options_.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard id ", shard, " out of range 1..", options_.num_shards - 1));
  }
  {
    absl::MutexLock lock(&snap_mu_);
    if (disk_rollback_ && disk_rollback_->missing.count(shard)) {
      // The cluster went back to a disk checkpoint without this shard.
      v1::PrepareReplaceResponse resp;
      resp.set_step(disk_rollback_->step);
      resp.set_from_checkpoint(true);
      return resp;
    }
  }
  std::set<uint32_t> unreachable;
  ZS_ASSIGN_OR_RETURN(auto inv, Inventories(shard, deadline, &unreachable));
  return OrFromCheckpoint(shard, ChooseReplacementStep(shard, inv));
}

absl::StatusOr<v1::PrepareReplaceResponse> Coordinator::OrFromCheckpoint(
    uint32_t shard, absl::StatusOr<v1::PrepareReplaceResponse> plan) {
  if (plan.ok() || !absl::IsFailedPrecondition(plan.status())) return plan;
  if (!checkpoints_) {
    return absl::FailedPreconditionError(
        absl::StrCat(plan.status().message(),
                     "; and there is no disk checkpoint to fall back to (no "
                     "--checkpoint_dir)"));
  }
  absl::StatusOr<uint64_t> step =
      NewestRestorableCheckpoint(options_.checkpoint.root);
  if (!step.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        plan.status().message(), "; and ", step.status().message()));
  }
  std::cerr << "zshard-server: coordinator: " << plan.status().message()
            << "; shard " << shard
            << " is replaced from the disk checkpoint at step " << *step
            << " instead, and every shard goes back there\n";
  v1::PrepareReplaceResponse resp;
  resp.set_step(*step);
  resp.set_from_checkpoint(true);
  return resp;
}

absl::StatusOr<v1::PrepareReplaceResponse> Coordinator::ChooseReplacementStep(
    uint32_t shard, const std::vector<v1::SnapshotInventoryResponse>& inv) {
  const uint32_t buddy = (shard + 1) % options_.num_shards;
  std::set<uint64_t> candidates;
  for (const v1::HeldSnapshot& h : inv[buddy].held()) {
    if (h.shard_id() == shard) candidates.insert(h.step());
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    bool everywhere = true;
    for (uint32_t s = 0; s < options_.num_shards && everywhere; ++s) {
      if (s == shard) continue;
      const auto& own = inv[s].own_steps();
      everywhere = std::find(own.begin(), own.end(), *it) != own.end();
    }
    if (!everywhere) continue;
    v1::PrepareReplaceResponse resp;
    resp.set_step(*it);
    resp.set_buddy_shard_id(buddy);
    resp.set_buddy_endpoint(ShardEndpoints()[buddy]);
    return resp;
  }
  std::string what = absl::StrCat("shard ", buddy, " holds shard ", shard,
                                  "'s snapshots of steps [",
                                  absl::StrJoin(candidates, ","), "]");
  for (uint32_t s = 0; s < options_.num_shards; ++s) {
    if (s == shard) continue;
    absl::StrAppend(&what, "; shard ", s, " keeps its own of steps [",
                    absl::StrJoin(inv[s].own_steps(), ","), "]");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no snapshot step can replace shard ", shard, " (", what, ")"));
}

absl::Status Coordinator::RollBackShards(const RollBackPlan& plan,
                                         const std::vector<uint32_t>& ranks,
                                         std::set<uint32_t>* missing,
                                         absl::Time deadline) {
  ZS_ASSIGN_OR_RETURN(auto peers, Peers());
  for (uint32_t s = 0; s < options_.num_shards; ++s) {
    absl::Status st;
    if (s == 0 && plan.replaced == 0) {
      local_->ResetRoster(ranks, plan.step);
    } else if (s == 0 && plan.from_checkpoint) {
      st =
          RollBackToCheckpoint(*local_, plan.step, ranks, plan.reason).status();
    } else if (s == 0) {
      st = local_->RollBack(plan.step, ranks, plan.reason);
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      v1::RollBackRequest req;
      req.set_step(plan.step);
      req.set_epoch(plan.epoch);
      req.set_reason(plan.reason);
      req.set_roster_only(s == plan.replaced);
      req.set_coordinator(plan.coordinator);
      req.set_from_checkpoint(plan.from_checkpoint);
      for (uint32_t r : ranks) req.add_trainer_ranks(r);
      v1::RollBackResponse resp;
      st = FromGrpcStatus((*peers)[s].control->RollBack(&ctx, req, &resp));
      if (!st.ok() && plan.from_checkpoint && s != plan.replaced &&
          (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st))) {
        // Gone too: it is replaced from the same checkpoint when its
        // replacement comes (PrepareReplace answers that step).
        std::cerr << "zshard-server: coordinator: shard " << s
                  << " cannot be reached (" << st.message()
                  << "); it must be replaced too (zshard-server --replace=" << s
                  << ")\n";
        missing->insert(s);
        continue;
      }
    }
    if (!st.ok()) {
      return absl::Status(
          st.code(),
          absl::StrCat("shard ", s, " could not roll back to ",
                       plan.from_checkpoint ? "the checkpoint at " : "",
                       "step ", plan.step, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SnapshotHeader> Coordinator::CheckpointResume(
    uint64_t step) const {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> r,
                      CheckpointReader::Open(options_.checkpoint.root, step));
  v1::SnapshotHeader h;
  h.set_step(step);
  h.set_last_step_skipped(r->global().last_step_skipped);
  for (const auto& [rank, state] : r->global().trainer_states) {
    (*h.mutable_trainer_states())[rank] = state;
  }
  return h;
}

absl::StatusOr<uint64_t> Coordinator::ReplaceShard(uint32_t shard,
                                                   const std::string& endpoint,
                                                   uint64_t step,
                                                   bool from_checkpoint,
                                                   absl::Time deadline) {
  if (shard == 0 || shard >= options_.num_shards || endpoint.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a replacement names a shard 1..", options_.num_shards - 1,
        " and its endpoint (got shard ", shard, ", '", endpoint, "')"));
  }
  absl::MutexLock one(&replace_mu_);
  if (absl::StatusOr<uint64_t> epoch =
          JoinDiskRollBack(shard, endpoint, step, deadline);
      !absl::IsNotFound(epoch.status())) {
    return epoch;
  }
  v1::SnapshotHeader header;
  if (from_checkpoint) {
    ZS_ASSIGN_OR_RETURN(header, CheckpointResume(step));
  } else {
    const std::shared_ptr<const Snapshot> mine = local_->OwnSnapshot(step);
    if (!mine) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard 0 keeps no snapshot of step ", step,
                       " any more; start the "
                       "replacement again"));
    }
    header = mine->header;
  }
  RollBackPlan plan;
  plan.replaced = shard;
  plan.step = step;
  plan.from_checkpoint = from_checkpoint;
  {
    absl::MutexLock lock(&snap_mu_);
    plan.epoch = epoch_ + 1;
  }
  // The new endpoint first: the rollback reaches the replacement there.
  {
    absl::MutexLock lock(&mu_);
    shard_endpoints_[shard] = endpoint;
    peers_.reset();
  }
  plan.reason = absl::StrCat(
      "shard ", shard, " was replaced by ", endpoint,
      from_checkpoint
          ? " from the disk checkpoint (its buddy's snapshot is gone too)"
          : " from its buddy's snapshot");
  std::set<uint32_t> missing;
  std::vector<uint32_t> expected;
  ZS_RETURN_IF_ERROR(membership_->RollBack(
      step, plan.reason, [&](const std::vector<uint32_t>& ranks) {
        expected = ranks;
        return RollBackShards(plan, ranks, &missing, deadline);
      }));
  FinishRollBack(plan, header, expected, missing);
  std::cerr << "zshard-server: coordinator: shard " << shard << " replaced by "
            << endpoint << "; every shard rolled back to "
            << (from_checkpoint ? "the checkpoint at " : "") << "step " << step
            << " (epoch " << plan.epoch << ")\n";
  return plan.epoch;
}

void Coordinator::FinishRollBack(const RollBackPlan& plan,
                                 const v1::SnapshotHeader& header,
                                 const std::vector<uint32_t>& ranks,
                                 const std::set<uint32_t>& missing) {
  {
    absl::MutexLock lock(&snap_mu_);
    epoch_ = plan.epoch;
    snapshot_reports_.clear();
    disk_rollback_.reset();
    if (!missing.empty()) {
      disk_rollback_ = DiskRollBack{plan.step, missing, ranks};
    }
  }
  if (rolled_back_) rolled_back_(header, plan.epoch);
}

absl::StatusOr<uint64_t> Coordinator::JoinDiskRollBack(
    uint32_t shard, const std::string& endpoint, uint64_t step,
    absl::Time deadline) {
  DiskRollBack pending;
  uint64_t epoch = 0;
  {
    absl::MutexLock lock(&snap_mu_);
    if (!disk_rollback_ || !disk_rollback_->missing.count(shard)) {
      return absl::NotFoundError("no rollback waits for this shard");
    }
    pending = *disk_rollback_;
    epoch = epoch_;
  }
  if (step != pending.step) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard, "'s replacement restored step ", step,
                     " but the cluster went back to the checkpoint at step ",
                     pending.step, "; start the replacement again"));
  }
  {
    absl::MutexLock lock(&mu_);
    shard_endpoints_[shard] = endpoint;
    peers_.reset();
  }
  ZS_ASSIGN_OR_RETURN(auto peers, Peers());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::RollBackRequest req;
  req.set_step(step);
  req.set_epoch(epoch);
  req.set_reason("replaced");
  req.set_roster_only(true);
  req.set_coordinator(ShardEndpoints()[0]);
  for (uint32_t r : pending.ranks) req.add_trainer_ranks(r);
  v1::RollBackResponse resp;
  ZS_RETURN_IF_ERROR(
      FromGrpcStatus((*peers)[shard].control->RollBack(&ctx, req, &resp)));
  absl::MutexLock lock(&snap_mu_);
  if (disk_rollback_) {
    disk_rollback_->missing.erase(shard);
    if (disk_rollback_->missing.empty()) disk_rollback_.reset();
  }
  std::cerr << "zshard-server: coordinator: shard " << shard << " replaced by "
            << endpoint << " at the checkpoint at step " << step
            << ", where the cluster went back (epoch " << epoch << ")\n";
  return epoch;
}

absl::StatusOr<v1::ShardHeartbeatResponse> Coordinator::ShardHeartbeat(
    uint32_t shard, const std::string& endpoint, uint64_t epoch) {
  if (shard == 0 || shard >= options_.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardHeartbeat: shard id ", shard, " out of range"));
  }
  const std::vector<std::string> endpoints = ShardEndpoints();
  v1::ShardHeartbeatResponse resp;
  resp.set_epoch(this->epoch());
  if (!endpoints[shard].empty() && endpoints[shard] != endpoint) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard, " is served by ", endpoints[shard],
                     " since epoch ", resp.epoch(), "; this process (",
                     endpoint, ", epoch ", epoch, ") was replaced"));
  }
  for (const std::string& e : endpoints) resp.add_endpoints(e);
  return resp;
}

}  // namespace zshard
