// The server side of the inline transport's WriteRegion RPC: each
// v1::WriteRegionChunk's data goes from gRPC's receive slices straight into
// the registered region (no message object, no string, one copy), on the
// gRPC thread that received it, with no handler thread in between.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_WRITE_STREAM_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_WRITE_STREAM_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

namespace zshard {

class InlineTransport;

// Starts serving one WriteRegion call; `response` (gRPC's, for the call's
// life) gets the serialized v1::WriteRegionResponse. Each chunk is checked
// before a byte of it moves: one that does not parse, names an unknown
// region, carries a wrong key or a range outside the region ends the call
// with INVALID_ARGUMENT (chunks before it stay written); a stream without a
// chunk too, a chunk after the one that carried a call, and a call on a
// stream without a deadline (`has_deadline`: it could wait forever). A
// last chunk's call goes to the transport's call handler (Answer) once the
// stream's bytes are written; its answer is the response's reply (its
// error, the call's status). A null `transport`: FAILED_PRECONDITION. Never
// blocks; the reactor deletes itself when gRPC is done with the call.
grpc::ServerReadReactor<grpc::ByteBuffer>* StartWriteRegionStream(
    InlineTransport* transport, bool has_deadline, grpc::ByteBuffer* response);

// A WriteRegion call answered with `status` (not OK), nothing written.
grpc::ServerReadReactor<grpc::ByteBuffer>* FailedWriteRegionStream(
    const grpc::Status& status);

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_WRITE_STREAM_H_
