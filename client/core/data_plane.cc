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

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Create(Cluster* cluster) {
  if (cluster->transport().empty()) {
    return absl::FailedPreconditionError(
        "the shards run without a data plane transport");
  }
  std::unique_ptr<DataPlane> d(new DataPlane());
  d->cluster_ = cluster;
  d->name_ = cluster->transport();
  // One context for the process's data plane (UCX: one UCP context), a
  // transport (UCX worker and progress thread) per shard: transfers from
  // several shards proceed on several threads.
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<TransportContext> context,
                      CreateTransportContext(d->name_));
  for (uint32_t s = 0; s < cluster->num_shards(); ++s) {
    ZS_ASSIGN_OR_RETURN(
        std::unique_ptr<Transport> t,
        context->CreateTransport(absl::StrCat("trainer ", cluster->rank())));
    d->transports_.push_back(std::move(t));
    auto pair = d->transports_.back()->Connect(cluster->transport_address(s));
    if (!pair.ok()) return cluster->Annotate(s, pair.status());
    d->pairs_.push_back(std::move(*pair));
  }
  absl::MutexLock lock(&d->mu_);
  d->to_release_.resize(cluster->num_shards());
  return d;
}

DataPlane::~DataPlane() {
  // Best effort: leases end by their deadline anyway.
  (void)ReleaseAll(absl::Now() + absl::Seconds(2));
  pairs_.clear();  // before the transports
}

