#include "server/shard_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/transport_factory.h"
#include "common/status_macros.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "common/checkpoint/durable_file.h"

#include <iostream>

namespace zshard {
namespace {

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

absl::Status Announce(const ShardServerOptions& options, const std::string& endpoint,
                      const std::string& checkpoint_settings) {
  auto channel = grpc::CreateChannel(options.coordinator,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  const absl::Time deadline = absl::Now() + options.announce_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(
        std::min(deadline, absl::Now() + absl::Seconds(5))));
    ctx.set_wait_for_ready(true);
    v1::RegisterShardRequest req;
    req.set_shard_id(options.service.store.shard_id);
    req.set_num_shards(options.service.store.num_shards);
    req.set_checkpoint_settings(checkpoint_settings);
    req.set_endpoint(endpoint);
    v1::RegisterShardResponse resp;
    last = FromGrpcStatus(stub->RegisterShard(&ctx, req, &resp));
    if (last.ok()) return last;
    if (last.code() != absl::StatusCode::kUnavailable &&
        last.code() != absl::StatusCode::kDeadlineExceeded) {
      return last;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::UnavailableError(
      absl::StrCat("could not announce this shard to the coordinator at ",
                   options.coordinator, " within ",
                   absl::FormatDuration(options.announce_timeout), ": ",
                   last.message()));
}

// Asks the coordinator which checkpoint it restored, waiting for it to serve.
absl::StatusOr<uint64_t> CoordinatorRestoreStep(const ShardServerOptions& options) {
  auto stub = v1::ShardService::NewStub(
      grpc::CreateChannel(options.coordinator, grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + options.announce_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
    ctx.set_wait_for_ready(true);
    v1::GetStatusResponse resp;
    last = FromGrpcStatus(stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp));
    if (last.ok()) {
      if (!resp.checkpoint().restored()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--restore=latest: the coordinator at ", options.coordinator,
            " did not restore a checkpoint (start shard 0 with --restore too)"));
      }
      return resp.checkpoint().restored_step();
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat(
      "--restore=latest: could not ask the coordinator at ", options.coordinator,
      " which checkpoint it restored: ", last.message()));
}

// A fresh cluster must not write into another run's checkpoints.
absl::Status CheckNoCheckpoints(const std::string& root) {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(root);
  if (!steps.ok()) return absl::OkStatus();  // created on first use
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    const std::string manifest = root + "/" + StepDirName(*it) + "/" + kGlobalManifestName;
    if (ReadWholeFile(manifest).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint_dir ", root, " already holds checkpoints (newest: step ", *it,
          "); resume with --restore=latest, or use an empty directory"));
    }
  }
  return absl::OkStatus();
}

// After a restore from `step`, newer checkpoints belong to an abandoned
// timeline: they are moved to ROOT/abandoned-<unix ms>/ so that `latest`
// and the new run's files never mix with them.
absl::Status SetAsideNewer(const std::string& root, uint64_t step) {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(root);
  if (!steps.ok()) return steps.status();
  std::string aside;
  for (uint64_t s : *steps) {
    if (s <= step) continue;
    if (aside.empty()) {
      aside = absl::StrCat(root, "/abandoned-", absl::ToUnixMillis(absl::Now()));
      ZS_RETURN_IF_ERROR(MakeDirs(aside));
    }
    const std::string from = root + "/" + StepDirName(s), to = aside + "/" + StepDirName(s);
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot move ", from, " to ", to));
    }
  }
  if (!aside.empty()) {
    std::cerr << "zshard-server: checkpoints newer than step " << step << " moved to " << aside
              << "\n";
    ZS_RETURN_IF_ERROR(SyncDir(root));
  }
  return absl::OkStatus();
}

