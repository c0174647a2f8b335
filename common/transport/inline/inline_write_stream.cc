#include "common/transport/inline/inline_write_stream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/inline/message_cursor.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

// A v1::WriteRegionChunk's fields; its data stays in the received slices.
struct ChunkFields {
  uint64_t region = 0;
  std::string key;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::optional<MessageCursor> data;  // where the data field's bytes begin
};

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("a WriteRegion chunk does not parse: ", what));
}

// Reads the fields of one chunk in any order (a repeated field's last value
// counts, as protobuf's parser does); unknown fields are skipped.
absl::Status ParseChunk(const std::vector<grpc::Slice>& slices,
                        ChunkFields* f) {
  MessageCursor in(&slices);
  while (!in.AtEnd()) {
    uint64_t tag = 0, n = 0;
    if (!in.Varint(&tag)) return Malformed("truncated field tag");
    const uint64_t field = tag >> 3, wire = tag & 7;
    bool ok = true;
    if (field == 1 && wire == 1) {
      ok = in.Fixed64(&f->region);
    } else if (field == 3 && wire == 0) {
      ok = in.Varint(&f->offset);
    } else if ((field == 2 || field == 4) && wire == 2) {
      if (!in.Varint(&n)) return Malformed("truncated length");
      if (field == 2) {
        if (n > 1024) return Malformed(absl::StrCat("a key of ", n, " bytes"));
        f->key.resize(n);
        ok = in.Copy(f->key.data(), n);
      } else {
        f->data = in;
        f->size = n;
        ok = in.Skip(n);
      }
    } else if (field == 0) {
      return Malformed("field number 0");
    } else {
      ok = in.SkipField(wire);
    }
    if (!ok) {
      return Malformed(absl::StrCat("field ", field, " (wire type ", wire,
                                    ") runs past the message's end"));
    }
  }
  return absl::OkStatus();
}

class FailedWrite : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit FailedWrite(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Reads one chunk at a time; gRPC calls OnReadDone on its own threads, one
// at a time.
class WriteStream : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteStream(InlineTransport* transport, grpc::ByteBuffer* response)
      : transport_(transport), response_(response) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the writer's WritesDone, or the call's end
      End();
      return;
    }
    if (absl::Status st = Apply(); !st.ok()) {
      Finish(ToGrpcStatus(st));
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Apply() {
    std::vector<grpc::Slice> slices;
    if (message_.Valid() && !message_.Dump(&slices).ok()) {
      return Malformed("unreadable buffer");
    }
    message_.Clear();
    ChunkFields f;
    if (absl::Status st = ParseChunk(slices, &f); !st.ok()) return st;
    MessageCursor data = f.data.value_or(MessageCursor(&slices));
    absl::Status st = transport_->ServeWrite(
        f.region, f.key, f.offset, f.size,
        [&data, &f](char* dest) { (void)data.Copy(dest, f.size); });
    if (!st.ok()) return st;
    ++chunks_;
    bytes_ += f.size;
    return absl::OkStatus();
  }

  void End() {
    if (chunks_ == 0) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "WriteRegion: the stream ended without a chunk"));
      return;
    }
    v1::WriteRegionResponse resp;
    resp.set_bytes_written(bytes_);
    grpc::Slice slice(resp.SerializeAsString());
    *response_ = grpc::ByteBuffer(&slice, 1);
    Finish(grpc::Status::OK);
  }

  InlineTransport* const transport_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
  uint64_t chunks_ = 0, bytes_ = 0;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* FailedWriteRegionStream(
    const grpc::Status& status) {
  return new FailedWrite(status);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StartWriteRegionStream(
    InlineTransport* transport, grpc::ByteBuffer* response) {
  if (!transport) {
    return new FailedWrite(ToGrpcStatus(absl::FailedPreconditionError(
        "this shard's data plane is not the inline one")));
  }
  return new WriteStream(transport, response);
}

}  // namespace zshard
