#include "client/core/data_plane.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/transport/transport_factory.h"

namespace zshard {
namespace {

// Transfers are split into pieces of this size, all in flight at once.
constexpr size_t kPieceBytes = 64 << 20;  // bounds one request

RemoteRegion FromProto(const v1::TransportRegion& r) {
  return RemoteRegion{r.address(), r.size(), r.key()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Create(
    Cluster* cluster, absl::Duration peer_wait) {
  if (cluster->transport().empty()) {
    return absl::FailedPreconditionError(
        "the shards run without a data plane transport");
  }
  std::unique_ptr<DataPlane> d(new DataPlane());
  d->cluster_ = cluster;
  d->peer_wait_ = peer_wait;
  d->name_ = cluster->transport();
  TransportSecurity security;
  security.channels = cluster->credentials();
  // One context for the process's data plane (UCX: one UCP context), a
  // transport (UCX worker and progress thread) per shard: transfers from
  // several shards proceed on several threads.
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<TransportContext> context,
                      CreateTransportContext(d->name_, security));
  for (uint32_t s = 0; s < cluster->num_shards(); ++s) {
    ZS_ASSIGN_OR_RETURN(
        std::unique_ptr<Transport> t,
        context->CreateTransport(absl::StrCat("trainer ", cluster->rank())));
    d->put_then_call_ = t->properties().put_then_call;
    d->get_many_ = t->properties().get_many;
    d->transports_.push_back(std::move(t));
    auto pair = d->transports_.back()->Connect(cluster->transport_address(s));
    if (!pair.ok()) return cluster->Annotate(s, pair.status());
    d->pairs_.push_back(std::move(*pair));
  }
  absl::MutexLock lock(&d->mu_);
  d->to_release_.resize(cluster->num_shards());
  d->step_grants_.resize(cluster->num_shards());
  d->known_groups_.resize(cluster->num_shards());
  d->leasing_.assign(cluster->num_shards(), false);
  d->lease_failures_.resize(cluster->num_shards());
  d->credits_.resize(cluster->num_shards());
  return d;
}

DataPlane::~DataPlane() {
  // Best effort: leases end by their deadline anyway.
  bool aborted;
  {
    absl::MutexLock lock(&mu_);
    aborted = !aborted_.empty();
  }
  if (!aborted) (void)ReleaseAll(absl::Now() + absl::Seconds(2));
  pairs_.clear();  // before the transports
}

DataPlane::TrackedCall::TrackedCall(DataPlane* plane, absl::Time deadline)
    : plane_(plane) {
  ctx_.set_deadline(absl::ToChronoTime(deadline));
  absl::MutexLock lock(&plane_->mu_);
  if (!plane_->aborted_.empty()) ctx_.TryCancel();  // fails when started
  plane_->calls_.insert(&ctx_);
}

DataPlane::TrackedCall::~TrackedCall() {
  absl::MutexLock lock(&plane_->mu_);
  plane_->calls_.erase(&ctx_);
}

absl::Status DataPlane::Settled(const absl::Status& st) {
  if (absl::IsAborted(st)) Abort(std::string(st.message()));
  if (absl::IsCancelled(st)) {
    absl::MutexLock lock(&mu_);
    if (!aborted_.empty()) return absl::CancelledError(aborted_);
  }
  return st;
}

void DataPlane::Abort(const std::string& why) {
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? "the data plane was given up" : why;
    reason = aborted_;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  }
  // Transfers and transport calls (Landed) in flight end too.
  const absl::Status st = absl::CancelledError(
      absl::StrCat("the data plane was given up: ", reason));
  for (auto& pair : pairs_) pair->Abort(st);
}

std::string DataPlane::Lanes() const {
  std::vector<std::string> parts;
  for (size_t s = 0; s < pairs_.size(); ++s) {
    parts.push_back(absl::StrCat("shard ", s, ": ", pairs_[s]->Lanes()));
  }
  return absl::StrJoin(parts, "; ");
}

namespace {

// A transport call's timeout for a wait until `deadline` (at least 1 ms).
uint64_t TimeoutMs(absl::Time deadline) {
  return static_cast<uint64_t>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

}  // namespace

absl::StatusOr<v1::LeaseResponse> DataPlane::LeaseOn(
    uint32_t shard, const std::vector<uint32_t>& groups, uint64_t min_version,
    const WireFormat& wire, absl::Time* deadline) {
  v1::LeaseRequest req;
  req.set_group(groups.at(0));
  for (size_t i = 1; i < groups.size(); ++i) req.add_more_groups(groups[i]);
  req.set_min_version(min_version);
  req.set_dtype(wire.dtype());
  req.set_trainer_rank(cluster_->rank());
  std::vector<uint64_t> releasing;
  {
    absl::MutexLock lock(&mu_);
    releasing.swap(to_release_[shard]);
  }
  for (uint64_t id : releasing) req.add_release(id);
  // Over the transport, not gRPC (one per shard and version: see
  // v1::TransportCall); the shard answers once the version is published.
  v1::LeaseCall call;
  *call.mutable_request() = std::move(req);
  call.set_token(cluster_->call_token(shard));
  v1::LeaseResponse resp;
  absl::Status st = CallWhilePeersAreLate(
      *deadline - absl::Now(), peer_wait_,
      [&](absl::Time d) {
        resp.Clear();
        call.set_timeout_ms(TimeoutMs(d));
        absl::StatusOr<std::string> reply =
            TransportCallOn(shard, v1::TRANSPORT_CALL_LEASE, "Lease",
                            call.SerializeAsString(), d, /*annotate=*/false);
        if (!reply.ok()) return reply.status();
        if (!resp.ParseFromString(*reply)) {
          return absl::DataLossError("a lease call's answer does not parse");
        }
        return absl::OkStatus();
      },
      deadline);
  if (st.ok() && static_cast<size_t>(resp.more_size()) + 1 != groups.size()) {
    st = absl::DataLossError(absl::StrCat("lease of ", groups.size(),
                                          " groups answered with ",
                                          resp.more_size() + 1, " grants"));
  }
  if (!st.ok()) {
    if (!absl::IsInvalidArgument(st)) {
      // Not released: try again with the next lease (they expire anyway).
      absl::MutexLock lock(&mu_);
      auto& q = to_release_[shard];
      q.insert(q.end(), releasing.begin(), releasing.end());
    }
    return cluster_->Annotate(shard, st);
  }
  return resp;
}

namespace {

// A transfer that outlived its deadline means the shard stopped answering.
absl::Status TransferError(const absl::Status& st) {
  if (!absl::IsDeadlineExceeded(st)) return st;
  return absl::UnavailableError(
      absl::StrCat(st.message(), " (the shard stopped answering)"));
}

// Whether `grant` is what `piece` expects at `version`.
absl::Status CheckGrant(const v1::LeaseResponse& grant,
                        const DataPlane::FetchPiece& piece, uint64_t version) {
  if (grant.version() != version) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", piece.group, " is at version ", grant.version(),
                     ", not ", version, " (the step moved on)"));
  }
  if (grant.values().size() != piece.bytes) {
    return absl::DataLossError(absl::StrCat("group ", piece.group, " slice is ",
                                            grant.values().size(),
                                            " bytes, expected ", piece.bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DataPlane::StartGets(Pair& pair, const FetchPiece& piece,
                                  const v1::LeaseResponse& grant,
                                  std::vector<std::shared_ptr<Request>>* gets,
                                  absl::Time deadline) {
  // Several gets in flight keep emulated transports (tcp) streaming.
  const RemoteRegion values = FromProto(grant.values());
  for (size_t off = 0; off < piece.bytes; off += kPieceBytes) {
    auto get = pair.Get(static_cast<char*>(piece.dest) + off,
                        std::min(kPieceBytes, piece.bytes - off), values, off);
    if (!get.ok()) {
      (void)pair.Wait(*gets, deadline);
      gets->clear();
      return get.status();
    }
    gets->push_back(std::move(*get));
  }
  return absl::OkStatus();
}

void DataPlane::StartGetsTogether(
    Pair& pair, const std::vector<FetchPiece>& pieces, const StepGrants& grants,
    std::vector<absl::Status>* status,
    std::vector<std::vector<std::shared_ptr<Request>>>* gets) {
  std::vector<GetRange> ranges;
  std::vector<size_t> piece_of;  // by range
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!(*status)[i].ok()) continue;
    const RemoteRegion values =
        FromProto(grants.by_group.at(pieces[i].group).values());
    const FetchPiece& p = pieces[i];
    for (size_t off = 0; off < p.bytes; off += kPieceBytes) {
      ranges.push_back(GetRange{static_cast<char*>(p.dest) + off,
                                std::min(kPieceBytes, p.bytes - off), values,
                                off});
      piece_of.push_back(i);
    }
  }
  if (ranges.empty()) return;
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> started =
      pair.GetMany(ranges);
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (started.ok()) {
      (*gets)[piece_of[k]].push_back((*started)[k]);
    } else {
      (*status)[piece_of[k]] = started.status();
    }
  }
}

void DataPlane::ReleaseLaterLocked(uint32_t shard, const StepGrants& grants) {
  for (const auto& [g, grant] : grants.by_group) {
    to_release_[shard].push_back(grant.lease_id());
  }
}

absl::StatusOr<std::shared_ptr<const DataPlane::StepGrants>>
DataPlane::GrantsFor(uint32_t shard, const std::vector<FetchPiece>& pieces,
                     uint64_t version, const WireFormat& wire,
                     absl::Time* deadline) {
  std::vector<uint32_t> groups;
  bool late = false;
  {
    absl::MutexLock lock(&mu_);
    // One lease call per shard at a time: a second fetch (another prefetch
    // batch, started at once) waits for it and then mostly needs no call.
    // That call may wait past its deadline for late trainers (up to
    // peer_wait); when it fails for this version, so does this fetch, with
    // its error.
    auto idle = [this, shard]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !leasing_[shard] || !aborted_.empty();
    };
    const bool waited = leasing_[shard];
    const absl::Time wait_start = absl::Now();
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle),
                               *deadline + peer_wait_)) {
      return cluster_->Annotate(
          shard, absl::DeadlineExceededError(
                     "deadline passed waiting for another lease call"));
    }
    // The wait moves the deadline on, as that call's own did.
    if (waited) *deadline += absl::Now() - wait_start;
    const LeaseFailure& failed = lease_failures_[shard];
    if (waited && !failed.status.ok() && failed.version == version) {
      return failed.status;
    }
    std::set<uint32_t>& known = known_groups_[shard];
    std::shared_ptr<const StepGrants>& held = step_grants_[shard];
    bool covered = held && held->version == version && held->wire == wire;
    std::set<uint32_t> asked;
    for (const FetchPiece& p : pieces) {
      known.insert(p.group);
      if (asked.insert(p.group).second) groups.push_back(p.group);
      if (!covered) continue;
      auto it = held->by_group.find(p.group);
      covered = it != held->by_group.end() && it->second.version() == version;
    }
    if (covered) return held;
    late = held && held->version > version;
    // Every group this trainer fetched from the shard so far, so the rest
    // of the step needs no lease call; the ones asked for first. Not for a
    // late fetch of an older version (the next step's lease is held).
    for (uint32_t g : known) {
      if (!late && !asked.count(g)) groups.push_back(g);
    }
    // The leases held so far go back with this call.
    if (held && !late) {
      ReleaseLaterLocked(shard, *held);
      held.reset();
    }
    leasing_[shard] = true;
  }
  absl::StatusOr<v1::LeaseResponse> leased =
      LeaseOn(shard, groups, version, wire, deadline);
  absl::MutexLock lock(&mu_);
  leasing_[shard] = false;
  lease_failures_[shard] = LeaseFailure{version, leased.status()};
  if (!leased.ok()) return leased.status();
  v1::LeaseResponse& lease = *leased;
  auto fresh = std::make_shared<StepGrants>();
  fresh->version = version;
  fresh->wire = wire;
  for (int i = 0; i < lease.more_size(); ++i) {
    fresh->by_group[groups[i + 1]] = std::move(*lease.mutable_more(i));
  }
  lease.clear_more();
  fresh->by_group[groups[0]] = std::move(lease);
  if (late) {
    // Used once: released with the next lease call (the version stays
    // unchanged until this trainer's next step has pushed anyway).
    ReleaseLaterLocked(shard, *fresh);
    return std::shared_ptr<const StepGrants>(fresh);
  }
  std::shared_ptr<const StepGrants>& held = step_grants_[shard];
  // Another thread's, leased meanwhile: released next time.
  if (held) ReleaseLaterLocked(shard, *held);
  held = fresh;
  return std::shared_ptr<const StepGrants>(fresh);
}