// Loads this shard's slices of a checkpoint into the service's store.
absl::Status RestoreShard(const ShardServerOptions& options, ShardService& service) {
  const ShardStoreOptions& so = options.service.store;
  const std::string& root = so.checkpoint.root;
  if (root.empty()) {
    return absl::InvalidArgumentError("--restore needs --checkpoint_dir");
  }
  uint64_t step = 0;
  if (options.restore == "latest") {
    if (so.shard_id == 0) {
      std::vector<std::string> refused;
      absl::StatusOr<uint64_t> found = FindRestorableCheckpoint(root, UINT64_MAX, &refused);
      for (const std::string& r : refused) {
        std::cerr << "zshard-server: restore: refused " << r << "\n";
      }
      if (!found.ok()) return found.status();
      step = *found;
    } else {
      absl::StatusOr<uint64_t> s = CoordinatorRestoreStep(options);
      if (!s.ok()) return s.status();
      step = *s;
    }
  } else if (!absl::SimpleAtoi(options.restore, &step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--restore: expected 'latest' or a step number, got '", options.restore, "'"));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(root, step);
  if (!reader.ok()) return reader.status();
  CheckpointReader& r = **reader;
  if (so.shard_id == 0 && options.restore != "latest") {
    absl::Status st = r.VerifyDataFiles();  // "latest" verified it already
    if (!st.ok()) return st;
  }
  if (r.global().world_size != so.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", step, " was taken with ", r.global().world_size,
        " trainers; this cluster has --trainers=", so.world_size));
  }
  if (r.global().accumulation_steps != so.accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", step, " was taken with gradient_accumulation_steps ",
        r.global().accumulation_steps, "; the config now says ", so.accumulation_steps));
  }
  const absl::Time start = absl::Now();
  absl::Status st = service.store().Restore(
      r.spec(), step, [&r](uint32_t g) { return r.applied(g); },
      [&r](uint32_t g, StateArray a, uint64_t begin, uint64_t end, float* out) {
        return r.Read(g, a, begin, end, out);
      });
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("restore of step ", step, ": ", st.message()));
  }
  service.SetRestored(step, r.global().trainer_states, r.global().last_step_skipped);
  if (so.shard_id == 0) ZS_RETURN_IF_ERROR(SetAsideNewer(root, step));
  std::cerr << "zshard-server: shard " << so.shard_id << "/" << so.num_shards
            << " restored step " << step << " from " << root << " (written by "
            << r.global().num_shards << " shards; read " << r.bytes_read()
            << " encoded bytes in " << absl::ToDoubleSeconds(absl::Now() - start) << " s)\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardServerOptions& options) {
  const auto& store = options.service.store;
  if (store.num_shards == 0 || store.shard_id >= store.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard id ", store.shard_id, " out of range for ", store.num_shards,
        " shards"));
  }
  if (store.shard_id > 0 && options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "a shard other than 0 needs the coordinator's address");
  }
  std::unique_ptr<ShardServer> server(new ShardServer());
  ShardServiceOptions service_options = options.service;
  service_options.coordinator = options.coordinator;
  {
    auto t = CreateTransport(options.transport, absl::StrCat("shard ", store.shard_id));
    if (!t.ok()) return t.status();
    server->transport_ = std::move(*t);
    service_options.store.transport = server->transport_.get();
  }
  auto created = ShardStore::Create(service_options.store);
  if (!created.ok()) return created.status();
  ShardStore* store_ptr = created->get();
  if (store.shard_id == 0) {
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
    server->coordinator_ = std::make_unique<Coordinator>(co, store_ptr);
    server->coordinator_service_ = std::make_unique<CoordinatorService>(
        server->coordinator_.get(), options.service.wait_timeout);
    service_options.coordinator_host = server->coordinator_.get();
  }
  server->service_ =
      std::make_unique<ShardService>(service_options, std::move(*created));
  if (!options.restore.empty()) {
    absl::Status st = RestoreShard(options, *server->service_);
    if (!st.ok()) return st;
  } else if (!store.checkpoint.root.empty()) {
    absl::Status st = CheckNoCheckpoints(store.checkpoint.root);
    if (!st.ok()) return st;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  if (server->coordinator_service_) builder.RegisterService(server->coordinator_service_.get());
  // A transport that carries its bytes over gRPC (inline) brings its service.
  if (grpc::Service* t = server->transport_->GrpcService()) builder.RegisterService(t);
  builder.SetMaxReceiveMessageSize(Transport::kMaxHostedRequestBytes);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address));
  }
  const std::string host = options.advertise_host.empty()
                               ? HostOf(options.listen_address)
                               : options.advertise_host;
  server->endpoint_ = absl::StrCat(host, ":", server->port_);
  server->service_->SetEndpoint(server->endpoint_);
  server->transport_->SetServingEndpoint(server->endpoint_);
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  if (store.shard_id > 0) {
    absl::Status st =
        Announce(options, server->endpoint_, server->service_->store().CheckpointSettings());
    if (!st.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return st;
    }
  }
  return server;
}

ShardServer::~ShardServer() { Shutdown(); }

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void ShardServer::Shutdown(absl::Duration grace) {
  if (!server_ || shut_down_.exchange(true)) return;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void ShardServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace zshard
