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
    v1::WriteRegionResponse* resp) {
  if (grpc::Status denied = transport_->security().auth->Check(
          *ctx, RpcRole::kTrainer, "WriteRegion");
      !denied.ok()) {
    return denied;
  }
  // A chunk that does not parse ends the stream as its end would (the sync
  // API cannot tell them apart): a stream without one chunk is refused, and
  // the writer compares bytes_written with what it sent.
  v1::WriteRegionChunk chunk;
  uint64_t chunks = 0, bytes = 0;
  while (reader->Read(&chunk)) {
    absl::Status st = transport_->ServeWrite(chunk.region(), chunk.key(),
                                             chunk.offset(), chunk.data());
    if (!st.ok()) return ToGrpcStatus(st);
    ++chunks;
    bytes += chunk.data().size();
  }
  if (chunks == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "WriteRegion: no chunk arrived, or the first did not "
                        "parse as a WriteRegionChunk");
  }
  resp->set_bytes_written(bytes);
  return grpc::Status::OK;
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
