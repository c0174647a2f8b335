#include "common/transport/inline/region_write_chunk.h"

#include <cstring>
#include <utility>

namespace zshard {

struct SendBufferPool::Loan {
  std::shared_ptr<SendBufferPool> pool;
  std::unique_ptr<char[]> buffer;
};

std::shared_ptr<SendBufferPool> SendBufferPool::Create(size_t buffer_bytes,
                                                       size_t keep) {
  return std::shared_ptr<SendBufferPool>(
      new SendBufferPool(buffer_bytes, keep));
}

grpc::Slice SendBufferPool::Copy(const void* data, size_t n) {
  auto loan = std::make_unique<Loan>();
  loan->pool = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      loan->buffer = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!loan->buffer) loan->buffer.reset(new char[buffer_bytes_]);
  char* bytes = loan->buffer.get();
  if (n > 0) std::memcpy(bytes, data, n);
  return grpc::Slice(bytes, n, &SendBufferPool::Return, loan.release());
}

void SendBufferPool::Return(void* loan_ptr) {
  std::unique_ptr<Loan> loan(static_cast<Loan*>(loan_ptr));
  SendBufferPool& pool = *loan->pool;
  absl::MutexLock lock(&pool.mu_);
  if (pool.free_.size() < pool.keep_)
    pool.free_.push_back(std::move(loan->buffer));
}

size_t SendBufferPool::free_buffers() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace zshard

namespace grpc {
namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

}  // namespace

Status SerializationTraits<zshard::RegionWriteChunk, void>::Serialize(
    const zshard::RegionWriteChunk& chunk, ByteBuffer* buffer,
    bool* own_buffer) {
  // v1::WriteRegionChunk: region = 1 (fixed64), key = 2, offset = 3, data = 4,
  // call = 5, call_id = 6, call_header = 7.
  std::string head;
  head.push_back((1 << 3) | 1);
  for (int i = 0; i < 8; ++i)
    head.push_back(static_cast<char>(chunk.region >> (8 * i)));
  head.push_back((2 << 3) | 2);
  PutVarint(chunk.key.size(), &head);
  head += chunk.key;
  head.push_back(3 << 3);
  PutVarint(chunk.offset, &head);
  head.push_back((4 << 3) | 2);
  PutVarint(chunk.data.size(), &head);
  if (!chunk.call) {
    Slice slices[2] = {Slice(head), chunk.data};
    *buffer = ByteBuffer(slices, 2);
    *own_buffer = true;
    return Status::OK;
  }
  std::string tail;
  tail.push_back(5 << 3);
  tail.push_back(1);
  tail.push_back(6 << 3);
  PutVarint(chunk.call_id, &tail);
  tail.push_back((7 << 3) | 2);
  PutVarint(chunk.call_header.size(), &tail);
  tail += chunk.call_header;
  Slice slices[3] = {Slice(head), chunk.data, Slice(tail)};
  *buffer = ByteBuffer(slices, 3);
  *own_buffer = true;
  return Status::OK;
}

}  // namespace grpc
