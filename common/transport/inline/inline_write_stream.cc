#include "common/transport/inline/inline_write_stream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/grpc_status.h"
#include "common/transport/inline/inline_transport.h"
#include "common/transport/inline/message_cursor.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

// A call's header may be as large as a SendMessage's (it is copied once).
constexpr uint64_t kMaxCallHeaderBytes = 1 << 20;

// A v1::WriteRegionChunk's fields; its data stays in the received slices.
struct ChunkFields {
  uint64_t region = 0;
  std::string key;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::optional<MessageCursor> data;  // where the data field's bytes begin
  bool call = false;
  uint64_t call_id = 0;
  std::string call_header;
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
    } else if (field == 5 && wire == 0) {
      ok = in.Varint(&n);
      f->call = n != 0;
    } else if (field == 6 && wire == 0) {
      ok = in.Varint(&f->call_id);
    } else if ((field == 2 || field == 4 || field == 7) && wire == 2) {
      if (!in.Varint(&n)) return Malformed("truncated length");
      if (field == 2) {
        if (n > 1024) return Malformed(absl::StrCat("a key of ", n, " bytes"));
        f->key.resize(n);
        ok = in.Copy(f->key.data(), n);
      } else if (field == 7) {
        if (n > kMaxCallHeaderBytes) {
          return Malformed(absl::StrCat("a call header of ", n,
                                        " bytes (at most ", kMaxCallHeaderBytes,
                                        ")"));
        }
        f->call_header.resize(n);
        ok = in.Copy(f->call_header.data(), n);
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
// at a time. A stream whose last chunk carries a call finishes with the
// call's answer, which may come on any thread, or with the caller's
// cancellation, whichever is first; a caller that gave up before the last
// chunk was read gets no call made.
class WriteStream : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteStream(InlineTransport* transport, bool has_deadline,
              grpc::ByteBuffer* response)
      : transport_(transport),
        has_deadline_(has_deadline),
        response_(response),
        waiting_(std::make_shared<Waiting>()) {
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

  void OnCancel() override {
    {
      absl::MutexLock lock(&waiting_->mu);
      waiting_->cancelled = true;
    }
    Answered(*waiting_, absl::CancelledError("the caller gave up"));
  }
  void OnDone() override { delete this; }

 private:
  // The stream while it waits for its call's answer; outlives it for an
  // answer that comes after the stream finished.
  struct Waiting {
    absl::Mutex mu;
    WriteStream* stream ABSL_GUARDED_BY(mu) = nullptr;
    bool cancelled ABSL_GUARDED_BY(mu) = false;  // the caller gave up
  };

  // Finishes the stream that waits in `waiting` (if any still does) with
  // `answer`.
  static void Answered(Waiting& waiting, absl::StatusOr<std::string> answer) {
    WriteStream* s;
    {
      absl::MutexLock lock(&waiting.mu);
      s = waiting.stream;
      waiting.stream = nullptr;
    }
    if (!s) return;
    if (!answer.ok()) {
      s->Finish(ToGrpcStatus(answer.status()));
      return;
    }
    s->Respond(std::move(*answer));
  }

  void Respond(std::string reply) {
    v1::WriteRegionResponse resp;
    resp.set_bytes_written(bytes_);
    resp.set_reply(std::move(reply));
    grpc::Slice slice(resp.SerializeAsString());
    *response_ = grpc::ByteBuffer(&slice, 1);
    Finish(grpc::Status::OK);
  }

  absl::Status Apply() {
    std::vector<grpc::Slice> slices;
    if (message_.Valid() && !message_.Dump(&slices).ok()) {
      return Malformed("unreadable buffer");
    }
    message_.Clear();
    ChunkFields f;
    if (absl::Status st = ParseChunk(slices, &f); !st.ok()) return st;
    if (call_) {
      return absl::InvalidArgumentError(
          "WriteRegion: a chunk came after the one that carried the call");
    }
    if (f.call && f.call_id > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteRegion: call id ", f.call_id, " > 255"));
    }
    if (f.call && !has_deadline_) {
      return absl::InvalidArgumentError(
          "WriteRegion: a transport call needs a deadline");
    }
    MessageCursor data = f.data.value_or(MessageCursor(&slices));
    absl::Status st = transport_->ServeWrite(
        f.region, f.key, f.offset, f.size,
        [&data, &f](char* dest) { (void)data.Copy(dest, f.size); });
    if (!st.ok()) return st;
    ++chunks_;
    bytes_ += f.size;
    if (f.call) {
      call_ = true;
      call_id_ = static_cast<uint32_t>(f.call_id);
      call_header_ = std::move(f.call_header);
    }
    return absl::OkStatus();
  }

  void End() {
    if (chunks_ == 0) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "WriteRegion: the stream ended without a chunk"));
      return;
    }
    if (!call_) {
      Respond("");
      return;
    }
    transport_->CountWriteRegionCall();
    bool cancelled;
    {
      absl::MutexLock lock(&waiting_->mu);
      cancelled = waiting_->cancelled;
      if (!cancelled) waiting_->stream = this;
    }
    if (cancelled) {  // no call for a caller that gave up
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller gave up"));
      return;
    }
    absl::Status st = transport_->Answer(
        call_id_, call_header_,
        [waiting = waiting_](absl::StatusOr<std::string> answer) {
          Answered(*waiting, std::move(answer));
        });
    if (!st.ok()) Answered(*waiting_, st);
  }

  InlineTransport* const transport_;
  const bool has_deadline_;
  grpc::ByteBuffer* const response_;
  const std::shared_ptr<Waiting> waiting_;
  grpc::ByteBuffer message_;
  uint64_t chunks_ = 0, bytes_ = 0;
  bool call_ = false;  // the last chunk carried a call
  uint32_t call_id_ = 0;
  std::string call_header_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* FailedWriteRegionStream(
    const grpc::Status& status) {
  return new FailedWrite(status);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StartWriteRegionStream(
    InlineTransport* transport, bool has_deadline, grpc::ByteBuffer* response) {
  if (!transport) {
    return new FailedWrite(ToGrpcStatus(absl::FailedPreconditionError(
        "this shard's data plane is not the inline one")));
  }
  return new WriteStream(transport, has_deadline, response);
}

}  // namespace zshard
