// The partition map: which shard owns which contiguous range of each group's
// flat parameter vector. A pure function of (spec, shards, alignment,
// persistence threshold), so every process computes the same map and a
// checkpoint written with S shards can be read with S'.
#ifndef ZSHARD_COMMON_MODEL_PARTITION_MAP_H_
#define ZSHARD_COMMON_MODEL_PARTITION_MAP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

// Half-open element range [begin, end) within a group's flat vector.
struct Slice {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool Contains(uint64_t offset, uint64_t count) const {
    return offset >= begin && count <= end - begin &&
           offset - begin <= end - begin - count;
  }
};

// Immutable after Create; safe to share between threads.
class PartitionMap {
 public:
  // Each group's elements are cut into `alignment`-element units, and the
  // units are spread over all shards in contiguous, near-equal runs (sizes
  // differ by at most one unit). A group with fewer than
  // `persistence_threshold` elements is persistent: trainers keep it resident.
  static absl::StatusOr<PartitionMap> Create(const v1::ModelSpec& spec,
                                             uint32_t num_shards,
                                             uint64_t alignment,
                                             uint64_t persistence_threshold);

  uint32_t num_shards() const { return num_shards_; }
  uint64_t alignment() const { return alignment_; }
  size_t num_groups() const { return group_numel_.size(); }
  uint64_t group_numel(size_t group) const { return group_numel_[group]; }
  bool persistent(size_t group) const { return persistent_[group]; }
  const Slice& slice(size_t group, uint32_t shard) const {
    return slices_[group * num_shards_ + shard];
  }
  // Elements shard `shard` owns over all groups.
  uint64_t shard_numel(uint32_t shard) const;
  // Offset of tensor `tensor` within its group's flat vector.
  uint64_t tensor_offset(size_t group, size_t tensor) const {
    return tensor_offsets_[group][tensor];
  }
  uint64_t total_numel() const;

  // Frozen tensors (TensorSpec.trainable false) get no gradient: a group's
  // gradient on the wire is its trainable elements only, in order (the
  // "compact" gradient). Ranges [begin, end) of trainable elements within
  // the group's flat vector, neighbours merged, in order.
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  const Ranges& trainable_ranges(size_t group) const {
    return trainable_[group];
  }
  uint64_t trainable_numel(size_t group) const;
  // Shard `shard`'s part of group `group`'s compact gradient: it starts
  // at compact element `begin` and holds `size` elements (the trainable
  // elements of the shard's slice).
  Slice compact_slice(size_t group, uint32_t shard) const {
    return compact_slices_[group * num_shards_ + shard];
  }
  // The trainable ranges within `slice(group, shard)`, relative to its
  // begin.
  Ranges slice_trainable_ranges(size_t group, uint32_t shard) const;

 private:
  PartitionMap() = default;

  uint32_t num_shards_ = 0;
  uint64_t alignment_ = 1;
  std::vector<uint64_t> group_numel_;
  std::vector<bool> persistent_;
  std::vector<Slice> slices_;  // [group * num_shards + shard]
  std::vector<std::vector<uint64_t>> tensor_offsets_;
  std::vector<Ranges> trainable_;      // by group
  std::vector<Slice> compact_slices_;  // [group * num_shards + shard]
};

// Fingerprint of the layout parameters, reported at Join and GetLayout.
uint64_t LayoutVersion(uint32_t num_shards, uint64_t alignment,
                       uint64_t persistence_threshold);

}  // namespace zshard

#endif  // ZSHARD_COMMON_MODEL_PARTITION_MAP_H_
