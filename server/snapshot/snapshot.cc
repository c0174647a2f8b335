#include "server/snapshot/snapshot.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zshard {

uint64_t Snapshot::GroupOffset(size_t i) const {
  uint64_t off = 0;
  for (size_t k = 0; k < i; ++k) {
    const v1::SnapshotGroup& g = header.groups(static_cast<int>(k));
    off += g.master_elements() + 2 * g.moment_elements();
  }
  return off;
}

absl::Status Snapshot::CopyTo(size_t i, Optimizer::State& state) const {
  const v1::SnapshotGroup& g = header.groups(static_cast<int>(i));
  if (state.master.size() != g.master_elements() ||
      state.m.size() != g.moment_elements() ||
      state.v.size() != g.moment_elements()) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot of step ", step(), ": group ", g.group(),
                     " holds ", g.master_elements(), " values and ",
                     g.moment_elements(), " moments, this shard keeps ",
                     state.master.size(), " and ", state.m.size()));
  }
  const float* p = values() + GroupOffset(i);
  std::copy(p, p + g.master_elements(), state.master.begin());
  p += g.master_elements();
  std::copy(p, p + g.moment_elements(), state.m.begin());
  p += g.moment_elements();
  std::copy(p, p + g.moment_elements(), state.v.begin());
  state.version = g.version();
  state.applied = g.applied();
  return absl::OkStatus();
}

absl::Status CheckSnapshotHeader(const v1::SnapshotHeader& header,
                                 uint32_t shard_id, uint32_t num_shards,
                                 size_t groups) {
  if (header.shard_id() != shard_id || header.num_shards() != num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot of shard ", header.shard_id(), " of ", header.num_shards(),
        " where shard ", shard_id, " of ", num_shards, " was expected"));
  }
  if (static_cast<size_t>(header.groups_size()) != groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot of shard ", shard_id, " holds ",
                     header.groups_size(), " groups, the model has ", groups));
  }
  uint64_t total = 0;
  for (int i = 0; i < header.groups_size(); ++i) {
    const v1::SnapshotGroup& g = header.groups(i);
    if (g.group() != static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot group ", i, " is labelled group ", g.group()));
    }
    if (g.moment_elements() > g.master_elements() ||
        g.master_elements() > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot group ", i, ": bad sizes"));
    }
    total += g.master_elements() + 2 * g.moment_elements();
  }
  if (total != header.total_floats()) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot of shard ", shard_id, ": total_floats ",
                     header.total_floats(), " but the groups hold ", total));
  }
  return absl::OkStatus();
}

}  // namespace zshard