void DataPlane::FetchMany(
    uint32_t shard, const std::vector<FetchPiece>& pieces, uint64_t version,
    const WireFormat& wire, absl::Time deadline,
    const std::function<void(size_t, const absl::Status&)>& done) {
  if (pieces.empty()) return;
  absl::StatusOr<std::shared_ptr<const StepGrants>> grants =
      GrantsFor(shard, pieces, version, wire, &deadline);
  if (!grants.ok()) {
    for (size_t i = 0; i < pieces.size(); ++i) done(i, grants.status());
    return;
  }
  // Every piece's gets in flight at once; each piece is reported as soon as
  // its own bytes are in.
  Pair& pair = *pairs_[shard];
  std::vector<std::vector<std::shared_ptr<Request>>> gets(pieces.size());
  std::vector<absl::Status> status(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const v1::LeaseResponse& grant = (*grants)->by_group.at(pieces[i].group);
    status[i] = CheckGrant(grant, pieces[i], version);
    if (status[i].ok() && !get_many_) {
      status[i] = StartGets(pair, pieces[i], grant, &gets[i], deadline);
    }
  }
  if (get_many_) StartGetsTogether(pair, pieces, **grants, &status, &gets);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (status[i].ok()) status[i] = TransferError(pair.Wait(gets[i], deadline));
    done(i, status[i].ok() ? status[i] : cluster_->Annotate(shard, status[i]));
  }
}

