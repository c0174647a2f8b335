// Snapshot: one shard's training state at one step, in memory (DESIGN.md,
// "Coordinator and membership"; issue 16's shard half). The header says
// which step and, group by group, how many floats of master weights and
// AdamW moments follow; `data` holds them in that order, as the shard keeps
// them (moments over the trainable elements only). A shard keeps its own
// recent snapshots to roll back to and sends each to its buddy shard, which
// holds it for a replacement.
//
// Thread-safety: none; owners publish a complete snapshot as
// shared_ptr<const Snapshot>.
#ifndef ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_H_
#define ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/transport/transport.h"
#include "server/optimizer.h"
#include "zshard/v1/coordinator.pb.h"

namespace zshard {

struct Snapshot {
  v1::SnapshotHeader header;
  std::vector<float> data;
  // Floats received so far (== header.total_floats() when complete).
  uint64_t filled = 0;
  // A shard's own copy lies in memory from its transport (the buddy reads
  // it from there; `data` is then unused); null: in `data` (held copies, or
  // no transport: streamed over gRPC).
  std::shared_ptr<MemoryRegion> region;

  // The values, wherever they lie.
  float* values() {
    return region ? static_cast<float*>(region->data()) : data.data();
  }
  const float* values() const {
    return region ? static_cast<const float*>(region->data()) : data.data();
  }

  uint64_t step() const { return header.step(); }
  bool complete() const { return filled == header.total_floats(); }
  // Where group index `i` of the header starts in `data`.
  uint64_t GroupOffset(size_t i) const;
  // Copies group index `i` into `state` (arrays sized as the header says;
  // FAILED_PRECONDITION naming the group when they differ).
  absl::Status CopyTo(size_t i, Optimizer::State& state) const;
};

// Checks that `header` describes shard `shard_id` of `num_shards` with
// `groups` groups and a float count that adds up; INVALID_ARGUMENT naming
// the first difference.
absl::Status CheckSnapshotHeader(const v1::SnapshotHeader& header,
                                 uint32_t shard_id, uint32_t num_shards,
                                 size_t groups);

}  // namespace zshard

#endif  // ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_H_
