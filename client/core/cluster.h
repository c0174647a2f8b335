// Cluster: a trainer's connection to every shard. Joins the coordinator
// (which assigns the rank and lists the shards), joins each shard, checks
// they agree (layout, world size, config), and registers or verifies the
// model. Thread-safe after Connect; stubs may be used from any thread.
#ifndef ZSHARD_CLIENT_CORE_CLUSTER_H_
#define ZSHARD_CLIENT_CORE_CLUSTER_H_

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
#include "client/core/rpc_counter.h"
#include "common/base/rpc_credentials.h"
#include "common/model/partition_map.h"
#include "zshard/v1/admin.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {

struct ClusterOptions {
  // host:port of shard 0.
  std::string coordinator;
  // -1: the coordinator assigns the next free rank.
  int requested_rank = -1;
  // This process's identity in the membership (0: a new random one). A
  // trainer joining again after a rollback passes its old one, so the
  // coordinator gives it its rank back.
  uint64_t instance_id = 0;
  // Shown in the servers' status (default host:pid).
  std::string trainer_id;
  // How long Connect waits for the servers to come up and agree.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Refuse servers whose config fingerprint differs (0: not checked); the
  // trainer's canonical config names the keys that differ.
  uint64_t expected_config_hash = 0;
  std::string expected_config_canonical;
  // Data plane asked for at Join ("ucx", "inline"; "" = the servers').
  std::string transport;
  // Rank 0 only verifies the model instead of registering it (a trainer
  // joining again after a rollback: the servers hold it).
  bool verify_only = false;
  // TLS and the trainer token every call to the shards carries (also the
  // inline data plane's).
  std::shared_ptr<const RpcCredentials> credentials =
      RpcCredentials::Plaintext();
};

