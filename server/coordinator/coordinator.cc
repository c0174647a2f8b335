#include "server/coordinator/coordinator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"

namespace zshard {

Coordinator::Coordinator(const CoordinatorOptions& options, ShardStore* local)
    : options_(options), local_(local) {
  if (!options.checkpoint.root.empty()) {
    CheckpointCoordinatorOptions co = options.checkpoint;
    co.history = [this] {
      std::vector<MembershipRecord> out;
      for (const v1::MembershipEvent& e : membership_->History()) {
        out.push_back(ToRecord(e));
      }
      return out;
    };
    checkpoints_ = std::make_unique<CheckpointCoordinator>(co);
  }
  {
    absl::MutexLock lock(&mu_);
    shard_endpoints_.assign(options.num_shards, "");
  }
  MembershipOptions mo;
  mo.ranks = options.world_size;
  mo.trainer_timeout = options.trainer_timeout;
  membership_ =
      std::make_unique<Membership>(mo, static_cast<ShardFanout*>(this));
}

Coordinator::~Coordinator() { membership_.reset(); }

void Coordinator::SetLocalEndpoint(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  shard_endpoints_[0] = endpoint;
}

absl::Status Coordinator::RegisterShard(
    uint32_t shard_id, uint32_t num_shards, const std::string& endpoint,
    const std::string& checkpoint_settings) {
  if (num_shards != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_id, " was started with --num_shards=", num_shards,
        " but the coordinator has ", options_.num_shards));
  }
  if (shard_id == 0 || shard_id >= options_.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard id ", shard_id, " out of range 1..", options_.num_shards - 1));
  }
  if (endpoint.empty()) {
    return absl::InvalidArgumentError("RegisterShard: empty endpoint");
  }
  const std::string mine = local_->CheckpointSettings();
  if (checkpoint_settings != mine) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, " has checkpoint settings '",
                     checkpoint_settings, "' but the coordinator '", mine,
                     "' (start every shard with --checkpoint_dir and the same "
                     "zshard_checkpoint block)"));
  }
  absl::MutexLock lock(&mu_);
  if (shard_endpoints_[shard_id] != endpoint) peers_.reset();
  shard_endpoints_[shard_id] = endpoint;
  return absl::OkStatus();
}

std::vector<std::string> Coordinator::ShardEndpoints() const {
  absl::MutexLock lock(&mu_);
  return shard_endpoints_;
}

absl::Status Coordinator::AwaitShards(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto all_known = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return std::none_of(shard_endpoints_.begin(), shard_endpoints_.end(),
                        [](const std::string& e) { return e.empty(); });
  };
  if (mu_.AwaitWithDeadline(absl::Condition(&all_known), deadline))
    return absl::OkStatus();
  std::string missing;
  for (size_t s = 0; s < shard_endpoints_.size(); ++s) {
    if (shard_endpoints_[s].empty()) absl::StrAppend(&missing, " ", s);
  }
  return absl::UnavailableError(absl::StrCat(
      "deadline passed waiting for shards to announce themselves; missing:",
      missing));
}

void Coordinator::Close() {
  {
    absl::MutexLock lock(&norm_mu_);
    norm_closed_ = true;
  }
  absl::MutexLock lock(&snap_mu_);
  snap_closed_ = true;
}

