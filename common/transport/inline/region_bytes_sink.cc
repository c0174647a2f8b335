#include "common/transport/inline/region_bytes_sink.h"

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

absl::Status AppendRegionBytes(grpc::ByteBuffer* message,
                               RegionBytesSink* sink) {
  std::vector<grpc::Slice> slices;
  if (message->Valid() && !message->Dump(&slices).ok())
    return Malformed("unreadable buffer");
  message->Clear();
  MessageCursor in(&slices);
  if (in.AtEnd()) return absl::OkStatus();  // RegionBytes{data = ""}
  uint64_t tag = 0, length = 0;
  if (!in.Varint(&tag) || tag != ((1 << 3) | 2)) {
    return Malformed(
        absl::StrCat("field tag ", tag, " where only data (field 1) belongs"));
  }
  if (!in.Varint(&length)) return Malformed("truncated length");
  if (length > sink->capacity - sink->received) {
    return absl::DataLossError(absl::StrCat(
        "a ReadRegion reply carries ", length, " bytes beyond the ",
        sink->capacity - sink->received, " still expected"));
  }
  if (!in.Copy(sink->dest + sink->received, length)) {
    return Malformed(absl::StrCat("shorter than its length ", length));
  }
  if (!in.AtEnd()) return Malformed("bytes after the data field");
  sink->received += length;
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
