#include "common/transport/inline/inline_read_stream.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_transport.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

using Pin = InlineTransport::Pin;

// Ranges a ReadRegion may add to its first (ReadRegionRequest.more).
constexpr size_t kMaxMoreRanges = InlineTransport::kMaxReadRanges - 1;

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

// Writes one message at a time, the ranges in order (a message never holds
// bytes of two; the first message goes even when its range is empty, later
// empty ranges send nothing); gRPC calls OnWriteDone on its own threads.
class ReadStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadStream(std::vector<std::shared_ptr<const Pin>> pins, size_t chunk_bytes)
      : pins_(std::move(pins)), chunk_bytes_(chunk_bytes) {
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reader went away"));
      return;
    }
    while (range_ < pins_.size() && sent_ == pins_[range_]->size()) {
      ++range_;
      sent_ = 0;
    }
    if (range_ == pins_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  // RegionBytes{data = bytes [sent_, sent_ + n) of range range_}: the
  // field's tag and length in a small slice, the bytes themselves in a slice
  // over the region.
  void WriteNext() {
    const std::shared_ptr<const Pin>& pin = pins_[range_];
    const size_t n = std::min(chunk_bytes_, pin->size() - sent_);
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
        grpc::Slice(const_cast<char*>(pin->data() + sent_), n, &DropPinRef,
                    new std::shared_ptr<const Pin>(pin)),
    };
    message_ = grpc::ByteBuffer(slices, n > 0 ? 2 : 1);
    sent_ += n;
    StartWrite(&message_);
  }

  const std::vector<std::shared_ptr<const Pin>> pins_;
  const size_t chunk_bytes_;
  size_t range_ = 0;  // the range being sent
  size_t sent_ = 0;   // its bytes sent
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
  if (static_cast<size_t>(req.more_size()) > kMaxMoreRanges) {
    return new FailedRead(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("ReadRegion: ", req.more_size(),
                     " further ranges (at most ", kMaxMoreRanges, ")"))));
  }
  // Every range pinned before a byte goes.
  std::vector<std::shared_ptr<const Pin>> pins;
  pins.reserve(1 + req.more_size());
  auto pin =
      transport->PinRange(req.region(), req.key(), req.offset(), req.size());
  if (!pin.ok()) return new FailedRead(ToGrpcStatus(pin.status()));
  pins.push_back(std::move(*pin));
  for (const v1::RegionRange& r : req.more()) {
    pin = transport->PinRange(r.region(), r.key(), r.offset(), r.size());
    if (!pin.ok()) return new FailedRead(ToGrpcStatus(pin.status()));
    pins.push_back(std::move(*pin));
  }
  return new ReadStream(std::move(pins), std::max<size_t>(1, chunk_bytes));
}

}  // namespace zshard