absl::Status DataPlane::Fetch(uint32_t shard, uint32_t group, uint64_t version,
                              const WireFormat& wire, void* dest, size_t bytes,
                              absl::Time deadline) {
  absl::Status result;
  FetchMany(shard, {FetchPiece{group, dest, bytes}}, version, wire, deadline,
            [&result](size_t, const absl::Status& st) { result = st; });
  return result;
}

absl::Status DataPlane::Push(uint32_t shard, uint32_t group, uint64_t step,
                             uint32_t micro_step, const WireFormat& wire,
                             const void* data, size_t bytes,
                             const std::string& trainer_state,
                             absl::Time deadline) {
  return FinishPush(StartPush(shard, group, step, micro_step, wire, data, bytes,
                              trainer_state, deadline));
}

DataPlane::StartedPush DataPlane::StartPush(uint32_t shard, uint32_t group,
                                            uint64_t step, uint32_t micro_step,
                                            const WireFormat& wire,
                                            const void* data, size_t bytes,
                                            const std::string& trainer_state,
                                            absl::Time deadline) {
  StartedPush started;
  started.shard = shard;
  const v1::DType dtype = wire.dtype();
  v1::LandedRequest landed;
  std::optional<PutPart> put;
  std::optional<Credit> credit;
  if (bytes > 0) {
    absl::MutexLock lock(&mu_);
    std::optional<Credit>& held = credits_[shard];
    if (held && wire.Bytes(held->elements) >= bytes) credit.swap(held);
  }
  if (credit) {
    // The slot the shard granted with the last answer: no reservation.
    put = PutPart{data, bytes, credit->region, credit->offset};
    landed.set_slot(credit->slot);
    landed.set_credit(true);
  } else if (bytes > 0) {
    // A slot of the shard's landing pool (waits there while the pool is
    // full), then the bytes straight into it.
    v1::ReserveLandingRequest req;
    req.set_group(group);
    req.set_step(step);
    req.set_micro_step(micro_step);
    req.set_trainer_rank(cluster_->rank());
    req.set_dtype(dtype);
    absl::StatusOr<v1::ReserveLandingResponse> grant =
        Reserve(shard, req, &deadline);
    if (!grant.ok()) {
      started.error = grant.status();
      return started;
    }
    if (wire.Bytes(grant->landing_elements()) != bytes) {
      started.error = cluster_->Annotate(
          shard,
          absl::InvalidArgumentError(absl::StrCat(
              "gradient slice of group ", group, " is ", bytes,
              " bytes, the shard expects ",
              wire.Bytes(grant->landing_elements()), " (",
              grant->landing_elements(), " values in ", wire.name(), ")")));
      return started;
    }
    put = PutPart{data, bytes, FromProto(grant->region()), grant->offset()};
    landed.set_slot(grant->slot());
  }
  landed.set_group(group);
  landed.set_step(step);
  landed.set_micro_step(micro_step);
  landed.set_trainer_rank(cluster_->rank());
  landed.set_dtype(dtype);
  landed.set_trainer_state(trainer_state);
  landed.set_want_credit(true);
  started.deadline = deadline;
  absl::StatusOr<StartedCall> call =
      StartLandedOn(shard, std::move(landed), put ? &*put : nullptr, deadline);
  if (call.ok()) {
    started.call = std::move(*call);
  } else {
    started.error = call.status();
  }
  return started;
}

