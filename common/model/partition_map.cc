#include "common/model/partition_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"

namespace zshard {

absl::StatusOr<PartitionMap> PartitionMap::Create(
    const v1::ModelSpec& spec, uint32_t num_shards, uint64_t alignment,
    uint64_t persistence_threshold) {
  ZS_RETURN_IF_ERROR(ValidateModelSpec(spec));
  if (num_shards == 0) {
    return absl::InvalidArgumentError("num_shards must be at least 1");
  }
  if (alignment == 0) {
    return absl::InvalidArgumentError("alignment must be at least 1");
  }
  PartitionMap map;
  map.num_shards_ = num_shards;
  map.alignment_ = alignment;
  for (const auto& group : spec.groups()) {
    std::vector<uint64_t> offsets;
    Ranges trainable;
    uint64_t n = 0;
    for (const auto& t : group.tensors()) {
      offsets.push_back(n);
      const uint64_t end = n + TensorNumel(t);
      if (t.trainable() && end > n) {
        if (!trainable.empty() && trainable.back().second == n) {
          trainable.back().second = end;
        } else {
          trainable.emplace_back(n, end);
        }
      }
      n = end;
    }
    map.tensor_offsets_.push_back(std::move(offsets));
    map.group_numel_.push_back(n);
    map.persistent_.push_back(n < persistence_threshold);
    const uint64_t units = (n + alignment - 1) / alignment;
    for (uint32_t s = 0; s < num_shards; ++s) {
      const uint64_t lo = units * s / num_shards;
      const uint64_t hi = units * (s + 1) / num_shards;
      map.slices_.push_back(
          Slice{std::min(n, lo * alignment), std::min(n, hi * alignment)});
    }
    // Each slice's trainable elements are a run of the compact gradient.
    for (uint32_t s = 0; s < num_shards; ++s) {
      const Slice& sl = map.slices_[map.slices_.size() - num_shards + s];
      uint64_t before = 0, inside = 0;
      for (const auto& [lo, hi] : trainable) {
        before += std::min(hi, sl.begin) - std::min(lo, sl.begin);
        const uint64_t a = std::max(lo, sl.begin), b = std::min(hi, sl.end);
        if (a < b) inside += b - a;
      }
      map.compact_slices_.push_back(Slice{before, before + inside});
    }
    map.trainable_.push_back(std::move(trainable));
  }
  return map;
}

uint64_t PartitionMap::trainable_numel(size_t group) const {
  uint64_t n = 0;
  for (const auto& [lo, hi] : trainable_[group]) n += hi - lo;
  return n;
}

PartitionMap::Ranges PartitionMap::slice_trainable_ranges(
    size_t group, uint32_t shard) const {
  const Slice& s = slice(group, shard);
  Ranges out;
  for (const auto& [lo, hi] : trainable_[group]) {
    const uint64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a < b) out.emplace_back(a - s.begin, b - s.begin);
  }
  return out;
}

uint64_t PartitionMap::shard_numel(uint32_t shard) const {
  uint64_t n = 0;
  for (size_t g = 0; g < num_groups(); ++g) n += slice(g, shard).size();
  return n;
}

uint64_t PartitionMap::total_numel() const {
  uint64_t n = 0;
  for (uint64_t g : group_numel_) n += g;
  return n;
}

uint64_t LayoutVersion(uint32_t num_shards, uint64_t alignment,
                       uint64_t persistence_threshold) {
  uint64_t fields[3] = {num_shards, alignment, persistence_threshold};
  return Fnv1a64(fields, sizeof(fields));
}

}  // namespace zshard