absl::StatusOr<NormTotals> Coordinator::CollectNorm(uint64_t step,
                                                    uint32_t shard,
                                                    double sum_squares,
                                                    bool non_finite,
                                                    absl::Time deadline) {
  if (shard >= options_.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard id ", shard, " out of range"));
  }
  absl::MutexLock lock(&norm_mu_);
  if (norm_closed_) return absl::AbortedError("the coordinator is stopping");
  auto& reports = norms_[step];
  if (reports.empty()) reports.resize(options_.num_shards);
  reports[shard] = NormReport{true, sum_squares, non_finite};
  while (norms_.size() > 8) norms_.erase(norms_.begin());
  auto all = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (norm_closed_) return true;
    auto it = norms_.find(step);
    if (it == norms_.end()) return true;  // forgotten: answered below
    for (const auto& r : it->second) {
      if (!r.present) return false;
    }
    return true;
  };
  const bool all_reported =
      norm_mu_.AwaitWithDeadline(absl::Condition(&all), deadline);
  if (norm_closed_) return absl::AbortedError("the coordinator is stopping");
  if (!all_reported) {
    std::string missing;
    for (size_t s = 0; s < reports.size(); ++s) {
      if (!reports[s].present)
        absl::StrAppend(&missing, missing.empty() ? "" : ",", s);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("coordinator: shards ", missing, " did not report step ",
                     step, " before the deadline"));
  }
  auto it = norms_.find(step);
  if (it == norms_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is too old"));
  }
  NormTotals t;
  for (const auto& r : it->second) {  // shard order: the same sum everywhere
    t.sum_squares += r.sum_squares;
    t.non_finite |= r.non_finite;
  }
  return t;
}

absl::Status Coordinator::CommitCheckpoint(const ShardCommit& commit) {
  if (!checkpoints_) {
    return absl::FailedPreconditionError(
        "checkpoints are off on the coordinator (no --checkpoint_dir)");
  }
  if (commit.shard_id >= options_.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint commit from shard ", commit.shard_id, " of ",
                     options_.num_shards));
  }
  ZS_ASSIGN_OR_RETURN(v1::ModelSpec spec, local_->spec());
  return checkpoints_->Commit(commit, spec);
}

bool Coordinator::LastComplete(uint64_t* step) const {
  return checkpoints_ && checkpoints_->last_complete(step);
}

absl::Status Coordinator::WaitCheckpointsSettled(absl::Time deadline) {
  return checkpoints_ ? checkpoints_->WaitSettled(deadline) : absl::OkStatus();
}

absl::StatusOr<uint64_t> Coordinator::NewestVersion(
    const std::vector<Peer>& peers, absl::Time deadline) {
  uint64_t newest = CurrentStep();
  for (size_t s = 1; s < peers.size(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::GetStatusResponse st;
    ZS_RETURN_IF_ERROR(FromGrpcStatus(
        peers[s].admin->GetStatus(&ctx, v1::GetStatusRequest(), &st)));
    newest = std::max(newest, st.max_version());
  }
  return newest;
}

absl::StatusOr<GlobalManifest> Coordinator::TakeCheckpoint(
    absl::Time deadline) {
  if (!checkpoints_) {
    return absl::FailedPreconditionError(
        "checkpoints are off (start the servers with --checkpoint_dir)");
  }
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<const std::vector<Peer>> shared, Peers());
  const std::vector<Peer>& peers = *shared;
  const size_t num_shards = peers.size();
  uint64_t floor = 1;
  absl::Status last;
  while (absl::Now() < deadline) {
    // The newest version anywhere: the cluster is at or just before it.
    ZS_ASSIGN_OR_RETURN(uint64_t newest, NewestVersion(peers, deadline));
    const uint64_t step = std::max(floor, newest);
    bool accepted = true;
    for (size_t s = 0; s < num_shards && accepted; ++s) {
      if (s == 0) {
        last = local_->ScheduleCheckpoint(step);
      } else {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        v1::ScheduleCheckpointRequest req;
        req.set_step(step);
        req.set_coordinator_epoch(epoch());
        v1::ScheduleCheckpointResponse resp;
        last = FromGrpcStatus(
            peers[s].control->ScheduleCheckpoint(&ctx, req, &resp));
        if (!last.ok()) {
          last = absl::Status(last.code(),
                              absl::StrCat("shard ", s, ": ", last.message()));
        }
      }
      // ABORTED: that shard is past `step` or still staging an earlier one;
      // anything else (off, stage 0, unreachable) is final.
      if (!last.ok() && !absl::IsAborted(last)) return last;
      accepted = last.ok();
    }
    if (accepted) return checkpoints_->WaitComplete(step, deadline);
    std::cerr << "zshard-server: coordinator: checkpoint at step " << step
              << " not accepted (" << last.message() << "); trying step "
              << step + 1 << "\n";
    floor = step + 1;  // someone was past it: the next boundary
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no step accepted for a checkpoint before the deadline: ",
                   last.message()));
}

