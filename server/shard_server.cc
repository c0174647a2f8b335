#include "server/shard_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/durable_file.h"
#include "common/transport/transport_factory.h"
#include "server/checkpoint/shard_restore.h"
#include "server/cluster_probe.h"

namespace zshard {
namespace {

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

absl::StatusOr<uint64_t> AnnounceTo(const ShardServerOptions& options,
                                    const std::string& endpoint,
                                    const std::string& checkpoint_settings,
                                    bool replacement, uint64_t step,
                                    bool from_checkpoint) {
  auto channel =
      options.service.auth->PeerCredentials()->Channel(options.coordinator);
  auto stub = v1::Coordinator::NewStub(channel);
  const absl::Time deadline = absl::Now() + options.announce_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
    ctx.set_wait_for_ready(true);
    v1::RegisterShardRequest req;
    req.set_shard_id(options.service.store.shard_id);
    req.set_num_shards(options.service.store.num_shards);
    req.set_checkpoint_settings(checkpoint_settings);
    req.set_endpoint(endpoint);
    req.set_replacement(replacement);
    req.set_replaced_at_step(step);
    req.set_from_checkpoint(from_checkpoint);
    if (replacement) {
      // The coordinator rolls every other shard back meanwhile.
      ctx.set_deadline(absl::ToChronoTime(deadline));
    }
    v1::RegisterShardResponse resp;
    last = FromGrpcStatus(stub->RegisterShard(&ctx, req, &resp));
    if (last.ok()) return resp.epoch();
    if (last.code() != absl::StatusCode::kUnavailable &&
        last.code() != absl::StatusCode::kDeadlineExceeded) {
      return last;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat(
      "could not announce this shard to the coordinator at ",
      options.coordinator, " within ",
      absl::FormatDuration(options.announce_timeout), ": ", last.message()));
}

// Shard 0's coordinator settings, from the shard's own.
CoordinatorOptions CoordinatorOptionsFor(const ShardServerOptions& options) {
  const auto& store = options.service.store;
  CoordinatorOptions co;
  co.num_shards = store.num_shards;
  co.world_size = store.world_size;
  co.checkpoint.root = store.checkpoint.root;
  co.checkpoint.keep_bases = options.checkpoint_keep_bases;
  co.checkpoint.cluster.num_shards = store.num_shards;
  co.checkpoint.cluster.world_size = store.world_size;
  co.checkpoint.cluster.accumulation_steps = store.accumulation_steps;
  co.checkpoint.cluster.alignment = store.alignment;
  co.checkpoint.cluster.persistence_threshold = store.persistence_threshold;
  co.checkpoint.cluster.config_hash = options.service.config_hash;
  co.peers = options.service.auth->PeerCredentials();
  co.trainer_timeout = options.trainer_timeout;
  return co;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardServerOptions& options) {
  const auto& store = options.service.store;
  if (store.num_shards == 0 || store.shard_id >= store.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard id ", store.shard_id, " out of range for ",
                     store.num_shards, " shards"));
  }
  if (store.shard_id > 0 && options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "a shard other than 0 needs the coordinator's address");
  }
  auto auth = RpcAuthorizer::Load(options.security);
  if (!auth.ok()) return auth.status();
  ShardServerOptions with_auth = options;
  with_auth.service.auth = *auth;
  if (options.replace_auto && store.num_shards > 1) {
    const std::string contact =
        store.shard_id == 0 ? options.peer : options.coordinator;
    const ClusterProbe probe = ProbeCluster(
        (*auth)->PeerCredentials(), contact,
        absl::Now() + std::min(options.announce_timeout, absl::Seconds(10)));
    std::cerr << "zshard-server: shard " << store.shard_id
              << ": --replace=auto: " << probe.why
              << (probe.running ? "; replacing this shard from its buddy's "
                                  "snapshot\n"
                                : "; starting as configured\n");
    if (probe.running) {
      with_auth.replace = true;
      with_auth.restore.clear();
    }
  }
  return StartWith(with_auth);
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::StartWith(
    const ShardServerOptions& options) {
  const auto& store = options.service.store;
  std::unique_ptr<ShardServer> server(new ShardServer());
  server->stop_timeout_ = options.stop_timeout;
  ShardServiceOptions service_options = options.service;
  server->channel_ = std::make_unique<CoordinatorChannel>(
      options.service.auth->PeerCredentials(),
      store.shard_id == 0 ? "" : options.coordinator);
  service_options.coordinator_channel = server->channel_.get();
  {
    TransportSecurity security;
    security.channels = options.service.auth->PeerCredentials();
    security.auth = options.service.auth;
    auto t = CreateTransport(options.transport,
                             absl::StrCat("shard ", store.shard_id), security);
    if (!t.ok()) return t.status();
    server->transport_ = std::move(*t);
    service_options.store.transport = server->transport_.get();
  }
  auto created = ShardStore::Create(service_options.store);
  if (!created.ok()) return created.status();
  ShardStore* store_ptr = created->get();
  if (store.shard_id == 0) {
    server->coordinator_ = std::make_unique<Coordinator>(
        CoordinatorOptionsFor(options), store_ptr);
    server->coordinator_service_ = std::make_unique<CoordinatorService>(
        server->coordinator_.get(), options.service.wait_timeout,
        options.service.auth);
    service_options.coordinator_host = server->coordinator_.get();
  }
  server->SetUpSnapshots(options, store_ptr);
  server->service_ =
      std::make_unique<ShardService>(service_options, std::move(*created));
  ZS_RETURN_IF_ERROR(server->ServeTransportCalls());
  if (options.replace && store.shard_id == 0) {
    ZS_RETURN_IF_ERROR(server->PrepareTakeover(options));
  } else if (options.replace) {
    ZS_RETURN_IF_ERROR(server->RestoreReplacement(options));
  } else {
    ZS_RETURN_IF_ERROR(server->RestoreOrCheckEmpty(options));
  }
  ZS_RETURN_IF_ERROR(server->Serve(options));
  absl::Status st = store.shard_id > 0 ? server->Announce(options)
                                       : server->StartCoordinating(options);
  if (!st.ok()) {
    server->Shutdown(absl::ZeroDuration());
    return st;
  }
  return server;
}

