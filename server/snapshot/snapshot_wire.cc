#include "server/snapshot/snapshot_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zshard {

absl::Status WriteSnapshot(
    const Snapshot& s,
    const std::function<bool(const v1::SnapshotChunk&)>& write) {
  v1::SnapshotChunk chunk;
  *chunk.mutable_header() = s.header;
  if (!write(chunk)) return absl::UnavailableError("snapshot stream broke");
  chunk.clear_header();
  const char* p = reinterpret_cast<const char*>(s.values());
  const size_t total = s.header.total_floats() * sizeof(float);
  for (size_t off = 0; off < total; off += kSnapshotChunkBytes) {
    chunk.set_data(p + off, std::min(kSnapshotChunkBytes, total - off));
    if (!write(chunk)) return absl::UnavailableError("snapshot stream broke");
  }
  return absl::OkStatus();
}

absl::Status ReadSnapshotData(const v1::SnapshotChunk& chunk, Snapshot* s) {
  const std::string& d = chunk.data();
  if (d.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot chunk of ", d.size(), " bytes is not whole fp32 values"));
  }
  const uint64_t n = d.size() / sizeof(float);
  if (s->filled + n > s->header.total_floats()) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot data runs past the header's ",
                     s->header.total_floats(), " values"));
  }
  if (n > 0) std::memcpy(s->values() + s->filled, d.data(), d.size());
  s->filled += n;
  return absl::OkStatus();
}

}  // namespace zshard
