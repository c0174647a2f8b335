// InlineTransportService: the serving end of the inline transport (proto
// service zshard.v1.InlineTransport): ReadRegion streams a registered
// region's bytes straight from its memory (inline_read_stream.h),
// WriteRegion writes into one (inline_write_stream.h), SendMessage delivers to
// the handler for its id. Owned by the InlineTransport it serves, which hands
// it to the owner's gRPC server (Transport::GrpcService). Thread-safe; every
// request is checked against the region table (INVALID_ARGUMENT for unknown
// regions, wrong keys or ranges) before a byte moves.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_SERVICE_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "zshard/v1/inline_transport.grpc.pb.h"

namespace zshard {

class InlineTransport;

class InlineTransportService final
    : public v1::InlineTransport::WithRawCallbackMethod_ReadRegion<
          v1::InlineTransport::WithRawCallbackMethod_WriteRegion<
              v1::InlineTransport::WithCallbackMethod_SendMessage<
                  v1::InlineTransport::Service>>> {
 public:
  // `transport` outlives the service.
  explicit InlineTransportService(InlineTransport* transport)
      : transport_(transport) {}

  // Served by gRPC's callback API from the region's memory without a copy.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegion(
      grpc::CallbackServerContext* ctx,
      const grpc::ByteBuffer* request) override;
  // Served by gRPC's callback API into the region's memory, one copy.
  grpc::ServerReadReactor<grpc::ByteBuffer>* WriteRegion(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) override;
  // A message is delivered on the gRPC thread that received it; a call is
  // answered when its handler answers, holding no thread meanwhile (a call
  // without a deadline is INVALID_ARGUMENT: it could wait forever).
  grpc::ServerUnaryReactor* SendMessage(
      grpc::CallbackServerContext* ctx, const v1::TransportMessage* req,
      v1::TransportMessageResponse* resp) override;

 private:
  InlineTransport* const transport_;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_INLINE_TRANSPORT_SERVICE_H_
