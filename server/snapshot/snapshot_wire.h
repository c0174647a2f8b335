// A snapshot as a stream of SnapshotChunk messages (coordinator.proto): the
// header alone first, then the floats in order, at most kSnapshotChunkBytes
// per message. Used by the sender (to the buddy), the buddy (PutSnapshot,
// FetchSnapshot) and a replacement fetching its state.
#ifndef ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_WIRE_H_
#define ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_WIRE_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "server/snapshot/snapshot.h"
#include "zshard/v1/coordinator.pb.h"

namespace zshard {

inline constexpr size_t kSnapshotChunkBytes = 1 << 20;

// Writes `s` through `write` (false: the stream broke, UNAVAILABLE).
absl::Status WriteSnapshot(
    const Snapshot& s,
    const std::function<bool(const v1::SnapshotChunk&)>& write);

// Appends `chunk`'s data to `s` (whose header is set and buffer sized):
// INVALID_ARGUMENT for a size that is not whole floats or runs past the
// header's total.
absl::Status ReadSnapshotData(const v1::SnapshotChunk& chunk, Snapshot* s);

}  // namespace zshard

#endif  // ZSHARD_SERVER_SNAPSHOT_SNAPSHOT_WIRE_H_