absl::Status DataPlane::FinishPush(StartedPush started) {
  ZS_RETURN_IF_ERROR(started.error);
  const uint32_t shard = started.shard;
  ZS_ASSIGN_OR_RETURN(
      std::string reply,
      FinishCallOn(shard, std::move(started.call), started.deadline,
                   /*annotate=*/true));
  v1::LandedResponse resp;
  if (!resp.ParseFromString(reply)) {
    return cluster_->Annotate(
        shard, absl::DataLossError("a landed call's answer does not parse"));
  }
  if (resp.has_credit()) {
    const v1::LandingCredit& c = resp.credit();
    absl::MutexLock lock(&mu_);
    credits_[shard] = Credit{c.slot(), FromProto(c.region()), c.offset(),
                             c.capacity_elements()};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DataPlane::TransportCallOn(
    uint32_t shard, v1::TransportCall id, const char* method,
    const std::string& header, absl::Time deadline, bool annotate,
    const PutPart* put) {
  ZS_ASSIGN_OR_RETURN(StartedCall call, StartCallOn(shard, id, method, header,
                                                    deadline, annotate, put));
  return FinishCallOn(shard, std::move(call), deadline, annotate);
}

absl::StatusOr<DataPlane::StartedCall> DataPlane::StartCallOn(
    uint32_t shard, v1::TransportCall id, const char* method,
    const std::string& header, absl::Time deadline, bool annotate,
    const PutPart* put) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.empty()) {
      const absl::Status st = absl::CancelledError(
          absl::StrCat("the data plane was given up: ", aborted_));
      return annotate ? cluster_->Annotate(shard, st) : st;
    }
    ++transport_calls_[method];
  }
  Pair& pair = *pairs_[shard];
  StartedCall call;
  call.reply = std::make_unique<std::string>();
  absl::StatusOr<std::shared_ptr<Request>> sent =
      put ? pair.PutThenCall(put->data, put->bytes, put->region, put->offset,
                             id, header, call.reply.get())
          : pair.Call(id, header, call.reply.get());
  if (!sent.ok()) return CallOutcome(shard, sent.status(), deadline, annotate);
  call.request = std::move(*sent);
  return call;
}

