// ShardService's data plane RPCs: leases and landed gradients (DESIGN.md,
// "Data plane"); the inline transport serves its own bytes. See
// shard_service.h.
#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/model/wire_format.h"
#include "server/rpc/shard_service.h"

namespace zshard {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

void FillRegion(const RemoteRegion& r, v1::TransportRegion* out) {
  out->set_address(r.address);
  out->set_size(r.size);
  out->set_key(r.key);
}

v1::ReserveLandingResponse GrantResponse(const LandingGrant& grant) {
  v1::ReserveLandingResponse resp;
  resp.set_slot(grant.slot);
  FillRegion(grant.region, resp.mutable_region());
  resp.set_offset(grant.offset);
  resp.set_landing_elements(grant.elements);
  return resp;
}

}  // namespace

grpc::Status ShardService::Lease(grpc::ServerContext* ctx,
                                 const v1::LeaseRequest* req,
                                 v1::LeaseResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Lease");
      !denied.ok()) {
    return denied;
  }
  return Error(LeaseAll(
      *req, Deadline(ctx), [ctx] { return ctx->IsCancelled(); }, resp));
}

absl::Status ShardService::LeaseAll(const v1::LeaseRequest& req,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled,
                                    v1::LeaseResponse* resp) {
  if (absl::Status st = WireKindOf(req.dtype()).status(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("lease: ", st.message()));
  }
  if (req.more_groups_size() > kMaxLeaseGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease of ", req.more_groups_size() + 1,
                     " groups in one call; at most ", kMaxLeaseGroups + 1));
  }
  if (req.release_size() > 0) {
    std::vector<uint64_t> ids(req.release().begin(), req.release().end());
    ZS_RETURN_IF_ERROR(store_->Release(req.trainer_rank(), ids));
  }
  std::vector<uint64_t> granted;
  for (int i = -1; i < req.more_groups_size(); ++i) {
    const uint32_t group = i < 0 ? req.group() : req.more_groups(i);
    v1::LeaseResponse* out = i < 0 ? resp : resp->add_more();
    absl::Status st = LeaseOne(req, group, deadline, cancelled, out);
    if (!st.ok()) {
      (void)store_->Release(req.trainer_rank(), granted);
      resp->Clear();
      return st;
    }
    granted.push_back(out->lease_id());
  }
  Touch(req.trainer_rank());
  return absl::OkStatus();
}

absl::Status ShardService::LeaseOne(const v1::LeaseRequest& req, uint32_t group,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled,
                                    v1::LeaseResponse* resp) {
  auto grant = store_->Lease(group, req.min_version(), req.dtype(),
                             req.trainer_rank(), deadline, cancelled);
  if (!grant.ok()) return grant.status();
  resp->set_version(grant->version);
  resp->set_lease_id(grant->lease_id);
  resp->set_offset(grant->offset);
  resp->set_elements(grant->elements);
  resp->set_landing_elements(grant->landing_elements);
  FillRegion(grant->values, resp->mutable_values());
  resp->set_lease_seconds(absl::ToDoubleSeconds(options_.store.lease_timeout));
  CountBytes(req.trainer_rank(), grant->values.size, 0);
  return absl::OkStatus();
}

void ShardService::StartLeaseCall(const std::string& header,
                                  Transport::CallAnswer answer) {
  auto call = std::make_shared<v1::LeaseCall>();
  if (!call->ParseFromString(header)) {
    answer(absl::InvalidArgumentError(
        "a lease call over the transport does not parse as a LeaseCall"));
    return;
  }
  if (absl::Status st = CheckCallToken(call->request().trainer_rank(),
                                       call->token(), "lease");
      !st.ok()) {
    answer(st);
    return;
  }
  const absl::Time deadline = CallDeadline(call->timeout_ms());
  absl::Status started = waits_.Run(
      [this, call, answer, deadline](const std::function<bool()>& cancelled) {
        v1::LeaseResponse resp;
        absl::Status st = LeaseAll(call->request(), deadline, cancelled, &resp);
        if (st.ok()) {
          answer(resp.SerializeAsString());
        } else {
          answer(st);
        }
      });
  if (!started.ok()) answer(started);
}

grpc::Status ShardService::Release(grpc::ServerContext* ctx,
                                   const v1::ReleaseRequest* req,
                                   v1::ReleaseResponse* /*resp*/) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Release");
      !denied.ok()) {
    return denied;
  }
  std::vector<uint64_t> ids(req->lease_ids().begin(), req->lease_ids().end());
  return Error(store_->Release(req->trainer_rank(), ids));
}

grpc::Status ShardService::ReserveLanding(grpc::ServerContext* ctx,
                                          const v1::ReserveLandingRequest* req,
                                          v1::ReserveLandingResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "ReserveLanding");
      !denied.ok()) {
    return denied;
  }
  if (absl::Status st = WireKindOf(req->dtype()).status(); !st.ok()) {
    return Error(
        absl::InvalidArgumentError(absl::StrCat("gradient: ", st.message())));
  }
  auto grant = store_->ReserveLanding(
      req->group(), req->step(), req->micro_step(), req->trainer_rank(),
      req->dtype(), Deadline(ctx), [ctx] { return ctx->IsCancelled(); });
  if (!grant.ok()) return Error(grant.status());
  *resp = GrantResponse(*grant);
  Touch(req->trainer_rank());
  return grpc::Status::OK;
}

