#include "server/snapshot/peer_link.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/base/thread_name.h"
#include "server/snapshot/snapshot_wire.h"

namespace zshard {

PeerLink::PeerLink(const PeerLinkOptions& options) : options_(options) {}

PeerLink::~PeerLink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t PeerLink::epoch() const { return options_.channel->epoch(); }

void PeerLink::SetEpoch(uint64_t epoch) { options_.channel->Advance(epoch); }

std::vector<std::string> PeerLink::endpoints() const {
  if (options_.local) return options_.local->ShardEndpoints();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out = endpoints_;
  out.resize(options_.num_shards);
  out[0] = options_.channel->endpoint();
  return out;
}

void PeerLink::StartHeartbeats(
    const std::string& endpoint,
    std::function<void(const absl::Status&)> fenced) {
  if (thread_.joinable() ||
      (options_.shard_id > 0 && !options_.channel->stub())) {
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    self_ = endpoint;
  }
  thread_ = std::thread([this, fenced = std::move(fenced)] {
    NameCurrentThread("zs-peer-beat");
    Heartbeats(fenced);
  });
}

absl::Status PeerLink::CheckStillCoordinator(absl::Time deadline) {
  if (options_.num_shards < 2) return absl::OkStatus();
  const std::string buddy = BuddyEndpoint();
  if (buddy.empty()) return absl::OkStatus();
  std::shared_ptr<v1::ShardControl::Stub> stub;
  std::string self;
  {
    absl::MutexLock lock(&mu_);
    stub = ControlStub(buddy);
    self = self_;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ClusterViewResponse view;
  absl::Status st =
      FromGrpcStatus(stub->ClusterView(&ctx, v1::ClusterViewRequest(), &view));
  if (!st.ok()) return absl::OkStatus();  // unreachable: try again later
  const uint64_t mine = epoch();
  if (view.epoch() > mine && !view.coordinator().empty() &&
      view.coordinator() != self) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard 0 (the coordinator) is served by ", view.coordinator(),
        " since epoch ", view.epoch(), "; this process (", self, ", epoch ",
        mine, ") was replaced"));
  }
  return absl::OkStatus();
}

absl::Status PeerLink::Beat(absl::Time deadline) {
  if (options_.shard_id == 0) return CheckStillCoordinator(deadline);
  std::string endpoint;
  {
    absl::MutexLock lock(&mu_);
    endpoint = self_;
  }
  auto coordinator = options_.channel->stub();
  if (!coordinator || endpoint.empty()) {
    return absl::FailedPreconditionError("no heartbeats on this shard");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ShardHeartbeatRequest req;
  req.set_shard_id(options_.shard_id);
  req.set_endpoint(endpoint);
  req.set_epoch(epoch());
  v1::ShardHeartbeatResponse resp;
  absl::Status st =
      FromGrpcStatus(coordinator->ShardHeartbeat(&ctx, req, &resp));
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  endpoints_.assign(resp.endpoints().begin(), resp.endpoints().end());
  return st;
}

void PeerLink::Heartbeats(std::function<void(const absl::Status&)> fenced) {
  for (;;) {
    absl::Status st = Beat(absl::Now() + options_.heartbeat_interval);
    if (absl::IsFailedPrecondition(st)) {
      if (fenced) fenced(st);
      return;
    }
    // Otherwise (OK, or the coordinator busy or away) again in a while.
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                             options_.heartbeat_interval)) {
      return;
    }
  }
}

std::string PeerLink::BuddyEndpoint() const {
  const uint32_t buddy = (options_.shard_id + 1) % options_.num_shards;
  if (options_.local) return options_.local->ShardEndpoints()[buddy];
  if (buddy == 0) return options_.channel->endpoint();
  absl::MutexLock lock(&mu_);
  return buddy < endpoints_.size() ? endpoints_[buddy] : "";
}

std::shared_ptr<v1::ShardControl::Stub> PeerLink::ControlStub(
    const std::string& endpoint) {
  if (!control_ || control_endpoint_ != endpoint) {
    control_ = v1::ShardControl::NewStub(options_.peers->Channel(endpoint));
    control_endpoint_ = endpoint;
  }
  return control_;
}

void PeerLink::MarkHeader(uint64_t epoch, v1::SnapshotHeader* header) const {
  header->set_epoch(epoch);
  if (options_.local) {
    for (v1::MembershipEvent& e : options_.local->membership().History()) {
      *header->add_membership_history() = std::move(e);
    }
  }
}

