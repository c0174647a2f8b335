// DataPlane: the trainer's side of the data plane (DESIGN.md, "Data
// plane"). Parameters: a Lease transport call per shard and version (for
// every group of the step fetched from it: FetchMany; the shard answers once
// the version is published) names each published slice in the shard's
// registered memory; the bytes come with one-sided Gets over the
// transport (UCX: the server's CPU takes no part); a lease is
// released with the next lease to that shard (or by ReleaseAll, as the data
// plane closes). Gradients: a slot of the shard's landing pool (a
// ReserveLanding transport call, answered once the pool has one for it), a
// Put into it, then a Landed transport call that hands it to the reducer
// (the reduction order stays fixed); where the transport carries a put and
// a call in one request (inline: Pair::PutThenCall), the Put and the Landed
// call go as one. No gRPC call is made per group or per
// step here: Release and the ones the cluster makes (ReportStep) are gRPC's. A
// Landed answer may carry a landing credit, a slot for the next contribution to
// that shard, which then needs no reservation.
//
// Thread-safe: fetches and pushes of different groups and shards run in
// parallel from the cache's and pusher's threads.
#ifndef ZSHARD_CLIENT_CORE_DATA_PLANE_H_
#define ZSHARD_CLIENT_CORE_DATA_PLANE_H_

#include <grpcpp/client_context.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/core/cluster.h"
#include "client/core/peer_wait.h"
#include "common/model/wire_format.h"
#include "common/transport/transport.h"

namespace zshard {

class DataPlane {
 public:
  // Connects to every shard over the transport the cluster negotiated at
  // Join. `cluster` must outlive the data plane. A lease or landing
  // reservation that a shard holds for late trainers is asked again for up
  // to `peer_wait` (client/core/peer_wait.h).
  static absl::StatusOr<std::unique_ptr<DataPlane>> Create(
      Cluster* cluster, absl::Duration peer_wait = kDefaultPeerWait);
  ~DataPlane();

  const std::string& transport_name() const { return name_; }
  // How long a call that late trainers hold may be made again (Create).
  absl::Duration peer_wait() const { return peer_wait_; }
  // The transport's lanes per shard, e.g. "posix/memory cma/memory".
  std::string Lanes() const;

  // Fills `dest` (the slice's bytes in `wire`) with `group`'s slice on
  // `shard` at
  // exactly `version` (waiting on the shard for it until `deadline`, or for
  // as long again while the shard says it waits for late trainers, up to
  // peer_wait; every deadline below is meant so).
  // Errors name the shard.
  absl::Status Fetch(uint32_t shard, uint32_t group, uint64_t version,
                     const WireFormat& wire, void* dest, size_t bytes,
                     absl::Time deadline);

  // One piece of a FetchMany: `group`'s slice on the shard (`bytes`) into
  // `dest`, which stays valid until the piece is reported.
  struct FetchPiece {
    uint32_t group = 0;
    void* dest = nullptr;
    size_t bytes = 0;
  };
  // Fetch for several groups at one version; their gets are all in flight
  // at once (one request stream for all where the transport has get_many). The
  // lease is for the whole step: the first fetch at a version leases, in one
  // call, these groups and every other group fetched from the shard before
  // (granted when the last of them is published: at a step's start, the groups
  // backward updated last are the ones forward needs first); later fetches at
  // that version, backward's re-fetches included, use those grants with no
  // call. The leases go back with the next version's lease call (or
  // ReleaseAll). Calls `done(i, status)` once per piece, in order, as soon as
  // piece i's bytes are in or with its error (naming the shard). Blocks until
  // every piece is reported, each within `deadline`.
  void FetchMany(uint32_t shard, const std::vector<FetchPiece>& pieces,
                 uint64_t version, const WireFormat& wire,
                 absl::Time deadline,
                 const std::function<void(size_t, const absl::Status&)>& done);

  // Sends this trainer's contribution to (group, step, micro_step) on
  // `shard` (`bytes`: the slice's trainable elements in `wire`; 0
  // when it has none, and then only the Landed call goes) and waits until
  // the shard took it, at most until `deadline` (also while the shard's
  // landing pool has no slot for it). Errors name the shard.
  absl::Status Push(uint32_t shard, uint32_t group, uint64_t step,
                    uint32_t micro_step, const WireFormat& wire,
                    const void* data, size_t bytes,
                    const std::string& trainer_state, absl::Time deadline);

