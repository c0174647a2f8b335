#include "common/transport/inline/message_cursor.h"

#include <algorithm>
#include <cstring>

namespace zshard {

MessageCursor::MessageCursor(const std::vector<grpc::Slice>* slices)
    : slices_(slices) {
  Advance(0);
}

bool MessageCursor::Varint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (AtEnd()) return false;
    const uint8_t b = (*slices_)[slice_].begin()[offset_];
    Advance(1);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

bool MessageCursor::Fixed64(uint64_t* v) {
  uint8_t b[8];
  if (!Copy(b, 8)) return false;
  *v = 0;
  for (int i = 7; i >= 0; --i) *v = (*v << 8) | b[i];
  return true;
}

bool MessageCursor::Copy(void* out, size_t n) {
  char* to = static_cast<char*>(out);
  while (n > 0) {
    if (AtEnd()) return false;
    const grpc::Slice& s = (*slices_)[slice_];
    const size_t here = std::min(n, s.size() - offset_);
    std::memcpy(to, s.begin() + offset_, here);
    to += here;
    n -= here;
    Advance(here);
  }
  return true;
}

bool MessageCursor::Skip(size_t n) {
  while (n > 0) {
    if (AtEnd()) return false;
    const size_t here = std::min(n, (*slices_)[slice_].size() - offset_);
    n -= here;
    Advance(here);
  }
  return true;
}

bool MessageCursor::SkipField(uint64_t wire_type) {
  uint64_t v = 0;
  switch (wire_type) {
    case 0:
      return Varint(&v);
    case 1:
      return Skip(8);
    case 2:
      return Varint(&v) && Skip(v);
    case 5:
      return Skip(4);
    default:
      return false;
  }
}

void MessageCursor::Advance(size_t n) {
  offset_ += n;
  // Past exhausted (and empty) slices.
  while (slice_ < slices_->size() && offset_ == (*slices_)[slice_].size()) {
    ++slice_;
    offset_ = 0;
  }
}

}  // namespace zshard
