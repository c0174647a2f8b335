#include "common/transport/inline/region_bytes_sink.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

// Reads bytes across a message's slices.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    Skip();
  }

  bool AtEnd() const { return slice_ == slices_.size(); }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (AtEnd()) return false;
      const uint8_t b = slices_[slice_].begin()[offset_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }

  // Copies `n` bytes to `out`; false if the message ends first.
  bool Copy(char* out, size_t n) {
    while (n > 0) {
      if (AtEnd()) return false;
      const size_t here = std::min(n, slices_[slice_].size() - offset_);
      std::memcpy(out, slices_[slice_].begin() + offset_, here);
      out += here;
      n -= here;
      Advance(here);
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    Skip();
  }
  // Moves past exhausted (and empty) slices.
  void Skip() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("a ReadRegion reply is malformed: ", what));
}

}  // namespace

absl::Status AppendRegionBytes(grpc::ByteBuffer* message,
                               RegionBytesSink* sink) {
  std::vector<grpc::Slice> slices;
  if (message->Valid() && !message->Dump(&slices).ok())
    return Malformed("unreadable buffer");
  message->Clear();
  Cursor in(slices);
  if (in.AtEnd()) return absl::OkStatus();  // RegionBytes{data = ""}
  uint64_t tag = 0, length = 0;
  if (!in.Varint(&tag) || tag != ((1 << 3) | 2)) {
    return Malformed(
        absl::StrCat("field tag ", tag, " where only data (field 1) belongs"));
  }
  if (!in.Varint(&length)) return Malformed("truncated length");
  if (length > sink->capacity - sink->received) {
    return absl::DataLossError(absl::StrCat(
        "a ReadRegion reply carries ", length, " bytes beyond the ",
        sink->capacity - sink->received, " still expected"));
  }
  if (!in.Copy(sink->dest + sink->received, length)) {
    return Malformed(absl::StrCat("shorter than its length ", length));
  }
  if (!in.AtEnd()) return Malformed("bytes after the data field");
  sink->received += length;
  return absl::OkStatus();
}

}  // namespace zshard

namespace grpc {

Status SerializationTraits<zshard::RegionBytesSink, void>::Deserialize(
    ByteBuffer* buffer, zshard::RegionBytesSink* sink) {
  absl::Status st = zshard::AppendRegionBytes(buffer, sink);
  if (st.ok()) return Status::OK;
  if (sink->error.ok()) sink->error = st;
  return Status(StatusCode::DATA_LOSS, std::string(st.message()));
}

}  // namespace grpc
