// InitialValues: one shard's initial values for every group's slice,
// assembled from chunks as they arrive (RegisterModel's stream) straight
// into arrays that then become the optimizer's master weights
// (ShardStore::Register moves them in): the values are held once, never
// beside a second copy.
//
// Not thread-safe; one registration at a time owns it.
#ifndef ZSHARD_SERVER_INITIAL_VALUES_H_
#define ZSHARD_SERVER_INITIAL_VALUES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "common/model/partition_map.h"

namespace zshard {

class InitialValues {
 public:
  // For shard `shard`'s slices of `map`'s groups (copied; `map` need not
  // outlive this).
  InitialValues(const PartitionMap& map, uint32_t shard);

  // Copies `n` fp32 values at `data` (any alignment) into `group`'s slice at
  // global element `offset`. INVALID_ARGUMENT for an unknown group, a range
  // outside this shard's slice, or one overlapping values added before. On
  // error nothing changes.
  absl::Status Add(uint32_t group, uint64_t offset, const void* data, size_t n);
  // OK when the values cover every slice exactly; INVALID_ARGUMENT for a
  // gap before values of the same group, FAILED_PRECONDITION for values that
  // stop short of a slice's end (both name the group and element).
  absl::Status CheckComplete() const;

  uint32_t shard() const { return shard_; }
  const std::vector<Slice>& slices() const { return slices_; }
  // The slices' values, group by group (a slice with none added is empty);
  // leaves this object empty.
  std::vector<std::vector<float>> Take();

 private:
  uint32_t shard_;
  std::vector<Slice> slices_;
  std::vector<std::vector<float>> values_;
  // Per group: ranges added, begin -> end (never overlapping).
  std::vector<std::map<uint64_t, uint64_t>> ranges_;
};

}  // namespace zshard

#endif  // ZSHARD_SERVER_INITIAL_VALUES_H_
