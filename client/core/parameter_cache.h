// ParameterCache: the trainer's resident parameters. Acquire(g) returns group
// g's gathered fp32 values for the current step, fetching the slices from
// every shard in parallel; a prefetcher replays the previous step's order of
// acquisitions to keep the next groups in flight, within a byte window.
// Non-persistent groups are dropped at Release unless needed next;
// persistent groups stay resident and are refreshed when the step advances.
//
// Thread-safety: all methods are thread-safe; fetches run on an internal
// pool. Acquire blocks until its group arrives or the RPC deadline passes.
#ifndef ZSHARD_CLIENT_CORE_PARAMETER_CACHE_H_
#define ZSHARD_CLIENT_CORE_PARAMETER_CACHE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/core/cluster.h"
#include "client/core/data_plane.h"
#include "client/core/host_cache.h"
#include "client/core/scratch_buffers.h"
#include "common/model/wire_format.h"
#include "zshard/kernels/cpu_kernels.h"
#include "common/base/thread_pool.h"
#include "common/model/partition_map.h"

namespace zshard {

struct ParameterCacheOptions {
  // Bytes of prefetched (not yet acquired) groups allowed at once.
  uint64_t prefetch_bytes = 64ull << 20;
  // Deadline of every fetch RPC (a fetch waits on the server for its version).
  absl::Duration rpc_timeout = absl::Seconds(30);
  int fetch_threads = 0;  // 0: two per shard
  // stage3_max_live_parameters, in bytes: acquired plus prefetched groups
  // never exceed it (persistent groups excluded).
  uint64_t max_live_bytes = UINT64_MAX;
  // stage3_max_reuse_distance, in elements: a released group whose next use
  // (by the previous step's order) comes within this many elements of other
  // groups' acquisitions stays resident, if the window allows.
  uint64_t max_reuse_distance = 1000000000;
  // Fetch the servers' bf16 copy (2 bytes per element) instead of fp32.
  bool bf16 = false;
  // A quantized format (ZeRO++'s qwZ): fetch the servers' quantized copy
  // and dequantize it into the buffers (fp32, or bf16 with `bf16`) as each
  // slice arrives. Plain (the default): off.
  WireFormat quantized;
  // ZeRO stages 0-2: every group stays resident (as if persistent) and is
  // refreshed at each step.
  bool keep_all_resident = false;
  // Lease + one-sided get over the transport. Required; not owned.
  DataPlane* data_plane = nullptr;
  // ZeRO++'s hpZ: the memory this host's `host_trainers` trainers share (not
  // owned; null: off) and this trainer's index among them. Slices of shards
  // s with s % host_trainers == host_index are fetched over the network and
  // published there; the others, and slices there already, are read from
  // there once published (over the network when none came within
  // `host_wait`, or when a newer version replaced them).
  HostCache* host_cache = nullptr;
  uint32_t host_trainers = 1;
  uint32_t host_index = 0;
  absl::Duration host_wait = absl::Seconds(30);
};

struct ParameterCacheStats {
  uint64_t bytes_fetched = 0;  // over the network, as the wire carries them
  // hpZ: bytes read from the host's shared memory instead, and slices that
  // had to be fetched over the network after all (host_wait, replaced).
  uint64_t bytes_from_host = 0;
  uint64_t host_misses = 0;
  uint64_t group_fetches = 0;
  uint64_t prefetch_hits = 0;  // acquisitions already fetched or in flight
  uint64_t resident_bytes = 0;
  uint64_t peak_resident_bytes = 0;
  uint64_t persistent_bytes = 0;
  double acquire_wait_seconds = 0;
};

class ParameterCache {
 public:
  // `cluster` and `map` must outlive the cache.
  ParameterCache(Cluster* cluster, const PartitionMap* map,
                 const ParameterCacheOptions& options);
  // Waits for fetches in flight (each bounded by its deadline).
  ~ParameterCache();

  // Starts step `version`: parameters acquired from now on are of that
  // version. The order of the previous step's acquisitions becomes the
  // prefetch plan, and the first groups of it are fetched right away.
  void BeginStep(uint64_t version);

  // Returns group `g`'s gathered values (GroupNumel elements: fp32, or bf16
  // bits with options.bf16; read-only), valid until Release(g). NOT_FOUND for
  // an unknown group; the fetch's error (naming the shard) when it fails or its
  // deadline passes.
  absl::StatusOr<const void*> Acquire(size_t g);

  // Ends the use of `g`. FAILED_PRECONDITION when it was not acquired.
  absl::Status Release(size_t g);

  // Upper bound the resident bytes stay under: the prefetch window (or the
  // live-parameter limit, if smaller), the largest group and the persistent
  // groups.
  uint64_t ResidentBound() const;

