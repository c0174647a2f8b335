#include "common/transport/inline/inline_transport_service.h"

#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_read_stream.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/inline/inline_write_stream.h"

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

grpc::ServerReadReactor<grpc::ByteBuffer>* InlineTransportService::WriteRegion(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "WriteRegion");
      !denied.ok()) {
    return FailedWriteRegionStream(denied);
  }
  return StartWriteRegionStream(transport_, response);
}

grpc::Status InlineTransportService::SendMessage(
    grpc::ServerContext* ctx, const v1::TransportMessage* req,
    v1::TransportMessageResponse* resp) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "SendMessage");
      !denied.ok()) {
    return denied;
  }
  if (req->call()) {
    // A call without a deadline still gets one.
    const auto until = ctx->deadline();
    const absl::Time deadline =
        until == std::chrono::system_clock::time_point::max()
            ? absl::Now() + absl::Minutes(10)
            : absl::FromChrono(until);
    absl::StatusOr<std::string> answer =
        transport_->Answer(req->id(), req->header(), deadline);
    if (!answer.ok()) return ToGrpcStatus(answer.status());
    resp->set_reply(std::move(*answer));
    return grpc::Status::OK;
  }
  return ToGrpcStatus(
      transport_->Deliver(req->id(), req->header(), req->payload()));
}

}  // namespace zshard
