// HeldSnapshots: the other shards' snapshots this shard keeps as their buddy
// (issue 16): each arrives over ShardControl.PutSnapshot; per shard the
// newest one is kept and the one its header names as the sender's newest
// held everywhere (complete_step); a replacement takes one back with
// FetchSnapshot.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZSHARD_SERVER_SNAPSHOT_HELD_SNAPSHOTS_H_
#define ZSHARD_SERVER_SNAPSHOT_HELD_SNAPSHOTS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/snapshot/snapshot.h"

namespace zshard {

class HeldSnapshots {
 public:
  // Buffers per neighbour in the steady state: its newest complete copy,
  // the one before it until the new one is held everywhere, and the one
  // arriving.
  static constexpr int kBuffersPerShard = 3;

  // Makes kBuffersPerShard buffers for `shard`'s snapshots, each with room
  // for `floats` values, and touches them now (in huge pages), so that the
  // first snapshots that arrive while the cluster trains find their memory
  // ready. Blocks for the touching; keeps what is there when it is as big.
  void Prepare(uint32_t shard, uint64_t floats);
  // A buffer for a snapshot described by `header` (already checked), to be
  // filled by the caller and then passed to Keep. Reuses an evicted buffer
  // of the same shard when one is free.
  std::shared_ptr<Snapshot> Begin(const v1::SnapshotHeader& header);
  // `s` is complete: it becomes the shard's newest; of the older ones only
  // the one of step s.header.complete_step() stays.
  void Keep(std::shared_ptr<Snapshot> s);
  // The complete snapshot of `shard` at `step` (null when not held).
  std::shared_ptr<const Snapshot> Get(uint32_t shard, uint64_t step) const;
  // (shard, step) of every complete snapshot held.
  std::vector<std::pair<uint32_t, uint64_t>> Inventory() const;
  // Bytes of the complete snapshots held.
  uint64_t bytes() const;

 private:
  mutable absl::Mutex mu_;
  std::map<uint32_t, std::deque<std::shared_ptr<Snapshot>>> held_
      ABSL_GUARDED_BY(mu_);
  // Free buffers per shard (at most kBuffersPerShard).
  std::map<uint32_t, std::vector<std::shared_ptr<Snapshot>>> spare_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_SNAPSHOT_HELD_SNAPSHOTS_H_
