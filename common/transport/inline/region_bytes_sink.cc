#include "common/transport/inline/region_bytes_sink.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/inline/message_cursor.h"

namespace zshard {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("a ReadRegion reply is malformed: ", what));
}

}  // namespace

size_t RegionBytesSink::capacity() const {
  size_t total = 0;
  for (const Span& s : spans) total += s.size;
  return total;
}

absl::Status AppendRegionBytes(grpc::ByteBuffer* message,
                               RegionBytesSink* sink) {
  std::vector<grpc::Slice> slices;
  if (message->Valid() && !message->Dump(&slices).ok())
    return Malformed("unreadable buffer");
  message->Clear();
  MessageCursor in(&slices);
  if (in.AtEnd()) {  // RegionBytes{data = ""}
    ++sink->messages;
    return absl::OkStatus();
  }
  uint64_t tag = 0, length = 0;
  if (!in.Varint(&tag) || tag != ((1 << 3) | 2)) {
    return Malformed(
        absl::StrCat("field tag ", tag, " where only data (field 1) belongs"));
  }
  if (!in.Varint(&length)) return Malformed("truncated length");
  const size_t room = sink->capacity() - sink->received;
  if (length > room) {
    return absl::DataLossError(absl::StrCat("a ReadRegion reply carries ",
                                            length, " bytes beyond the ", room,
                                            " still expected"));
  }
  // The span holding byte `received`, and where in it.
  size_t span = 0, at = sink->received;
  while (span < sink->spans.size() && at >= sink->spans[span].size) {
    at -= sink->spans[span++].size;
  }
  for (uint64_t left = length; left > 0; ++span, at = 0) {
    const RegionBytesSink::Span& s = sink->spans[span];
    const size_t n = std::min<uint64_t>(left, s.size - at);
    if (!in.Copy(s.dest + at, n)) {
      return Malformed(absl::StrCat("shorter than its length ", length));
    }
    left -= n;
  }
  if (!in.AtEnd()) return Malformed("bytes after the data field");
  sink->received += length;
  ++sink->messages;
  return absl::OkStatus();
}

}  // namespace zshard

namespace grpc {

Status SerializationTraits<zshard::RegionBytesSink, void>::Deserialize(
    ByteBuffer* buffer, zshard::RegionBytesSink* sink) {
  absl::Status st = zshard::AppendRegionBytes(buffer, sink);
  if (st.ok()) return Status::OK;
  if (sink->error.ok()) sink->error = st;
  return Status(StatusCode::DATA_LOSS, std::string(st.message()));
}

}  // namespace grpc
