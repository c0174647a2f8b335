#include "server/initial_values.h"

#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace zshard {

InitialValues::InitialValues(const PartitionMap& map, uint32_t shard)
    : shard_(shard), values_(map.num_groups()), ranges_(map.num_groups()) {
  for (size_t g = 0; g < map.num_groups(); ++g) {
    slices_.push_back(map.slice(g, shard));
  }
}

absl::Status InitialValues::Add(uint32_t group, uint64_t offset,
                                const void* data, size_t n) {
  if (group >= slices_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values for unknown group ", group));
  }
  const Slice& s = slices_[group];
  if (!s.Contains(offset, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values [", offset, ", ", offset + n,
                     ") of group ", group, " lie outside shard ", shard_,
                     "'s slice [", s.begin, ", ", s.end, ")"));
  }
  if (n == 0) return absl::OkStatus();
  std::map<uint64_t, uint64_t>& r = ranges_[group];
  auto next = r.lower_bound(offset);
  const bool hits_next = next != r.end() && next->first < offset + n;
  const bool hits_prev = next != r.begin() && std::prev(next)->second > offset;
  if (hits_next || hits_prev) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values of group ", group, " overlap at element ",
                     hits_prev ? offset : next->first));
  }
  std::vector<float>& v = values_[group];
  if (v.empty()) v.resize(s.size());
  std::memcpy(v.data() + (offset - s.begin), data, n * sizeof(float));
  r.emplace(offset, offset + n);
  return absl::OkStatus();
}

absl::Status InitialValues::CheckComplete() const {
  for (size_t g = 0; g < slices_.size(); ++g) {
    const Slice& s = slices_[g];
    uint64_t next = s.begin;
    for (const auto& [lo, hi] : ranges_[g]) {
      if (lo != next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "initial values of group ", g, " leave a gap at element ", next));
      }
      next = hi;
    }
    if (next != s.end) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model not registered yet and the initial values of group ", g,
          " stop at element ", next, " of shard ", shard_, "'s slice [",
          s.begin, ", ", s.end, ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<float>> InitialValues::Take() {
  ranges_.assign(ranges_.size(), {});
  return std::move(values_);
}

}  // namespace zshard