absl::StatusOr<std::shared_ptr<const std::vector<Coordinator::Peer>>>
Coordinator::Peers() {
  absl::MutexLock lock(&mu_);
  if (peers_) return peers_;
  for (size_t s = 1; s < shard_endpoints_.size(); ++s) {
    if (shard_endpoints_[s].empty()) {
      return absl::UnavailableError(
          absl::StrCat("shard ", s, " has not announced itself"));
    }
  }
  auto peers = std::make_shared<std::vector<Peer>>(shard_endpoints_.size());
  for (size_t s = 1; s < shard_endpoints_.size(); ++s) {
    auto channel = options_.peers->Channel(shard_endpoints_[s]);
    (*peers)[s].admin = v1::AdminService::NewStub(channel);
    (*peers)[s].control = v1::ShardControl::NewStub(channel);
  }
  peers_ = peers;
  return peers_;
}

absl::StatusOr<uint64_t> Coordinator::PrepareAdmit(uint32_t rank,
                                                   uint64_t min_step,
                                                   const std::string& identity,
                                                   absl::Time deadline) {
  ZS_ASSIGN_OR_RETURN(auto peers, Peers());
  ZS_ASSIGN_OR_RETURN(uint64_t step,
                      local_->PrepareAdmit(rank, min_step, identity, deadline));
  for (size_t s = 1; s < peers->size(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::PrepareAdmitRequest req;
    req.set_trainer_rank(rank);
    req.set_min_step(min_step);
    req.set_identity(identity);
    req.set_coordinator_epoch(epoch());
    v1::PrepareAdmitResponse resp;
    absl::Status st =
        FromGrpcStatus((*peers)[s].control->PrepareAdmit(&ctx, req, &resp));
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("shard ", s, ": ", st.message()));
    }
    step = std::max(step, resp.step());
  }
  return step;
}

absl::Status Coordinator::Admit(uint32_t rank, uint64_t step,
                                absl::Time deadline) {
  ZS_ASSIGN_OR_RETURN(auto peers, Peers());
  ZS_RETURN_IF_ERROR(local_->Admit(rank, step));
  for (size_t s = 1; s < peers->size(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::AdmitTrainerRequest req;
    req.set_trainer_rank(rank);
    req.set_step(step);
    req.set_coordinator_epoch(epoch());
    v1::AdmitTrainerResponse resp;
    absl::Status st =
        FromGrpcStatus((*peers)[s].control->AdmitTrainer(&ctx, req, &resp));
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("shard ", s, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Drop(uint32_t rank, const std::string& reason,
                               absl::Time deadline) {
  local_->DropTrainer(rank, reason);
  auto peers = Peers();
  if (!peers.ok()) return peers.status();
  std::string failed;
  for (size_t s = 1; s < (*peers)->size(); ++s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::DropTrainerRequest req;
    req.set_trainer_rank(rank);
    req.set_reason(reason);
    req.set_coordinator_epoch(epoch());
    v1::DropTrainerResponse resp;
    absl::Status st =
        FromGrpcStatus((**peers)[s].control->DropTrainer(&ctx, req, &resp));
    if (!st.ok())
      absl::StrAppend(&failed, failed.empty() ? "" : "; ", "shard ", s, ": ",
                      st.message());
  }
  if (!failed.empty()) return absl::UnavailableError(failed);
  return absl::OkStatus();
}

uint64_t Coordinator::CurrentStep() {
  uint64_t newest = 0;
  for (const GroupProgress& p : local_->Progress()) {
    if (p.slice.size() > 0) newest = std::max(newest, p.version);
  }
  return newest;
}

}  // namespace zshard
