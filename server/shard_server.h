// ShardServer: one running shard — the gRPC server (ShardService for
// trainers, AdminService for operators, ShardControl for the coordinator,
// the transport's own service if it brings one, grpc.health.v1 (our sync
// HealthService), reflection when main enabled it; on shard 0 also the
// Coordinator service) bound to an address, announced to the coordinator. A
// test can run several in one process.
#ifndef ZSHARD_SERVER_SHARD_SERVER_H_
#define ZSHARD_SERVER_SHARD_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/rpc_authorizer.h"
#include "common/transport/transport.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/metrics/metrics_server.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/health_service.h"
#include "server/rpc/shard_control_service.h"
#include "server/rpc/shard_service.h"
#include "server/snapshot/held_snapshots.h"
#include "server/snapshot/peer_link.h"

namespace zshard {

struct ShardServerOptions {
  ShardServiceOptions service;
  // host:port to bind; port 0 picks a free one.
  std::string listen_address = "127.0.0.1:0";
  // Host put in front of the bound port when announcing this shard; empty
  // means the host part of listen_address.
  std::string advertise_host;
  // Coordinator (shard 0) address; required when shard_id > 0.
  std::string coordinator;
  // How long Start() keeps trying to reach the coordinator.
  absl::Duration announce_timeout = absl::Seconds(60);
  // Shard 0: a trainer silent this long is dropped (Membership).
  absl::Duration trainer_timeout = absl::Seconds(10);
  // Before serving, load a checkpoint from service.store.checkpoint.root:
  // "" (start empty), "latest" (shard 0 picks the newest intact one, the
  // others ask shard 0 which) or a step number.
  std::string restore;
  // Shard 0's coordinator: complete checkpoint bases kept (with their
  // deltas).
  uint32_t checkpoint_keep_bases = 2;
  // A replacement for shard service.store.shard_id (issue 16): instead of
  // starting empty or from disk, take the state from the buddy shard's
  // in-memory snapshot; every other shard rolls back to its step. A
  // replacement of shard 0 also takes over as the coordinator: it learns
  // the cluster from the live shard at `peer`, and the shards and trainers
  // move to it.
  bool replace = false;
  std::string peer;
  // --replace=auto: Start asks the coordinator (shard 0: `peer`) whether
  // the cluster is training (cluster_probe.h); if so this process is a
  // replacement (`replace`, `restore` ignored), otherwise it starts as
  // configured.
  bool replace_auto = false;
  // The data plane: "ucx" or "inline" (the fallback, always built).
  std::string transport = "inline";
  // Stop(): how long a stopping shard keeps serving until its checkpoint
  // part in progress is committed (and, on shard 0, every shard's part).
  absl::Duration stop_timeout = absl::Seconds(20);
  // TLS and tokens (rpc_authorizer.h); Start loads them into service.auth.
  // All empty: plaintext, every call admitted.
  RpcServerSecurity security;
  // IPv4:port of the HTTP telemetry port (metrics/metrics_server.h); empty:
  // off.
  std::string metrics_listen;
};

// Process-wide, for binaries' main: turns on server reflection for every
// server started afterwards in this process. A ShardServer works without it
// (no reflection). Call once, before the first Start. (gRPC's default health
// service is not turned on: it is a callback service, and one of those makes
// the server hybrid; see server/rpc/health_service.h.)
void EnableGrpcProcessDefaults();

class ShardServer {
 public:
  // Restores (when asked), binds and starts serving, then (shard > 0)
  // announces itself to the coordinator, retrying until announce_timeout.
  // Blocks until all are done.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const ShardServerOptions& options);

  ~ShardServer();