void ShardServer::SetUpSnapshots(const ShardServerOptions& options,
                                 ShardStore* store) {
  const auto& so = options.service.store;
  held_ = std::make_unique<HeldSnapshots>();
  PeerLinkOptions lo;
  lo.shard_id = so.shard_id;
  lo.num_shards = so.num_shards;
  lo.channel = channel_.get();
  lo.local = coordinator_.get();
  lo.peers = options.service.auth->PeerCredentials();
  lo.send_timeout = std::min(options.service.wait_timeout, absl::Seconds(30));
  lo.transport = transport_.get();
  link_ = std::make_unique<PeerLink>(lo);
  if (so.snapshot_interval > 0 && so.num_shards > 1) {
    PeerLink* link = link_.get();
    HeldSnapshots* held = held_.get();
    // This shard is the buddy of the one before it; that one's snapshots
    // are about this shard's size (the slices differ by a few values per
    // group), and some room to spare covers the difference.
    const uint32_t neighbour = (so.shard_id + so.num_shards - 1) % so.num_shards;
    store->SetSnapshotSend(
        [link](const Snapshot& s) { return link->SendSnapshot(s); },
        [link](uint64_t step) { return link->ReportSkipped(step); },
        [held, neighbour](uint64_t floats) {
          held->Prepare(neighbour, floats + floats / 32 + 4096);
        });
  }
  if (coordinator_) {
    coordinator_->SetHeldSnapshots(held_.get());
    coordinator_->SetRolledBackHook([this](const v1::SnapshotHeader& h,
                                           uint64_t epoch) {
      std::map<uint32_t, std::string> states(h.trainer_states().begin(),
                                             h.trainer_states().end());
      service_->SetRestored(h.step(), std::move(states), h.last_step_skipped());
      link_->SetEpoch(epoch);
    });
  }
}

