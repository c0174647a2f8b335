// The receiving end of the inline transport's ReadRegion stream: the data of
// each v1::RegionBytes message is copied from gRPC's receive slices straight
// into the caller's buffer, with no message object or string in between.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_REGION_BYTES_SINK_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_REGION_BYTES_SINK_H_

#include <grpcpp/impl/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"

namespace zshard {

// Where a stream's bytes go: each span filled from the front, then the next
// (a GetMany's ranges, in order).
struct RegionBytesSink {
  struct Span {
    char* dest = nullptr;
    size_t size = 0;
  };
  std::vector<Span> spans;
  size_t received = 0;  // over every span
  size_t messages = 0;  // messages appended
  absl::Status error;   // the first message that did not fit or parse
  // The bytes every span holds together.
  size_t capacity() const;
};

// Appends the data of one serialized v1::RegionBytes (`message`, consumed)
// at byte sink->received of the spans, across their boundaries. DATA_LOSS
// naming the fault when it does not parse as exactly that message or would
// pass capacity(); nothing is counted then (bytes before the fault may have
// been written).
absl::Status AppendRegionBytes(grpc::ByteBuffer* message,
                               RegionBytesSink* sink);

}  // namespace zshard

namespace grpc {

// Lets a grpc::ClientReader<RegionBytesSink> read RegionBytes messages into
// a sink; a failure is kept in sink->error and ends the reads.
template <>
class SerializationTraits<zshard::RegionBytesSink, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, zshard::RegionBytesSink* sink);
};

}  // namespace grpc

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_REGION_BYTES_SINK_H_
