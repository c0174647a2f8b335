#include "common/transport/inline/inline_read_stream.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_transport.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

using Pin = InlineTransport::Pin;

// Releases one reference to a pin when gRPC drops a slice over its bytes.
void DropPinRef(void* user_data) {
  delete static_cast<std::shared_ptr<const Pin>*>(user_data);
}

// A call finished at once with `status`.
class FailedRead : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedRead(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Writes one message at a time; gRPC calls OnWriteDone on its own threads.
class ReadStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadStream(std::shared_ptr<const Pin> pin, size_t chunk_bytes)
      : pin_(std::move(pin)), chunk_bytes_(chunk_bytes) {
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reader went away"));
      return;
    }
    if (sent_ == pin_->size()) {
      Finish(grpc::Status::OK);
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  // RegionBytes{data = bytes [sent_, sent_ + n)}: the field's tag and length
  // in a small slice, the bytes themselves in a slice over the region.
  void WriteNext() {
    const size_t n = std::min(chunk_bytes_, pin_->size() - sent_);
    uint8_t header[1 + 10];
    size_t h = 0;
    header[h++] = (1 << 3) | 2;  // field 1, length-delimited
    for (uint64_t v = n;; v >>= 7) {
      if (v < 0x80) {
        header[h++] = static_cast<uint8_t>(v);
        break;
      }
      header[h++] = static_cast<uint8_t>(v | 0x80);
    }
    grpc::Slice slices[2] = {
        grpc::Slice(header, h),
        grpc::Slice(const_cast<char*>(pin_->data() + sent_), n, &DropPinRef,
                    new std::shared_ptr<const Pin>(pin_)),
    };
    message_ = grpc::ByteBuffer(slices, n > 0 ? 2 : 1);
    sent_ += n;
    StartWrite(&message_);
  }

  const std::shared_ptr<const Pin> pin_;
  const size_t chunk_bytes_;
  size_t sent_ = 0;
  grpc::ByteBuffer message_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* FailedReadRegionStream(
    const grpc::Status& status) {
  return new FailedRead(status);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartReadRegionStream(
    InlineTransport* transport, const grpc::ByteBuffer& request,
    size_t chunk_bytes) {
  if (!transport) {
    return new FailedRead(ToGrpcStatus(absl::FailedPreconditionError(
        "this shard's data plane is not the inline one")));
  }
  v1::ReadRegionRequest req;
  grpc::ByteBuffer copy(request);  // Deserialize consumes its buffer
  if (!grpc::SerializationTraits<v1::ReadRegionRequest>::Deserialize(&copy,
                                                                     &req)
           .ok()) {
    return new FailedRead(ToGrpcStatus(
        absl::InvalidArgumentError("ReadRegion: the request does not parse")));
  }
  auto pin =
      transport->PinRange(req.region(), req.key(), req.offset(), req.size());
  if (!pin.ok()) return new FailedRead(ToGrpcStatus(pin.status()));
  return new ReadStream(std::move(*pin), std::max<size_t>(1, chunk_bytes));
}

}  // namespace zshard