absl::Status ShardServer::RestoreReplacement(
    const ShardServerOptions& options) {
  const absl::Time deadline = absl::Now() + options.announce_timeout;
  absl::StatusOr<v1::PrepareReplaceResponse> plan =
      link_->PlanReplacement(deadline);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("--replace: ", plan.status().message()));
  }
  return RestorePlanned(options, *plan, channel_->endpoint(), deadline);
}

absl::Status ShardServer::RestorePlanned(const ShardServerOptions& options,
                                         const v1::PrepareReplaceResponse& plan,
                                         const std::string& spec_from,
                                         absl::Time deadline) {
  const uint32_t shard = options.service.store.shard_id;
  replaced_at_step_ = plan.step();
  replaced_from_checkpoint_ = plan.from_checkpoint();
  if (plan.from_checkpoint()) {
    RestoreOptions ro;
    ro.what = absl::StrCat(plan.step());
    absl::StatusOr<RestoredCheckpoint> r = RestoreShard(ro, service_->store());
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("--replace: ", r.status().message()));
    }
    service_->SetRestored(r->step, r->trainer_states, r->last_step_skipped);
    takeover_header_.set_step(r->step);
    takeover_header_.set_last_step_skipped(r->last_step_skipped);
    for (const auto& [rank, state] : r->trainer_states) {
      (*takeover_header_.mutable_trainer_states())[rank] = state;
    }
    for (const MembershipRecord& e : r->membership_history) {
      *takeover_header_.add_membership_history() = FromRecord(e);
    }
    std::cerr << "zshard-server: shard " << shard << ": took the state of "
              << "step " << r->step << " from the disk checkpoint (no buddy "
              << "holds a snapshot to replace it from)\n";
    return absl::OkStatus();
  }
  absl::StatusOr<Replacement> r = link_->Fetch(plan, spec_from, deadline);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("--replace: ", r.status().message()));
  }
  ZS_RETURN_IF_ERROR(service_->store().RestoreSnapshot(r->spec, r->snapshot));
  service_->SetRestored(r->step, {}, r->snapshot.header.last_step_skipped());
  takeover_header_ = r->snapshot.header;
  std::cerr << "zshard-server: shard " << shard << ": took the state of "
            << "step " << r->step << " from shard " << r->buddy
            << "'s snapshot\n";
  return absl::OkStatus();
}

absl::Status ShardServer::Announce(const ShardServerOptions& options) {
  absl::StatusOr<uint64_t> epoch =
      AnnounceTo(options, endpoint_, service_->store().CheckpointSettings(),
                 options.replace, replaced_at_step_, replaced_from_checkpoint_);
  if (!epoch.ok()) return epoch.status();
  link_->SetEpoch(*epoch);
  link_->StartHeartbeats(endpoint_,
                         [this](const absl::Status& why) { Fence(why); });
  return absl::OkStatus();
}

void ShardServer::Fence(const absl::Status& why) {
  std::cerr << "zshard-server: shard " << service_->store().options().shard_id
            << ": fenced: " << why.message() << "\n";
  {
    absl::MutexLock lock(&fenced_mu_);
    fenced_ = why;
  }
  Shutdown(absl::ZeroDuration());
}

absl::Status ShardServer::PrepareTakeover(const ShardServerOptions& options) {
  if (options.peer.empty()) {
    return absl::InvalidArgumentError(
        "--replace=0 needs --peer: the host:port of a live shard of the "
        "cluster");
  }
  const absl::Time deadline = absl::Now() + options.announce_timeout;
  absl::StatusOr<v1::PrepareReplaceResponse> plan =
      coordinator_->PrepareTakeover(options.peer, deadline);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("--replace: ", plan.status().message()));
  }
  return RestorePlanned(options, *plan, plan->buddy_endpoint(), deadline);
}

