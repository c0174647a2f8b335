// The trainers' gRPC face of one shard (trainer.proto): Join, RegisterModel,
// GetLayout, CommitStep, and the data plane's control (Lease, Release,
// ReserveLanding, Landed; the inline transport's byte movers are its own
// service, inline_transport_service.h). Operators reach the shard through
// AdminService (admin_service.h), the coordinator through ShardControl
// (shard_control_service.h); CommitCheckpoint, ExchangeNorm and
// RegisterShard are the Coordinator service's (coordinator_service.h).
// On shard 0 it hands Join's rank assignment and its own norm and checkpoint
// reports to the Coordinator hosted beside it; the other shards reach that
// over the Coordinator service.
// Thread-safe; handlers run on gRPC's threads and block at most until their
// deadline (capped by wait_timeout). Handlers are defined by topic in
// shard_service.cc (training), shard_service_checkpoint.cc and
// shard_service_data_plane.cc.
#ifndef ZSHARD_SERVER_RPC_SHARD_SERVICE_H_
#define ZSHARD_SERVER_RPC_SHARD_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/rpc_authorizer.h"
#include "common/transport/transport.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_channel.h"
#include "server/metrics/step_history.h"
#include "server/norm_exchange.h"
#include "server/rpc/wait_threads.h"
#include "server/shard_store.h"
#include "zshard/v1/coordinator.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {

struct ShardServiceOptions {
  ShardStoreOptions store;
  // Fingerprint of the training config and its canonical JSON; reported at
  // Join.
  uint64_t config_hash = 0;
  std::string config_canonical;
  // Longest any handler waits, whatever deadline the client set (or none).
  absl::Duration wait_timeout = absl::Seconds(120);
  // Where the coordinator is and the epoch (not owned; outlives the
  // service): the other shards call it there; every shard names it in
  // GetLayout. May be null (then shards > 0 have no coordinator).
  CoordinatorChannel* coordinator_channel = nullptr;
  // Shard 0: the coordinator it hosts (not owned; outlives the service).
  Coordinator* coordinator_host = nullptr;
  // The token check of every handler here and in AdminService; its peer
  // credentials reach the coordinator.
  std::shared_ptr<const RpcAuthorizer> auth = RpcAuthorizer::Open();
};