class Cluster {
 public:
  // Blocks until every shard has been joined or connect_timeout passes
  // (UNAVAILABLE naming the shard; while every rank is held by a live
  // trainer it keeps asking). FAILED_PRECONDITION when the shards disagree
  // with each other or with expected_config_hash. From the coordinator's
  // answer on, a thread heartbeats to it until the cluster is destroyed.
  static absl::StatusOr<std::unique_ptr<Cluster>> Connect(
      const ClusterOptions& options);
  // Stops the heartbeats and tells the coordinator this trainer leaves
  // (waits at most 2 s for it), unless Detach was called.
  ~Cluster();
  // Stops the heartbeats; the destructor will not leave: another Cluster of
  // this process (same instance id) holds the rank now.
  void Detach();
  // A cluster joined again with an instance id (ClusterOptions::instance_id)
  // does not leave on destruction until Hold is called: an attempt that
  // fails after the join must not give up the rank the process still holds.
  // Hold makes the destructor leave (when the coordinator has membership).
  void Hold();

  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  uint32_t num_shards() const { return static_cast<uint32_t>(stubs_.size()); }
  uint32_t accumulation_steps() const { return accumulation_steps_; }
  uint64_t config_hash() const { return config_hash_; }
  // Whether each step ends with CommitStep on every shard.
  bool step_barrier() const { return step_barrier_; }
  const v1::Layout& layout() const { return layout_; }
  const std::string& endpoint(uint32_t shard) const {
    return endpoints_[shard];
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // After the coordinator stopped answering: the coordinator the shards at
  // `endpoints` name (GetLayout), the one of the newest epoch above
  // `min_epoch` (shard 0 was replaced and the new one took over). NOT_FOUND
  // when no shard that answers by `deadline` names a newer one.
  static absl::StatusOr<std::string> FindCoordinator(
      const std::vector<std::string>& endpoints, uint64_t min_epoch,
      const RpcCredentials& credentials, absl::Time deadline);
  v1::ShardService::Stub& stub(uint32_t shard) { return *stubs_[shard]; }
  const std::shared_ptr<const RpcCredentials>& credentials() const {
    return credentials_;
  }
  // This client's gRPC calls to every shard, counted by method (Landed
  // travels on the data plane's transport and is not among them).
  const RpcCounter& rpcs() const { return *rpcs_; }

  // Set when the shards were restored from a checkpoint (all agree): its
  // step, this rank's saved resume state (empty if it reported none) and
  // whether the step before the checkpoint was skipped.
  struct Resume {
    bool restored = false;
    uint64_t step = 0;
    std::string trainer_state;
    bool last_step_skipped = false;
    // The coordinator's membership epoch (one more after each shard
    // replacement: the shards then say where they rolled back to above).
    uint64_t epoch = 0;
  };
  const Resume& resume() const { return resume_; }

  // The data plane the shards run ("" when none) and each shard's address
  // for its transport.
  const std::string& transport() const { return transport_; }
  // The token `shard` gave this trainer at Join for its transport calls.
  uint64_t call_token(uint32_t shard) const { return call_tokens_[shard]; }
  const std::string& transport_address(uint32_t shard) const {
    return transport_addresses_[shard];
  }

  // "shard 2 (127.0.0.1:4242): <message>", same code.
  absl::Status Annotate(uint32_t shard, const absl::Status& status) const;

  // Fills `out` (GroupNumel(group) floats) with group `g`'s initial values.
  using InitFn = std::function<absl::Status(size_t g, float* out)>;

  // Rank 0 registers `spec` with the values `init` produces (one group in
  // memory at a time); every other rank waits (until `timeout`) for the
  // registration and checks the registered spec equals `spec`
  // (FAILED_PRECONDITION naming the first difference). Returns the map.
  absl::StatusOr<PartitionMap> RegisterOrVerify(const v1::ModelSpec& spec,
                                                const InitFn& init,
                                                absl::Duration timeout);

  // The version every group on every shard is at. FAILED_PRECONDITION while
  // a step is half applied (versions differ), naming the range.
  absl::StatusOr<uint64_t> AgreedVersion(absl::Duration timeout);

  // Asks the coordinator to admit this trainer on every shard (after
  // RegisterOrVerify): the step it starts at. Steps before it never wait
  // for this rank, steps from it on do until it leaves or is dropped.
  absl::StatusOr<uint64_t> Admit(absl::Duration timeout);
  // OK while the coordinator holds this trainer's rank; its error once the
  // trainer was dropped (FAILED_PRECONDITION: it must join again as a new
  // process), once the cluster rolled back since it joined (ABORTED: join
  // again as this process, the rank is kept), or once the coordinator
  // stopped answering and the shards name a newer one (UNAVAILABLE: shard
  // 0 was replaced; join again there, moved_to()).
  absl::Status membership() const;
  // Where the coordinator moved ("" unless membership() says it did).
  std::string moved_to() const;
  // Runs `hook` once, on the heartbeat thread, when membership() stops
  // being OK (null: nothing). Setting it waits for a run in progress, so
  // what the hook uses may be destroyed once it is reset.
  void SetLostHook(std::function<void(const absl::Status&)> hook);
  // This process's identity in the membership.
  uint64_t instance_id() const { return instance_id_; }
  // Shard 0 accepted a step report sent at `sent` that carried
  // instance_id() (ReportStepRequest.instance_id): it counted as a
  // heartbeat, so the heartbeat thread sends none until `sent` is an
  // interval old. Thread-safe, never blocks.
  void Vouched(absl::Time sent);
  // Heartbeats go through `send` (the data plane's transport) while it is
  // set; an answer that is not a verdict on the membership (FAILED_
  // PRECONDITION, INVALID_ARGUMENT, ABORTED) sends that heartbeat over gRPC
  // instead.
  // Setting waits for a send in progress, so what `send` uses may be
  // destroyed once it is reset (null).
  using BeatSender = std::function<absl::Status(const v1::HeartbeatRequest&,
                                                absl::Time deadline)>;
  void SetBeatSender(BeatSender send);

 private:
  Cluster() = default;
  // Heartbeats to shard 0 every `interval` until stopped or refused.
  void Heartbeats(absl::Duration interval);
  // One heartbeat: over beat_sender_ while set, else (or when its answer is
  // no verdict) over gRPC.
  absl::Status Beat(absl::Duration interval);
  absl::Status Register(const v1::ModelSpec& spec, const PartitionMap& map,
                        const InitFn& init, absl::Duration timeout);
  absl::Status Verify(const v1::ModelSpec& spec, absl::Duration timeout);

  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;
  uint32_t accumulation_steps_ = 1;
  uint64_t config_hash_ = 0;
  bool step_barrier_ = false;
  Resume resume_;
  std::string transport_;
  std::vector<std::string> transport_addresses_;
  std::vector<uint64_t> call_tokens_;  // by shard
  v1::Layout layout_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<v1::ShardService::Stub>> stubs_;
  std::shared_ptr<const RpcCredentials> credentials_;
  // Counts this cluster's gRPC calls by method for rpcs(); shared with the
  // stubs' channel interceptors, which add to it.
  const std::shared_ptr<RpcCounter> rpcs_ = RpcCounter::Create();
  uint64_t instance_id_ = 0;
  bool verify_only_ = false;
  bool left_ = false;  // Leave sent (or not to be sent)
  mutable absl::Mutex beat_mu_;
  bool beat_stop_ ABSL_GUARDED_BY(beat_mu_) = false;
  absl::Time vouched_ ABSL_GUARDED_BY(beat_mu_) = absl::InfinitePast();
  // Held while a heartbeat goes through beat_sender_.
  absl::Mutex sender_mu_ ABSL_ACQUIRED_AFTER(beat_mu_);
  BeatSender beat_sender_ ABSL_GUARDED_BY(sender_mu_);
  absl::Status membership_ ABSL_GUARDED_BY(beat_mu_);
  std::string moved_to_ ABSL_GUARDED_BY(beat_mu_);
  std::function<void(const absl::Status&)> lost_hook_ ABSL_GUARDED_BY(beat_mu_);
  std::thread beat_thread_;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_CLUSTER_H_