std::string DataPlane::Lanes() const {
  std::vector<std::string> parts;
  for (size_t s = 0; s < pairs_.size(); ++s) {
    parts.push_back(absl::StrCat("shard ", s, ": ", pairs_[s]->Lanes()));
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<v1::LeaseResponse> DataPlane::LeaseOn(uint32_t shard,
                                                     uint32_t group,
                                                     uint64_t min_version,
                                                     bool bf16,
                                                     absl::Time deadline) {
  v1::LeaseRequest req;
  req.set_group(group);
  req.set_min_version(min_version);
  req.set_dtype(bf16 ? v1::BFLOAT16 : v1::FLOAT32);
  req.set_trainer_rank(cluster_->rank());
  std::vector<uint64_t> releasing;
  {
    absl::MutexLock lock(&mu_);
    releasing.swap(to_release_[shard]);
  }
  for (uint64_t id : releasing) req.add_release(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::LeaseResponse resp;
  absl::Status st =
      FromGrpcStatus(cluster_->stub(shard).Lease(&ctx, req, &resp));
  if (!st.ok()) {
    if (!absl::IsInvalidArgument(st)) {
      // Not released: try again with the next lease (they expire anyway).
      absl::MutexLock lock(&mu_);
      auto& q = to_release_[shard];
      q.insert(q.end(), releasing.begin(), releasing.end());
    }
    return cluster_->Annotate(shard, st);
  }
  absl::MutexLock lock(&mu_);
  landing_[{shard, group}] =
      Landing{FromProto(resp.landing()), resp.elements()};
  return resp;
}

namespace {

// A transfer that outlived its deadline means the shard stopped answering.
absl::Status TransferError(const absl::Status& st) {
  if (!absl::IsDeadlineExceeded(st)) return st;
  return absl::UnavailableError(
      absl::StrCat(st.message(), " (the shard stopped answering)"));
}

}  // namespace

absl::Status DataPlane::Fetch(uint32_t shard, uint32_t group, uint64_t version,
                              bool bf16, void* dest, size_t bytes,
                              absl::Time deadline) {
  ZS_ASSIGN_OR_RETURN(v1::LeaseResponse lease,
                      LeaseOn(shard, group, version, bf16, deadline));
  // Released once our get is over (never while it may still read).
  struct ReleaseLater {
    DataPlane* d;
    uint32_t shard;
    uint64_t id;
    ~ReleaseLater() {
      absl::MutexLock lock(&d->mu_);
      d->to_release_[shard].push_back(id);
    }
  } release_later{this, shard, lease.lease_id()};
  if (lease.version() != version) {
    return cluster_->Annotate(
        shard, absl::FailedPreconditionError(absl::StrCat(
                   "group ", group, " is at version ", lease.version(),
                   ", not ", version, " (the step moved on)")));
  }
  if (lease.values().size() != bytes) {
    return cluster_->Annotate(
        shard, absl::DataLossError(absl::StrCat("group ", group, " slice is ",
                                                lease.values().size(),
                                                " bytes, expected ", bytes)));
  }
  Pair& pair = *pairs_[shard];
  // Several gets in flight keep emulated transports (tcp) streaming.
  const RemoteRegion values = FromProto(lease.values());
  std::vector<std::shared_ptr<Request>> gets;
  for (size_t off = 0; off < bytes; off += kPieceBytes) {
    auto get = pair.Get(static_cast<char*>(dest) + off,
                        std::min(kPieceBytes, bytes - off), values, off);
    if (!get.ok()) {
      (void)pair.Wait(gets, deadline);
      return cluster_->Annotate(shard, get.status());
    }
    gets.push_back(std::move(*get));
  }
  absl::Status st = pair.Wait(gets, deadline);
  if (!st.ok()) return cluster_->Annotate(shard, TransferError(st));
  return absl::OkStatus();
}

absl::Status DataPlane::Push(uint32_t shard, uint32_t group, uint64_t step,
                             uint32_t micro_step, bool bf16, const void* data,
                             size_t bytes, const std::string& trainer_state,
                             absl::Time deadline) {
  Landing landing;
  bool known;
  {
    absl::MutexLock lock(&mu_);
    auto it = landing_.find({shard, group});
    known = it != landing_.end();
    if (known) landing = it->second;
  }
  if (!known) {
    // Never fetched this group from this shard (stage 0): a lease names it.
    ZS_ASSIGN_OR_RETURN(v1::LeaseResponse lease,
                        LeaseOn(shard, group, 0, bf16, deadline));
    absl::MutexLock lock(&mu_);
    to_release_[shard].push_back(lease.lease_id());
    landing = landing_.at({shard, group});
  }
  const size_t elem = bf16 ? 2 : 4;
  if (landing.elements * elem != bytes) {
    return cluster_->Annotate(
        shard, absl::InvalidArgumentError(absl::StrCat(
                   "gradient slice of group ", group, " is ", bytes,
                   " bytes, the shard expects ", landing.elements * elem)));
  }
  const uint64_t slot =
      static_cast<uint64_t>(cluster_->rank()) * cluster_->accumulation_steps() +
      micro_step;
  Pair& pair = *pairs_[shard];
  std::vector<std::shared_ptr<Request>> puts;
  for (size_t off = 0; off < bytes; off += kPieceBytes) {
    auto put = pair.Put(static_cast<const char*>(data) + off,
                        std::min(kPieceBytes, bytes - off), landing.region,
                        slot * bytes + off);
    if (!put.ok()) {
      (void)pair.Wait(puts, deadline);
      return cluster_->Annotate(shard, put.status());
    }
    puts.push_back(std::move(*put));
  }
  absl::Status st = pair.Wait(puts, deadline);
  if (!st.ok()) return cluster_->Annotate(shard, TransferError(st));
  v1::LandedRequest req;
  req.set_group(group);
  req.set_step(step);
  req.set_micro_step(micro_step);
  req.set_trainer_rank(cluster_->rank());
  req.set_dtype(bf16 ? v1::BFLOAT16 : v1::FLOAT32);
  req.set_trainer_state(trainer_state);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::LandedResponse resp;
  st = FromGrpcStatus(cluster_->stub(shard).Landed(&ctx, req, &resp));
  if (!st.ok()) return cluster_->Annotate(shard, st);
  return absl::OkStatus();
}

absl::Status DataPlane::ReleaseAll(absl::Time deadline) {
  absl::Status first;
  for (uint32_t s = 0; s < pairs_.size(); ++s) {
    std::vector<uint64_t> ids;
    {
      absl::MutexLock lock(&mu_);
      if (s < to_release_.size()) ids.swap(to_release_[s]);
    }
    if (ids.empty()) continue;
    v1::ReleaseRequest req;
    req.set_trainer_rank(cluster_->rank());
    for (uint64_t id : ids) req.add_lease_ids(id);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::ReleaseResponse resp;
    absl::Status st =
        FromGrpcStatus(cluster_->stub(s).Release(&ctx, req, &resp));
    if (!st.ok() && first.ok()) first = cluster_->Annotate(s, st);
  }
  return first;
}

}  // namespace zshard
