// MessageCursor: reads a serialized protobuf message across the slices gRPC
// received it in, without joining them, so the inline transport's data
// fields go from gRPC's buffers straight to their destination.
#ifndef ZSHARD_COMMON_TRANSPORT_INLINE_MESSAGE_CURSOR_H_
#define ZSHARD_COMMON_TRANSPORT_INLINE_MESSAGE_CURSOR_H_

#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zshard {

// A position in `slices` (not owned; they outlive the cursor). Copyable: a
// copy is a saved position. Every read returns false, having consumed an
// unspecified part, when the message ends first.
class MessageCursor {
 public:
  explicit MessageCursor(const std::vector<grpc::Slice>* slices);

  bool AtEnd() const { return slice_ == slices_->size(); }
  // A base-128 varint of at most 10 bytes.
  bool Varint(uint64_t* v);
  // A little-endian fixed64.
  bool Fixed64(uint64_t* v);
  // Copies the next `n` bytes to `out`.
  bool Copy(void* out, size_t n);
  // Moves past the next `n` bytes.
  bool Skip(size_t n);
  // Moves past a field's value of wire type `wire_type` (0, 1, 2 or 5).
  bool SkipField(uint64_t wire_type);

 private:
  void Advance(size_t n);

  const std::vector<grpc::Slice>* slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_TRANSPORT_INLINE_MESSAGE_CURSOR_H_