  // A Push in two halves, so that one thread has a group's pushes to every
  // shard in flight at once and waits for their answers together (a thread
  // per shard, each waiting for its own answer, took two or three context
  // switches a push, which cost more than a small push's work).
  // StartPush does what Push does up to the shard's answer: a reservation
  // when the shard granted no credit that fits (waited for here), the put
  // (waited for here unless it rides with the call), and the Landed call,
  // posted. `data` must stay valid until FinishPush returns. FinishPush waits
  // for the answer (until the start's `deadline`) and returns what Push would
  // have; a start that failed returns its error there. Each StartedPush is
  // finished once, on any thread.
  // A transport call posted: done once `*reply` holds the answer.
  struct StartedCall {
    std::shared_ptr<Request> request;
    std::unique_ptr<std::string> reply;
  };
  struct StartedPush {
    uint32_t shard = 0;
    absl::Status error;  // the start's
    StartedCall call;
    absl::Time deadline;
  };
  StartedPush StartPush(uint32_t shard, uint32_t group, uint64_t step,
                        uint32_t micro_step, const WireFormat& wire,
                        const void* data, size_t bytes,
                        const std::string& trainer_state, absl::Time deadline);
  absl::Status FinishPush(StartedPush started);

  // Sends `req` to shard 0 over the transport (a heartbeat that costs no
  // gRPC call) and waits for its answer until `deadline`: Heartbeat's
  // verdict, or the transport's error (CANCELLED once aborted).
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, absl::Time deadline);

  // Calls made over the transport instead of gRPC, by method ("Landed",
  // "ReserveLanding", "Heartbeat"): control messages the gRPC counter
  // (Cluster::rpcs) does not see.
  std::map<std::string, uint64_t> transport_calls() const;

  // Releases every lease still held (end of a step). Errors name the shard.
  absl::Status ReleaseAll(absl::Time deadline);
  // Releases the leases held on `shard` now, not with the next lease call
  // to it: for a shard this trainer fetched from once and may not lease
  // again for a while (hpZ: a peer's shard after a host cache miss), whose
  // publishing would otherwise wait for the leases' deadline. The fetches
  // from it must be done. Errors name the shard.
  absl::Status Release(uint32_t shard, absl::Time deadline);

  // The trainer gives this data plane up (it joins the cluster again; also
  // done here when a shard answers ABORTED: it rolled back): every call to a
  // shard in flight ends now with CANCELLED, and so does every later one, so
  // the threads waiting on a shard that stopped answering are free at once
  // instead of at their deadlines. Idempotent; any thread.
  void Abort(const std::string& why);

 private:
  DataPlane() = default;
  // A shard's answer `st`, passed on; ABORTED (the shard rolled back: this
  // client's session is over) aborts the data plane first.
  absl::Status Settled(const absl::Status& st);
  // A call's context that Abort cancels while it is in flight. Constructed
  // and destroyed on the calling thread.
  class TrackedCall {
   public:
    TrackedCall(DataPlane* plane, absl::Time deadline);
    ~TrackedCall();
    grpc::ClientContext* context() { return &ctx_; }

