// PeerLink: a shard's calls to the rest of the cluster for in-memory
// snapshots and replacement (issue 16): it sends each complete snapshot to
// the buddy shard (shard + 1 mod shards) and reports it to the coordinator;
// a replacement asks the coordinator which snapshot to restore and fetches
// it from the buddy; shards > 0 heartbeat to the coordinator every second,
// learning the epoch and every shard's endpoint, and are told when another
// process has replaced them (fenced).
//
// Thread-safety: every method may be called from any thread; each call has
// a deadline.
#ifndef ZSHARD_SERVER_SNAPSHOT_PEER_LINK_H_
#define ZSHARD_SERVER_SNAPSHOT_PEER_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/rpc_credentials.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_channel.h"
#include "server/snapshot/snapshot.h"
#include "zshard/v1/coordinator.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {

struct PeerLinkOptions {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  // Where the coordinator is and the epoch (not owned; outlives the link).
  CoordinatorChannel* channel = nullptr;
  // Shard 0: the coordinator in this process (not owned; outlives the link).
  Coordinator* local = nullptr;
  std::shared_ptr<const RpcCredentials> peers = RpcCredentials::Plaintext();
  // Deadline of one snapshot's send plus its report.
  absl::Duration send_timeout = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // This shard's data plane (not owned): a snapshot in its memory is read
  // by the buddy from there instead of streamed.
  Transport* transport = nullptr;
};

// What a replacement restores: the step, the buddy's copy and the model.
struct Replacement {
  uint64_t step = 0;
  uint32_t buddy = 0;
  Snapshot snapshot;
  v1::ModelSpec spec;
};

class PeerLink {
 public:
  explicit PeerLink(const PeerLinkOptions& options);
  // Stops the heartbeats.
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Shards > 0: heartbeats as `endpoint` from now on; `fenced` runs once
  // (on the heartbeat thread) if the coordinator says another process
  // serves this shard. Shard 0: asks its buddy as often which coordinator it
  // calls; `fenced` runs once if that is another one, of a newer epoch (a
  // replacement took over while this process was stopped).
  void StartHeartbeats(const std::string& endpoint,
                       std::function<void(const absl::Status&)> fenced);

  uint64_t epoch() const;
  void SetEpoch(uint64_t epoch);
  // Every shard's endpoint as last learned (by shard id; "" when unknown).
  std::vector<std::string> endpoints() const;

  // SnapshotKeeper::SendFn: streams `s` to the buddy, then reports it and
  // waits for every shard's (see Coordinator::ReportSnapshot).
  absl::Status SendSnapshot(const Snapshot& s);
  // SnapshotKeeper::SkipFn: this shard skipped `step` (the coordinator
  // fails that step for every shard at once).
  absl::Status ReportSkipped(uint64_t step);

  // A replacement (this shard's id) asks the coordinator what to restore
  // (Coordinator::PrepareReplace).
  absl::StatusOr<v1::PrepareReplaceResponse> PlanReplacement(
      absl::Time deadline);
  // The buddy's copy of this shard's snapshot as `plan` names it, and the
  // model spec from the shard at `spec_from`.
  absl::StatusOr<Replacement> Fetch(const v1::PrepareReplaceResponse& plan,
                                    const std::string& spec_from,
                                    absl::Time deadline);

 private:
  // The buddy's endpoint as last learned ("" when unknown).
  std::string BuddyEndpoint() const;
  void Heartbeats(std::function<void(const absl::Status&)> fenced);
  // One heartbeat (learning the endpoints); FAILED_PRECONDITION when fenced
  // or before StartHeartbeats.
  absl::Status Beat(absl::Time deadline);
  // Shard 0's beat: FAILED_PRECONDITION when the buddy calls another
  // coordinator of a newer epoch.
  absl::Status CheckStillCoordinator(absl::Time deadline);
  // Tells the coordinator this shard's snapshot of `step` is held (OK
  // `failed`) or not; waits for every shard's (see ReportSnapshot).
  absl::Status Report(uint64_t step, uint64_t epoch, const absl::Status& failed,
                      absl::Time deadline);
  // What a sent header carries besides the snapshot's own: `epoch` and, on
  // shard 0, the membership history.
  void MarkHeader(uint64_t epoch, v1::SnapshotHeader* header) const;
  // Streams `s` to the buddy, marked with `epoch`.
  absl::Status Put(const Snapshot& s, uint64_t epoch, absl::Time deadline);
  std::shared_ptr<v1::ShardControl::Stub> ControlStub(
      const std::string& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PeerLinkOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::string> endpoints_ ABSL_GUARDED_BY(mu_);
  std::string self_ ABSL_GUARDED_BY(mu_);  // this shard's endpoint
  std::string control_endpoint_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::ShardControl::Stub> control_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SNAPSHOT_PEER_LINK_H_