  ParameterCacheStats stats() const;

 private:
  enum class State { kEmpty, kFetching, kReady, kFailed };
  // How long a wait for a fetch in flight may take.
  absl::Duration FetchBound() const;
  struct Entry {
    std::unique_ptr<uint8_t[]> data;
    State state = State::kEmpty;
    uint64_t version = 0;
    int pending = 0;  // shard fetches outstanding
    bool acquired = false;
    bool prefetched = false;  // counted in prefetched_bytes_
    absl::Status error;
  };

  uint64_t Bytes(size_t g) const { return map_->group_numel(g) * elem_; }
  bool Persistent(size_t g) const {
    return options_.keep_all_resident || map_->persistent(g);
  }
  // Starts fetching `g` at the current version into a pooled buffer.
  void StartFetchLocked(size_t g, bool prefetch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `g` as fetching at the current version (buffer, counts); the
  // transfer starts with LaunchLocked.
  void MarkFetchingLocked(size_t g, bool prefetch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fetches the marked `groups` with one FetchMany per shard, on the pool
  // (with a host cache: the slices it serves on host_reader_ instead).
  void LaunchLocked(const std::vector<size_t>& groups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether shard `shard`'s slice of `g` at `version` comes from the host
  // cache: a peer fetches it (one not given up on), or it is there already.
  bool FromHostLocked(size_t g, uint32_t shard, uint64_t version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fetches `pieces` over the network; with `publish`, each slice that
  // arrives is also published in the host cache.
  void FetchSlices(uint32_t shard,
                   const std::vector<DataPlane::FetchPiece>& pieces,
                   uint64_t version, bool publish);
  // FetchSlices with a quantized format: the pieces come into scratch
  // memory and are dequantized into their buffers.
  void FetchQuantized(uint32_t shard,
                      const std::vector<DataPlane::FetchPiece>& pieces,
                      uint64_t version, bool publish);
  // Copies `pieces` from the host cache once published (within
  // options.host_wait); those it cannot get are fetched on the pool.
  // host_reader_'s thread: its waits never hold up a network fetch.
  void ReadFromHost(uint32_t shard,
                    const std::vector<DataPlane::FetchPiece>& pieces,
                    uint64_t version);
  // Publishes a decoded slice in the host cache.
  void PublishSlice(const DataPlane::FetchPiece& piece, uint32_t shard,
                    uint64_t version);
  // Decodes a quantized slice (`wire`) of `numel` values into `dest` (fp32,
  // or bf16 with options.bf16). Any fetch thread.
  absl::Status Dequantize(const void* wire, size_t numel, void* dest);
  // Records a slice's outcome (`bytes` fetched); the group is ready or failed
  // after its last slice.
  // `st` names the shard already (the data plane's errors do).
  void FetchDone(size_t g, uint32_t shard, const absl::Status& st,
                 uint64_t bytes, uint64_t host_bytes = 0);
  // Issues prefetches following trace position `pos` of the previous step.
  void PrefetchFromLocked(size_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `g`'s buffer (returned to the pool or freed).
  void DropLocked(size_t g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<uint8_t[]> TakeBufferLocked(size_t numel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteResidentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsCurrentLocked(size_t g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Cluster* const cluster_;
  const PartitionMap* const map_;
  const ParameterCacheOptions options_;
  const size_t elem_;  // bytes per element on the wire and in the buffers
  uint64_t max_group_bytes_ = 0;
  uint64_t persistent_bytes_ = 0;

  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Free buffers by element count, reused before allocating.
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> pool_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> trace_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> plan_ ABSL_GUARDED_BY(mu_);  // previous step's trace
  size_t plan_pos_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefetched_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t acquired_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // non-persistent
  // Whether `g` is used again within max_reuse_distance by the plan.
  bool ReusedSoonLocked(size_t g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int fetches_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  ParameterCacheStats stats_ ABSL_GUARDED_BY(mu_);
  // hpZ: host members whose slices a wait ran past host_wait for.
  std::set<uint32_t> host_skipped_ ABSL_GUARDED_BY(mu_);

  // Quantized fetches: their staging memory and (one thread's) kernels,
  // which every fetch thread may call at once.
  ScratchBuffers scratch_;
  std::unique_ptr<kernels::CpuKernels> kernels_;
  absl::Status kernels_error_;  // why kernels_ is null (quantized only)

  // Declared last: destroyed (joined) first, while the state above lives;
  // the host reader before the pool it hands misses to.
  std::unique_ptr<ThreadPool> pool_threads_;
  std::unique_ptr<ThreadPool> host_reader_;  // with a host cache only
  std::atomic<bool> closing_{false};  // ends host_reader_'s waits
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_CORE_PARAMETER_CACHE_H_