class ShardService final : public v1::ShardService::Service,
                           private NormExchange {
 public:
  // `store` was created from options.store.
  ShardService(const ShardServiceOptions& options,
               std::unique_ptr<ShardStore> store);
  // Destroys the store first: its checkpoint writer finishes a write in
  // progress and commits it through this service's coordinator link.
  ~ShardService() override;

  // Sets this shard's advertised endpoint (known once the port is bound).
  void SetEndpoint(const std::string& endpoint);

  ShardStore& store() { return *store_; }
  // The coordinator's endpoint as this shard knows it ("" when none).
  std::string CoordinatorEndpoint() const;
  const ShardServiceOptions& options() const { return options_; }

  // What this shard has seen of its trainers, for status. Thread-safe.
  struct TrainerSeen {
    std::string id;
    absl::Time last_seen;
    uint64_t bytes_fetched = 0;  // from this shard
    uint64_t bytes_pushed = 0;   // to this shard
    uint64_t call_token = 0;     // JoinResponse.call_token
  };
  struct Activity {
    std::string endpoint;
    uint64_t bytes_fetched = 0;
    uint64_t bytes_pushed = 0;
    std::map<uint32_t, TrainerSeen> trainers;
  };
  Activity activity() const;

  // The checkpoint this shard was restored from, as SetRestored recorded it.
  struct Restored {
    bool restored = false;
    uint64_t step = 0;
  };
  Restored restored() const {
    absl::MutexLock lock(&mu_);
    return {restored_, restored_step_};
  }
  // Deadline of a handler: the client's, capped by wait_timeout, less a
  // tenth of what is left (at most 1 s): a wait that runs out answers with
  // what it waited for (the ranks a step still needs) before the client's
  // own deadline ends the call, and the trainer, seeing the shard alive,
  // may wait on (client/core/peer_wait.h).
  absl::Time Deadline(const grpc::ServerContext* ctx) const;

  // Marks this shard as restored from the checkpoint of `step`, whose
  // trainer resume states are handed back at Join: before serving, or after
  // a rollback to `step` (issue 16: the cluster went back to a snapshot).
  void SetRestored(uint64_t step,
                   std::map<uint32_t, std::string> trainer_states,
                   bool last_step_skipped);

  // For a stopping shard: its part of a checkpoint being written is
  // finished and committed, one only partly staged is reported as failed
  // (so the coordinator does not wait for it), and nothing is staged
  // afterwards. Blocks until then or `deadline` (DEADLINE_EXCEEDED naming
  // the step). OK at once when checkpoints are off.
  absl::Status DrainCheckpoints(absl::Time deadline);

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse* resp) override;
  grpc::Status RegisterModel(grpc::ServerContext* ctx,
                             grpc::ServerReader<v1::RegisterModelChunk>* reader,
                             v1::RegisterModelResponse* resp) override;
  grpc::Status GetLayout(grpc::ServerContext* ctx,
                         const v1::GetLayoutRequest* req,
                         v1::GetLayoutResponse* resp) override;
  grpc::Status CommitStep(grpc::ServerContext* ctx,
                          const v1::CommitStepRequest* req,
                          v1::CommitStepResponse* resp) override;
  grpc::Status Lease(grpc::ServerContext* ctx, const v1::LeaseRequest* req,
                     v1::LeaseResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override;
  grpc::Status ReserveLanding(grpc::ServerContext* ctx,
                              const v1::ReserveLandingRequest* req,
                              v1::ReserveLandingResponse* resp) override;
  grpc::Status Landed(grpc::ServerContext* ctx, const v1::LandedRequest* req,
                      v1::LandedResponse* resp) override;
  // The transport's TRANSPORT_CALL_LANDED: `header` a serialized LandedCall;
  // answers a serialized LandedResponse, or Landed's error
  // (PERMISSION_DENIED for a token that is not the rank's from its last
  // Join). Never blocks (runs on the transport's progress thread).
  absl::StatusOr<std::string> AnswerLandedCall(const std::string& header);
  // The transport's TRANSPORT_CALL_RESERVE_LANDING: `header` a serialized
  // ReserveLandingCall; answers a serialized ReserveLandingResponse, or
  // ReserveLanding's error. Without a timeout at once, with `no_slot` when
  // the pool has no slot for it now; with one, once a slot is taken (a
  // thread of the shard's waits, as gRPC's ReserveLanding does). Never
  // blocks (runs on the transport's progress thread).
  void StartReserveLandingCall(const std::string& header,
                               Transport::CallAnswer answer);
  // The transport's TRANSPORT_CALL_LEASE: `header` a serialized LeaseCall;
  // answers a serialized LeaseResponse once granted (a thread of the
  // shard's waits for the version, as gRPC's Lease does), or Lease's error.
  // Never blocks.
  void StartLeaseCall(const std::string& header, Transport::CallAnswer answer);
  // Ends the waits of transport calls (they answer CANCELLED) and refuses
  // new ones (UNAVAILABLE). Before the store goes; idempotent.
  void StopWaits() { waits_.Stop(); }
  // The transport's TRANSPORT_CALL_HEARTBEAT: `header` a serialized
  // HeartbeatCall; answers a serialized HeartbeatResponse or Heartbeat's
  // error (UNAVAILABLE on a shard without the coordinator). Never blocks.
  absl::StatusOr<std::string> AnswerHeartbeatCall(const std::string& header);
  // Membership (shard 0 only, FAILED_PRECONDITION elsewhere;
  // shard_service_membership.cc). Admit blocks while every shard admits.
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status Admit(grpc::ServerContext* ctx, const v1::AdmitRequest* req,
                     v1::AdmitResponse* resp) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const v1::LeaveRequest* req,
                     v1::LeaveResponse* resp) override;
  // Shard 0 only (FAILED_PRECONDITION elsewhere): records a trainer's
  // finished step in history(). Never blocks.
  grpc::Status ReportStep(grpc::ServerContext* ctx,
                          const v1::ReportStepRequest* req,
                          v1::ReportStepResponse* resp) override;

  // What the trainers reported of their steps (shard 0).
  const StepHistory& history() const { return history_; }

 private:
  // The store's NormExchange: local on shard 0, an RPC to it elsewhere.
  absl::StatusOr<NormTotals> Exchange(uint64_t step, double sum_squares,
                                      bool non_finite,
                                      absl::Time deadline) override;
  void Touch(uint32_t rank);
  // A landed contribution, over gRPC or the transport (auth checked).
  // A step report from `rank`'s `instance` (0: none given) counts as its
  // heartbeat: Membership::Heartbeat's answer (OK without a coordinator).
  absl::Status Vouch(uint32_t rank, uint64_t instance);
  // PERMISSION_DENIED unless `token` is `rank`'s call token from its last
  // Join; `what` names the call.
  absl::Status CheckCallToken(uint32_t rank, uint64_t token, const char* what);
  absl::Status LandedOne(const v1::LandedRequest& req,
                         v1::LandedResponse* resp);
  // Adds to a joined trainer's byte counts (and the shard's).
  void CountBytes(uint32_t rank, uint64_t fetched, uint64_t pushed);
  // Most further groups one Lease call may name (LeaseRequest.more_groups).
  static constexpr int kMaxLeaseGroups = 4095;
  // A Lease call, over gRPC or the transport (auth checked): waits for
  // every group's version until `deadline` and fills `resp` with the grants
  // (none held on an error).
  absl::Status LeaseAll(const v1::LeaseRequest& req, absl::Time deadline,
                        const std::function<bool()>& cancelled,
                        v1::LeaseResponse* resp);
  // One group of a Lease call: waits for its version (within `deadline`)
  // and fills `resp` with the grant.
  absl::Status LeaseOne(const v1::LeaseRequest& req, uint32_t group,
                        absl::Time deadline,
                        const std::function<bool()>& cancelled,
                        v1::LeaseResponse* resp);
  // A transport call's deadline for its waits: `timeout_ms` ahead (the
  // caller's deadline), as Deadline() takes it from a gRPC call's.
  absl::Time CallDeadline(uint64_t timeout_ms) const;
  // The store's checkpoint commit: local on shard 0, an RPC to it elsewhere.
  absl::Status CommitToCoordinator(const ShardManifest& m,
                                   uint32_t manifest_crc);
  // The coordinator shards > 0 call (null when none).
  std::shared_ptr<v1::Coordinator::Stub> CoordinatorStub() const;
  // Hands `c` (a part or a failure) to the coordinator.
  absl::Status SendCommit(const ShardCommit& c);
  // Tells the coordinator this shard's part of `step` failed with `error`
  // (logged when it cannot be told).
  void ReportCheckpointFailure(uint64_t step, const absl::Status& error);
  v1::Layout MakeLayout() const;

  const ShardServiceOptions options_;
  std::unique_ptr<ShardStore> store_;
  std::atomic<uint64_t> bytes_fetched_{0};
  std::atomic<uint64_t> bytes_pushed_{0};
  StepHistory history_;
  // The transport calls' waits (bounded: a few per trainer at a time).
  WaitThreads waits_{512};

  mutable absl::Mutex mu_;
  std::string endpoint_ ABSL_GUARDED_BY(mu_);
  // The trainers that joined this shard, for status.
  std::map<uint32_t, TrainerSeen> trainers_ ABSL_GUARDED_BY(mu_);
  absl::BitGen token_bits_ ABSL_GUARDED_BY(mu_);
  // Shards other than 0: the coordinator's service on shard 0.
  // Set before serving, read-only afterwards.
  // Set before serving, or by a rollback (under mu_).
  bool restored_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t restored_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::string> restored_states_ ABSL_GUARDED_BY(mu_);
  bool restored_last_skipped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_RPC_SHARD_SERVICE_H_
