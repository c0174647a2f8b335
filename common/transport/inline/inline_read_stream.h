// The server side of the inline transport's ReadRegion RPC: streams a range
// of a registered region as RegionBytes messages whose data gRPC sends
// straight from the region's memory (a pinned slice per message, no copy and
// no allocation per byte), so serving a read costs the kernel's copy into the
// socket and little else.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_READ_STREAM_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_READ_STREAM_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <cstddef>

namespace zshard {

class InlineTransport;

// Starts serving one ReadRegion call: `request` is a serialized
// v1::ReadRegionRequest; the reply is a stream of v1::RegionBytes of at most
// `chunk_bytes` data each, its ranges' bytes in order (the first range, then
// `more`). A malformed request, more than 4096 further ranges, an unknown
// region, a wrong key or a range outside the region (any of them) finishes
// the call with INVALID_ARGUMENT and nothing sent; a null `transport` with
// FAILED_PRECONDITION. Never blocks. The reactor deletes itself when gRPC is
// done with the call; the region cannot be deregistered until then
// (InlineTransport::Pin).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartReadRegionStream(
    InlineTransport* transport, const grpc::ByteBuffer& request,
    size_t chunk_bytes);

// A ReadRegion call answered with `status` (not OK) and no bytes; deletes
// itself like the above.
grpc::ServerWriteReactor<grpc::ByteBuffer>* FailedReadRegionStream(
    const grpc::Status& status);

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_READ_STREAM_H_