grpc::Status ShardService::Landed(grpc::ServerContext* ctx,
                                  const v1::LandedRequest* req,
                                  v1::LandedResponse* resp) {
  if (grpc::Status denied =
          options_.auth->Check(*ctx, RpcRole::kTrainer, "Landed");
      !denied.ok()) {
    return denied;
  }
  return Error(LandedOne(*req, resp));
}

absl::Status ShardService::CheckCallToken(uint32_t rank, uint64_t token,
                                          const char* what) {
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(rank);
  if (it == trainers_.end() || it->second.call_token != token) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " call for trainer rank ", rank, " on shard ",
        options_.store.shard_id,
        " without the call token of that rank's last Join (a trainer "
        "process that joined again since, or none that joined)"));
  }
  return absl::OkStatus();
}

void ShardService::StartReserveLandingCall(const std::string& header,
                                           Transport::CallAnswer answer) {
  auto call = std::make_shared<v1::ReserveLandingCall>();
  if (!call->ParseFromString(header)) {
    answer(absl::InvalidArgumentError(
        "a reserve-landing call over the transport does not parse as a "
        "ReserveLandingCall"));
    return;
  }
  const v1::ReserveLandingRequest& req = call->request();
  if (absl::Status st =
          CheckCallToken(req.trainer_rank(), call->token(), "reserve-landing");
      !st.ok()) {
    answer(st);
    return;
  }
  if (absl::Status st = WireKindOf(req.dtype()).status(); !st.ok()) {
    answer(
        absl::InvalidArgumentError(absl::StrCat("gradient: ", st.message())));
    return;
  }
  absl::StatusOr<std::optional<LandingGrant>> grant =
      store_->TryReserveLanding(req.group(), req.step(), req.micro_step(),
                                req.trainer_rank(), req.dtype());
  Touch(req.trainer_rank());
  if (!grant.ok()) {
    answer(grant.status());
    return;
  }
  if (*grant) {
    answer(GrantResponse(**grant).SerializeAsString());
    return;
  }
  if (call->timeout_ms() == 0) {
    v1::ReserveLandingResponse resp;
    resp.set_no_slot(true);
    answer(resp.SerializeAsString());
    return;
  }
  // The pool is full for now: a wait for a slot, as gRPC's.
  const absl::Time deadline = CallDeadline(call->timeout_ms());
  absl::Status started = waits_.Run(
      [this, call, answer, deadline](const std::function<bool()>& cancelled) {
        const v1::ReserveLandingRequest& req = call->request();
        absl::StatusOr<LandingGrant> grant = store_->ReserveLanding(
            req.group(), req.step(), req.micro_step(), req.trainer_rank(),
            req.dtype(), deadline, cancelled);
        if (grant.ok()) {
          Touch(req.trainer_rank());
          answer(GrantResponse(*grant).SerializeAsString());
        } else {
          answer(grant.status());
        }
      });
  if (!started.ok()) answer(started);
}

absl::StatusOr<std::string> ShardService::AnswerLandedCall(
    const std::string& header) {
  v1::LandedCall call;
  if (!call.ParseFromString(header)) {
    return absl::InvalidArgumentError(
        "a landed call over the transport does not parse as a LandedCall");
  }
  ZS_RETURN_IF_ERROR(CheckCallToken(call.request().trainer_rank(),
                                    call.token(), "landed"));
  v1::LandedResponse resp;
  ZS_RETURN_IF_ERROR(LandedOne(call.request(), &resp));
  return resp.SerializeAsString();
}

absl::Status ShardService::LandedOne(const v1::LandedRequest& req,
                                     v1::LandedResponse* resp) {
  if (absl::Status st = WireKindOf(req.dtype()).status(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient: ", st.message()));
  }
  if (req.trainer_state().size() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_state of ",
                                                   req.trainer_state().size(),
                                                   " bytes exceeds 64 KiB"));
  }
  std::optional<uint32_t> slot;
  if (req.has_slot()) slot = req.slot();
  ZS_ASSIGN_OR_RETURN(uint64_t bytes,
                      store_->Landed(req.group(), req.step(), req.micro_step(),
                                     req.trainer_rank(), req.dtype(), slot,
                                     req.credit(), req.trainer_state()));
  CountBytes(req.trainer_rank(), 0, bytes);
  if (req.want_credit()) {
    if (auto credit = store_->GrantCredit(req.trainer_rank())) {
      v1::LandingCredit* c = resp->mutable_credit();
      c->set_slot(credit->slot);
      FillRegion(credit->region, c->mutable_region());
      c->set_offset(credit->offset);
      c->set_capacity_elements(credit->elements);
    }
  }
  Touch(req.trainer_rank());
  return absl::OkStatus();
}

}  // namespace zshard