absl::StatusOr<std::string> DataPlane::FinishCallOn(uint32_t shard,
                                                    StartedCall call,
                                                    absl::Time deadline,
                                                    bool annotate) {
  absl::Status st = pairs_[shard]->Wait({call.request}, deadline);
  if (!st.ok()) return CallOutcome(shard, st, deadline, annotate);
  return std::move(*call.reply);
}

absl::Status DataPlane::CallOutcome(uint32_t shard, absl::Status st,
                                    absl::Time deadline, bool annotate) {
  // DEADLINE_EXCEEDED before the deadline is the shard's answer (it waited
  // for late trainers: peer_wait.h); at the deadline, no answer came.
  if (!absl::IsDeadlineExceeded(st) || absl::Now() >= deadline) {
    st = TransferError(st);
  }
  st = Settled(st);
  return annotate ? cluster_->Annotate(shard, st) : st;
}

std::map<std::string, uint64_t> DataPlane::transport_calls() const {
  absl::MutexLock lock(&mu_);
  return transport_calls_;
}

absl::StatusOr<DataPlane::StartedCall> DataPlane::StartLandedOn(
    uint32_t shard, v1::LandedRequest landed, const PutPart* put,
    absl::Time deadline) {
  if (put && !(put_then_call_ && put->bytes <= kPieceBytes)) {
    ZS_RETURN_IF_ERROR(PutAll(shard, put->data, put->bytes, put->region,
                              put->offset, deadline));
    put = nullptr;
  }
  // Over the transport, not gRPC (one per contribution: see
  // v1::TransportCall), in one request with the put where the transport
  // carries both so.
  v1::LandedCall call;
  *call.mutable_request() = std::move(landed);
  call.set_token(cluster_->call_token(shard));
  return StartCallOn(shard, v1::TRANSPORT_CALL_LANDED, "Landed",
                     call.SerializeAsString(), deadline, true, put);
}