absl::Status ShardServer::StartCoordinating(const ShardServerOptions& options) {
  if (options.replace) {
    absl::StatusOr<uint64_t> epoch = coordinator_->TakeOver(
        endpoint_, takeover_header_, replaced_from_checkpoint_,
        absl::Now() + options.announce_timeout);
    if (!epoch.ok()) {
      return absl::Status(
          epoch.status().code(),
          absl::StrCat("--replace=0: taking over: ", epoch.status().message()));
    }
  }
  link_->StartHeartbeats(endpoint_,
                         [this](const absl::Status& why) { Fence(why); });
  return absl::OkStatus();
}

absl::Status ShardServer::fenced() const {
  absl::MutexLock lock(&fenced_mu_);
  return fenced_;
}

absl::Status ShardServer::RestoreOrCheckEmpty(
    const ShardServerOptions& options) {
  const auto& store = options.service.store;
  if (!store.checkpoint.root.empty()) {
    absl::Status st = MakeWritableDir(store.checkpoint.root);
    if (!st.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--checkpoint_dir ", store.checkpoint.root,
                       " cannot hold checkpoints: ", st.message()));
    }
  }
  if (!options.restore.empty()) {
    RestoreOptions ro;
    ro.what = options.restore;
    ro.coordinator = options.coordinator;
    ro.coordinator_timeout = options.announce_timeout;
    ro.peers = options.service.auth->PeerCredentials();
    absl::StatusOr<RestoredCheckpoint> r = RestoreShard(ro, service_->store());
    if (!r.ok()) return r.status();
    service_->SetRestored(r->step, r->trainer_states, r->last_step_skipped);
    if (coordinator_) {
      std::vector<v1::MembershipEvent> history;
      for (const MembershipRecord& e : r->membership_history) {
        history.push_back(FromRecord(e));
      }
      coordinator_->membership().RestoreHistory(history);
    }
  } else if (!store.checkpoint.root.empty()) {
    absl::Status st = CheckNoCheckpoints(store.checkpoint.root);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ShardServer::Serve(const ShardServerOptions& options) {
  admin_service_ = std::make_unique<AdminService>(service_.get());
  admin_service_->SetSnapshotStatus([this](v1::SnapshotStatus* s) {
    s->set_held_bytes(held_->bytes());
    s->set_epoch(link_->epoch());
  });
  ShardControlOptions control;
  control.held = held_.get();
  control.channel = channel_.get();
  control.on_rolled_back = [this](uint64_t /*epoch*/, uint64_t step) {
    service_->SetRestored(step, {}, false);
  };
  control.endpoints = [this] { return link_->endpoints(); };
  control.transport = transport_.get();
  control_service_ = std::make_unique<ShardControlService>(
      &service_->store(), options.service.auth, std::move(control));
  grpc::ServerBuilder builder;
  // A port another server holds is refused, not shared (SO_REUSEPORT would
  // split the trainers between the two).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen_address,
                           options.service.auth->ServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(control_service_.get());
  std::set<std::string> hosted = {"zshard.v1.ShardService",
                                  "zshard.v1.AdminService",
                                  "zshard.v1.ShardControl"};
  if (coordinator_service_) {
    builder.RegisterService(coordinator_service_.get());
    hosted.insert("zshard.v1.Coordinator");
  }
  health_service_ = std::make_unique<HealthService>(std::move(hosted));
  builder.RegisterService(health_service_.get());
  // A transport that carries its bytes over gRPC (inline) brings its service.
  if (grpc::Service* t = transport_->GrpcService()) builder.RegisterService(t);
  builder.SetMaxReceiveMessageSize(Transport::kMaxHostedRequestBytes);
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen_address,
        " (--listen): the port is in use or the address is not this host's",
        options.service.auth->tls()
            ? ", or gRPC refused the TLS certificate and key (--tls_cert, "
              "--tls_key: a PEM chain and its matching private key)"
            : ""));
  }
  const std::string host = options.advertise_host.empty()
                               ? HostOf(options.listen_address)
                               : options.advertise_host;
  endpoint_ = absl::StrCat(host, ":", port_);
  service_->SetEndpoint(endpoint_);
  if (coordinator_) channel_->Advance(0, endpoint_);
  transport_->SetServingEndpoint(endpoint_);
  if (!options.metrics_listen.empty()) {
    auto m = MetricsServer::Start(options.metrics_listen, admin_service_.get(),
                                  service_.get(), coordinator_.get(),
                                  options.service.auth);
    if (!m.ok()) return m.status();
    metrics_ = std::move(*m);
  }
  return absl::OkStatus();
}

