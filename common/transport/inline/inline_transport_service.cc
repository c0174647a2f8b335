#include "common/transport/inline/inline_transport_service.h"

#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_read_stream.h"
#include "common/transport/inline/inline_transport.h"

namespace zshard {

grpc::ServerWriteReactor<grpc::ByteBuffer>* InlineTransportService::ReadRegion(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "ReadRegion");
      !denied.ok()) {
    return FailedReadRegionStream(denied);
  }
  return StartReadRegionStream(transport_, *request,
                               InlineTransport::kMessageBytes);
}

grpc::Status InlineTransportService::WriteRegion(
    grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteRegionChunk>* reader,
    v1::WriteRegionResponse* /*resp*/) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "WriteRegion");
      !denied.ok()) {
    return denied;
  }
  v1::WriteRegionChunk chunk;
  while (reader->Read(&chunk)) {
    absl::Status st = transport_->ServeWrite(chunk.region(), chunk.key(),
                                             chunk.offset(), chunk.data());
    if (!st.ok()) return ToGrpcStatus(st);
  }
  return grpc::Status::OK;
}

grpc::Status InlineTransportService::SendMessage(
    grpc::ServerContext* ctx, const v1::TransportMessage* req,
    v1::TransportMessageResponse* /*resp*/) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "SendMessage");
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(
      transport_->Deliver(req->id(), req->header(), req->payload()));
}

}  // namespace zshard