absl::Status DataPlane::Heartbeat(const v1::HeartbeatRequest& req,
                                  absl::Time deadline) {
  v1::HeartbeatCall call;
  *call.mutable_request() = req;
  call.set_token(cluster_->call_token(0));
  return TransportCallOn(0, v1::TRANSPORT_CALL_HEARTBEAT, "Heartbeat",
                         call.SerializeAsString(), deadline)
      .status();
}

absl::StatusOr<v1::ReserveLandingResponse> DataPlane::Reserve(
    uint32_t shard, const v1::ReserveLandingRequest& req,
    absl::Time* deadline) {
  // Over the transport: granted at once, or once the shard's pool has a slot
  // for it (the shard waits, answering DEADLINE_EXCEEDED shortly before the
  // call's deadline while trainers ahead in the fold order are late).
  v1::ReserveLandingCall call;
  *call.mutable_request() = req;
  call.set_token(cluster_->call_token(shard));
  v1::ReserveLandingResponse grant;
  absl::Status st = CallWhilePeersAreLate(
      *deadline - absl::Now(), peer_wait_,
      [&](absl::Time d) {
        grant.Clear();
        call.set_timeout_ms(TimeoutMs(d));
        absl::StatusOr<std::string> reply = TransportCallOn(
            shard, v1::TRANSPORT_CALL_RESERVE_LANDING, "ReserveLanding",
            call.SerializeAsString(), d, /*annotate=*/false);
        if (!reply.ok()) return reply.status();
        if (!grant.ParseFromString(*reply) || grant.no_slot()) {
          return absl::DataLossError(
              "a reserve-landing call's answer does not parse, or has no "
              "slot");
        }
        return absl::OkStatus();
      },
      deadline);
  if (!st.ok()) return cluster_->Annotate(shard, st);
  return grant;
}

absl::Status DataPlane::PutAll(uint32_t shard, const void* data, size_t bytes,
                               const RemoteRegion& region, uint64_t offset,
                               absl::Time deadline) {
  Pair& pair = *pairs_[shard];
  std::vector<std::shared_ptr<Request>> puts;
  for (size_t off = 0; off < bytes; off += kPieceBytes) {
    auto put =
        pair.Put(static_cast<const char*>(data) + off,
                 std::min(kPieceBytes, bytes - off), region, offset + off);
    if (!put.ok()) {
      (void)pair.Wait(puts, deadline);
      return cluster_->Annotate(shard, put.status());
    }
    puts.push_back(std::move(*put));
  }
  absl::Status st = pair.Wait(puts, deadline);
  if (!st.ok()) return cluster_->Annotate(shard, TransferError(st));
  return absl::OkStatus();
}

absl::Status DataPlane::Release(uint32_t shard, absl::Time deadline) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (shard < step_grants_.size() && step_grants_[shard]) {
      ReleaseLaterLocked(shard, *step_grants_[shard]);
      step_grants_[shard].reset();
    }
    if (shard < to_release_.size()) ids.swap(to_release_[shard]);
  }
  if (ids.empty()) return absl::OkStatus();
  v1::ReleaseRequest req;
  req.set_trainer_rank(cluster_->rank());
  for (uint64_t id : ids) req.add_lease_ids(id);
  TrackedCall call(this, deadline);
  v1::ReleaseResponse resp;
  absl::Status st =
      FromGrpcStatus(cluster_->stub(shard).Release(call.context(), req, &resp));
  return st.ok() ? st : cluster_->Annotate(shard, st);
}

absl::Status DataPlane::ReleaseAll(absl::Time deadline) {
  absl::Status first;
  for (uint32_t s = 0; s < pairs_.size(); ++s) {
    absl::Status st = Release(s, deadline);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace zshard