   private:
    DataPlane* const plane_;
    grpc::ClientContext ctx_;
  };
  // A landing credit a shard granted (see trainer.proto, LandingCredit).
  struct Credit {
    uint32_t slot = 0;
    RemoteRegion region;
    uint64_t offset = 0;    // bytes
    uint64_t elements = 0;  // capacity in the push dtype
  };
  // Bytes to put before a transport call (into `region` at `offset`).
  struct PutPart {
    const void* data = nullptr;
    size_t bytes = 0;
    RemoteRegion region;
    uint64_t offset = 0;
  };
  // Puts `bytes` at `data` into `region` at `offset` on `shard` and waits
  // for them (errors name the shard).
  absl::Status PutAll(uint32_t shard, const void* data, size_t bytes,
                      const RemoteRegion& region, uint64_t offset,
                      absl::Time deadline);
  // Leases `groups` (at least one) on `shard` at `min_version` in one call
  // (made again while the shard waits for late trainers; `*deadline` then
  // moves on with it); records their landing areas. The grants are the
  // response and its `more`, in order.
  absl::StatusOr<v1::LeaseResponse> LeaseOn(uint32_t shard,
                                            const std::vector<uint32_t>& groups,
                                            uint64_t min_version,
                                            const WireFormat& wire,
                                            absl::Time* deadline);
  // Puts the contribution's bytes (`put`, unless null) and starts handing
  // the contribution `landed` describes to `shard` (a transport call: no
  // gRPC round trip), both in one request where the transport can
  // (put_then_call) and the bytes fit one put; FinishCallOn gives the
  // shard's answer. Errors name the shard; ABORTED aborts the data plane
  // (Settled).
  absl::StatusOr<StartedCall> StartLandedOn(uint32_t shard,
                                            v1::LandedRequest landed,
                                            const PutPart* put,
                                            absl::Time deadline);
  // Makes transport call `id` with `header` on `shard` and returns the
  // answer's bytes (counted in transport_calls() as `method`). Errors name
  // the shard; ABORTED aborts the data plane (Settled).
  // With `annotate` false the errors do not name the shard (the caller
  // does). With `put` (only where the transport has put_then_call) its
  // bytes go first, in the same request (Pair::PutThenCall).
  absl::StatusOr<std::string> TransportCallOn(
      uint32_t shard, v1::TransportCall id, const char* method,
      const std::string& header, absl::Time deadline, bool annotate = true,
      const PutPart* put = nullptr);
  // TransportCallOn in two halves: the call posted, then its answer waited
  // for until `deadline` (errors as TransportCallOn's).
  absl::StatusOr<StartedCall> StartCallOn(uint32_t shard, v1::TransportCall id,
                                          const char* method,
                                          const std::string& header,
                                          absl::Time deadline, bool annotate,
                                          const PutPart* put);
  absl::StatusOr<std::string> FinishCallOn(uint32_t shard, StartedCall call,
                                           absl::Time deadline, bool annotate);
  // A transport call's outcome `st` on `shard` as the caller sees it:
  // DEADLINE_EXCEEDED before `deadline` is the shard's answer, any other
  // failure the transfer's (TransferError); Settled; named for the shard
  // with `annotate`.
  absl::Status CallOutcome(uint32_t shard, absl::Status st, absl::Time deadline,
                           bool annotate);
  // A landing slot for `req` on `shard`, over the transport: granted at
  // once or once the shard's pool has one for it (made again while the
  // shard waits for late trainers; `*deadline` moves on with it).
  absl::StatusOr<v1::ReserveLandingResponse> Reserve(
      uint32_t shard, const v1::ReserveLandingRequest& req,
      absl::Time* deadline);
  // Every group leased on a shard at one version (FetchMany).
  struct StepGrants {
    uint64_t version = 0;
    WireFormat wire;
    std::map<uint32_t, v1::LeaseResponse> by_group;
  };
  // The gets of every piece whose `status` is OK, in one GetMany (the
  // transport has get_many): each piece's requests into `gets`, or the
  // refusal into its `status`.
  static void StartGetsTogether(
      Pair& pair, const std::vector<FetchPiece>& pieces,
      const StepGrants& grants, std::vector<absl::Status>* status,
      std::vector<std::vector<std::shared_ptr<Request>>>* gets);
  // The grants for `pieces` at `version`: the step's (no call) when they
  // hold them all, else a new lease of them and every known group of the
  // shard, which replaces the step's (their leases are released with it);
  // a late fetch of an older version than the step's leases just its
  // pieces, once.
  // Queues `grants`' leases to go back with the next lease call to `shard`
  // (or ReleaseAll).
  void ReleaseLaterLocked(uint32_t shard, const StepGrants& grants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<const StepGrants>> GrantsFor(
      uint32_t shard, const std::vector<FetchPiece>& pieces, uint64_t version,
      const WireFormat& wire, absl::Time* deadline);
  // Posts the gets of `piece` from `grant` into `gets`; on a refusal waits
  // for the ones posted and returns it.
  static absl::Status StartGets(Pair& pair, const FetchPiece& piece,
                                const v1::LeaseResponse& grant,
                                std::vector<std::shared_ptr<Request>>* gets,
                                absl::Time deadline);

  Cluster* cluster_ = nullptr;
  absl::Duration peer_wait_;
  std::string name_;
  std::vector<std::unique_ptr<Transport>> transports_;  // by shard
  std::vector<std::unique_ptr<Pair>> pairs_;            // by shard
  bool put_then_call_ = false;  // the transports' properties
  bool get_many_ = false;
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> transport_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint64_t>> to_release_
      ABSL_GUARDED_BY(mu_);                                          // by shard
  std::vector<std::optional<Credit>> credits_ ABSL_GUARDED_BY(mu_);  // same
  std::vector<std::shared_ptr<const StepGrants>> step_grants_
      ABSL_GUARDED_BY(mu_);  // by shard
  // Every group fetched from each shard so far.
  std::vector<std::set<uint32_t>> known_groups_ ABSL_GUARDED_BY(mu_);
  // A GrantsFor lease call is in flight on the shard.
  std::vector<bool> leasing_ ABSL_GUARDED_BY(mu_);
  // The last GrantsFor lease call's outcome per shard, for the fetches that
  // waited for it.
  struct LeaseFailure {
    uint64_t version = 0;
    absl::Status status;
  };
  std::vector<LeaseFailure> lease_failures_ ABSL_GUARDED_BY(mu_);
  std::string aborted_ ABSL_GUARDED_BY(mu_);  // why, once aborted
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_DATA_PLANE_H_