absl::Status PeerLink::Put(const Snapshot& s, uint64_t epoch,
                           absl::Time deadline) {
  std::string buddy = BuddyEndpoint();
  if (buddy.empty()) {
    // The first snapshot may come before the first beat; an error shows below.
    (void)Beat(deadline);
    buddy = BuddyEndpoint();
  }
  if (buddy.empty()) {
    return absl::UnavailableError("the buddy shard's endpoint is not known");
  }
  std::shared_ptr<v1::ShardControl::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    stub = ControlStub(buddy);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::PutSnapshotResponse resp;
  auto writer = stub->PutSnapshot(&ctx, &resp);
  absl::Status wrote;
  if (s.region && options_.transport) {
    // One message: the buddy reads the values from this shard's memory.
    v1::SnapshotChunk chunk;
    *chunk.mutable_header() = s.header;
    MarkHeader(epoch, chunk.mutable_header());
    v1::SnapshotSource* src = chunk.mutable_source();
    src->set_transport_address(options_.transport->address());
    const RemoteRegion r = s.region->Describe();
    src->mutable_region()->set_address(r.address);
    src->mutable_region()->set_size(r.size);
    src->mutable_region()->set_key(r.key);
    if (!writer->Write(chunk)) wrote = absl::UnavailableError("stream broke");
  } else {
    wrote =
        WriteSnapshot(s, [this, &writer, epoch](const v1::SnapshotChunk& c) {
          if (!c.has_header()) return writer->Write(c);
          v1::SnapshotChunk first = c;
          MarkHeader(epoch, first.mutable_header());
          return writer->Write(first);
        });
  }
  writer->WritesDone();
  absl::Status st = FromGrpcStatus(writer->Finish());
  if (st.ok() && wrote.ok()) return st;
  return absl::Status(st.ok() ? wrote.code() : st.code(),
                      absl::StrCat("buddy ", buddy, ": ",
                                   st.ok() ? wrote.message() : st.message()));
}

absl::Status PeerLink::Report(uint64_t step, uint64_t epoch,
                              const absl::Status& failed, absl::Time deadline) {
  if (options_.local) {
    return options_.local->ReportSnapshot(options_.shard_id, step, epoch,
                                          deadline, failed);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::ReportSnapshotRequest req;
  req.set_shard_id(options_.shard_id);
  req.set_step(step);
  req.set_epoch(epoch);
  req.set_failed(!failed.ok());
  req.set_error(std::string(failed.message()));
  v1::ReportSnapshotResponse resp;
  auto coordinator = options_.channel->stub();
  if (!coordinator) return absl::FailedPreconditionError("no coordinator");
  return FromGrpcStatus(coordinator->ReportSnapshot(&ctx, req, &resp));
}

absl::Status PeerLink::SendSnapshot(const Snapshot& s) {
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  const uint64_t at = epoch();
  const absl::Status put = Put(s, at, deadline);
  const absl::Status reported = Report(s.step(), at, put, deadline);
  return put.ok() ? reported : put;
}

absl::Status PeerLink::ReportSkipped(uint64_t step) {
  return Report(
      step, epoch(),
      absl::UnavailableError(
          "it skipped the step: its previous one was still in flight"),
      absl::Now() + options_.send_timeout);
}

absl::StatusOr<v1::PrepareReplaceResponse> PeerLink::PlanReplacement(
    absl::Time deadline) {
  auto coordinator = options_.channel->stub();
  if (!coordinator) {
    return absl::InvalidArgumentError("a replacement needs --coordinator");
  }
  v1::PrepareReplaceResponse plan;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ctx.set_wait_for_ready(true);
  v1::PrepareReplaceRequest req;
  req.set_shard_id(options_.shard_id);
  req.set_num_shards(options_.num_shards);
  ZS_RETURN_IF_ERROR(
      FromGrpcStatus(coordinator->PrepareReplace(&ctx, req, &plan)));
  return plan;
}

absl::StatusOr<Replacement> PeerLink::Fetch(
    const v1::PrepareReplaceResponse& plan, const std::string& spec_from,
    absl::Time deadline) {
  Replacement r;
  r.step = plan.step();
  r.buddy = plan.buddy_shard_id();
  {
    auto shard = v1::ShardService::NewStub(options_.peers->Channel(spec_from));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::GetLayoutRequest req;
    v1::GetLayoutResponse resp;
    ZS_RETURN_IF_ERROR(FromGrpcStatus(shard->GetLayout(&ctx, req, &resp)));
    if (!resp.registered()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", resp.shard_id(), " (", spec_from,
          ") has no model registered: there is nothing to replace"));
    }
    r.spec = resp.spec();
  }
  auto buddy =
      v1::ShardControl::NewStub(options_.peers->Channel(plan.buddy_endpoint()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::FetchSnapshotRequest req;
  req.set_shard_id(options_.shard_id);
  req.set_step(plan.step());
  auto reader = buddy->FetchSnapshot(&ctx, req);
  v1::SnapshotChunk chunk;
  bool first = true;
  absl::Status read;
  while (read.ok() && reader->Read(&chunk)) {
    if (first) {
      first = false;
      r.snapshot.header = chunk.header();
      r.snapshot.data.resize(chunk.header().total_floats());
      r.snapshot.filled = 0;
    }
    read = ReadSnapshotData(chunk, &r.snapshot);
  }
  absl::Status st = FromGrpcStatus(reader->Finish());
  if (!st.ok() || !read.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "fetching shard ", options_.shard_id, "'s snapshot of step ",
        plan.step(), " from shard ", plan.buddy_shard_id(), " (",
        plan.buddy_endpoint(), "): ", st.ok() ? read.message() : st.message()));
  }
  if (first || !r.snapshot.complete()) {
    return absl::UnavailableError(absl::StrCat("shard ", plan.buddy_shard_id(),
                                               " sent an incomplete snapshot"));
  }
  return r;
}

}  // namespace zshard