  int port() const { return port_; }
  // The telemetry port (0 when off).
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // "host:port" this shard is reached at.
  const std::string& endpoint() const { return endpoint_; }
  ShardService& service() { return *service_; }
  // The data plane transport.
  Transport* transport() { return transport_.get(); }
  // An in-process channel to this server (tests).
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Stops accepting RPCs; waits at most `grace` for handlers to finish, then
  // cancels them. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  // A clean stop (SIGTERM): keeps serving while this shard finishes and
  // commits its part of a checkpoint being written and, on shard 0, until
  // every shard's part of the checkpoints begun has arrived (so a job that
  // ends just after a checkpoint keeps it), at most options.stop_timeout;
  // then Shutdown(). Logs what it waited for. Blocks; call it once, from a
  // thread other than Wait()'s.
  void Stop();
  // Blocks until Shutdown() is called from another thread, or the
  // coordinator fenced this process (another one replaced it).
  void Wait();
  // Why the server stopped by itself (FAILED_PRECONDITION naming the
  // replacement); OK otherwise.
  absl::Status fenced() const;

 private:
  ShardServer() = default;
  // Start, once options.service.auth is loaded.
  static absl::StatusOr<std::unique_ptr<ShardServer>> StartWith(
      const ShardServerOptions& options);
  // --restore (then the service learns what it restored), or, with a
  // checkpoint directory, a check that it holds no checkpoint to overwrite.
  absl::Status RestoreOrCheckEmpty(const ShardServerOptions& options);
  // Registers the services, binds and starts the gRPC server; learns and
  // publishes the endpoint. UNAVAILABLE when the address cannot be bound.
  absl::Status Serve(const ShardServerOptions& options);
  // Snapshots: the held copies, the link to the peers, the store's sender
  // and the coordinator's hooks. Before registration.
  void SetUpSnapshots(const ShardServerOptions& options, ShardStore* store);
  // --replace: the buddy's copy (or the disk checkpoint) into the store.
  absl::Status RestoreReplacement(const ShardServerOptions& options);
  // The state `plan` names into the store: the buddy's snapshot (the spec
  // from the shard at `spec_from`) or the disk checkpoint.
  absl::Status RestorePlanned(const ShardServerOptions& options,
                              const v1::PrepareReplaceResponse& plan,
                              const std::string& spec_from,
                              absl::Time deadline);
  // Shards > 0: announces itself (as a replacement with --replace) and
  // starts the heartbeats.
  absl::Status Announce(const ShardServerOptions& options);
  // --replace of shard 0, before serving: the buddy's copy into the store
  // (the coordinator learns the cluster from options.peer).
  absl::Status PrepareTakeover(const ShardServerOptions& options);
  // Shard 0 once serving: with --replace, takes the cluster over; then
  // watches that no replacement took over from it.
  absl::Status StartCoordinating(const ShardServerOptions& options);
  // Another process serves this shard now: stop (Wait returns; fenced()).
  void Fence(const absl::Status& why);

  // Declared first: destroyed after the service and store that registered
  // memory with it.
  std::unique_ptr<Transport> transport_;
  // Shard 0 only: the coordinator hosted beside the shard and its service;
  // destroyed after the shard's service, whose checkpoint writer may still
  // commit to it while it stops.
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorService> coordinator_service_;
  // Where this shard reaches the coordinator (its own endpoint on shard 0).
  std::unique_ptr<CoordinatorChannel> channel_;
  std::unique_ptr<HeldSnapshots> held_;
  std::unique_ptr<PeerLink> link_;
  uint64_t replaced_at_step_ = 0;
  bool replaced_from_checkpoint_ = false;
  // --replace: what the state came with (trainer resume states; shard 0's
  // membership history).
  v1::SnapshotHeader takeover_header_;
  std::unique_ptr<ShardService> service_;
  // What the transport's call handlers reach: service_, cleared (under the
  // lock) before service_ goes, since the transport outlives it.
  struct CallTarget {
    absl::Mutex mu;
    ShardService* service ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<CallTarget> call_target_ = std::make_shared<CallTarget>();
  // Answers the trainers' transport calls (Landed) through call_target_.
  absl::Status ServeTransportCalls();
  // From now on every transport call is answered UNAVAILABLE ("the shard
  // server is stopping"). Idempotent.
  void StopTransportCalls();
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<ShardControlService> control_service_;
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_;  // after the services it reads
  int port_ = 0;
  std::string endpoint_;
  absl::Duration stop_timeout_;
  std::atomic<bool> shut_down_{false};
  mutable absl::Mutex fenced_mu_;
  absl::Status fenced_ ABSL_GUARDED_BY(fenced_mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SHARD_SERVER_H_