void EnableGrpcProcessDefaults() {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
}

absl::Status ShardServer::ServeTransportCalls() {
  {
    absl::MutexLock lock(&call_target_->mu);
    call_target_->service = service_.get();
  }
  std::shared_ptr<CallTarget> target = call_target_;
  using Answer = absl::StatusOr<std::string> (ShardService::*)(
      const std::string&);
  auto serve = [this, target](v1::TransportCall id, Answer answer) {
    return transport_->SetCallHandler(
        id,
        [target, answer](
            const std::string& header) -> absl::StatusOr<std::string> {
          absl::ReaderMutexLock lock(&target->mu);
          if (!target->service) {
            return absl::UnavailableError("the shard server is stopping");
          }
          return (target->service->*answer)(header);
        });
  };
  using Start =
      void (ShardService::*)(const std::string&, Transport::CallAnswer);
  auto serve_later = [this, target](v1::TransportCall id, Start start) {
    return transport_->SetDeferredCallHandler(
        id, [target, start](const std::string& header,
                            Transport::CallAnswer answer) {
          absl::ReaderMutexLock lock(&target->mu);
          if (!target->service) {
            answer(absl::UnavailableError("the shard server is stopping"));
            return;
          }
          (target->service->*start)(header, std::move(answer));
        });
  };
  ZS_RETURN_IF_ERROR(
      serve(v1::TRANSPORT_CALL_LANDED, &ShardService::AnswerLandedCall));
  ZS_RETURN_IF_ERROR(serve_later(v1::TRANSPORT_CALL_RESERVE_LANDING,
                                 &ShardService::StartReserveLandingCall));
  ZS_RETURN_IF_ERROR(
      serve_later(v1::TRANSPORT_CALL_LEASE, &ShardService::StartLeaseCall));
  return serve(v1::TRANSPORT_CALL_HEARTBEAT,
               &ShardService::AnswerHeartbeatCall);
}

ShardServer::~ShardServer() {
  Shutdown();
  StopTransportCalls();
  // The membership's watchdog reads shard 0's store, which goes before the
  // coordinator (its checkpoint writer may still commit to it).
  if (coordinator_) coordinator_->membership().StopWatchdog();
}

void ShardServer::StopTransportCalls() {
  absl::MutexLock lock(&call_target_->mu);
  call_target_->service = nullptr;
}

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void ShardServer::Shutdown(absl::Duration grace) {
  if (!server_ || shut_down_.exchange(true)) return;
  health_service_->SetNotServing();
  // Transport calls are refused from now on, as gRPC's are: a shard that
  // shut down must not take a contribution (over ucx its memory and
  // progress thread outlive this until the server is destroyed).
  StopTransportCalls();
  // gRPC's shutdown waits for every handler: none may wait for peers.
  if (coordinator_) coordinator_->Close();
  // Nor may the transport calls' waits go on.
  service_->StopWaits();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void ShardServer::Stop() {
  if (!server_ || shut_down_.load()) return;
  const absl::Time deadline = absl::Now() + stop_timeout_;
  const uint32_t shard = service_->options().store.shard_id;
  absl::Status st = service_->DrainCheckpoints(deadline);
  if (st.ok() && coordinator_)
    st = coordinator_->WaitCheckpointsSettled(deadline);
  if (!st.ok()) {
    std::cerr << "zshard-server: shard " << shard << ": stopping without "
              << "waiting longer: " << st.message() << "\n";
  }
  Shutdown();
}

void ShardServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace zshard
