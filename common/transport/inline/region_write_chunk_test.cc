// RegionWriteChunk: what the inline transport's client sends as WriteRegion
// messages parses as v1::WriteRegionChunk, and its data buffers are reused.
#include "common/transport/inline/region_write_chunk.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

v1::WriteRegionChunk Parse(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string wire;
  for (const auto& s : slices)
    wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  v1::WriteRegionChunk m;
  EXPECT_TRUE(m.ParseFromString(wire));
  return m;
}

// `chunk` through the client's serializer and back through protobuf's parser.
v1::WriteRegionChunk RoundTrip(const RegionWriteChunk& chunk) {
  grpc::ByteBuffer buffer;
  bool own = false;
  EXPECT_TRUE((grpc::SerializationTraits<RegionWriteChunk>::Serialize(
                   chunk, &buffer, &own)
                   .ok()));
  return Parse(buffer);
}

TEST(RegionWriteChunkTest, SerializesAsWriteRegionChunk) {
  auto pool = SendBufferPool::Create(1 << 20);
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>(i * 13 + 1);
  struct Case {
    uint64_t region, offset;
    std::string key;
    size_t bytes;
  };
  for (const Case& c :
       {Case{0x0102030405060708ull, 0, std::string(16, '\xfe'), data.size()},
        Case{1, 1ull << 40, "", 1}, Case{0, 0, "k", 0},
        Case{~0ull, ~0ull, std::string(200, 'k'), 127}}) {
    RegionWriteChunk chunk;
    chunk.region = c.region;
    chunk.key = c.key;
    chunk.offset = c.offset;
    chunk.data = pool->Copy(data.data(), c.bytes);
    const v1::WriteRegionChunk m = RoundTrip(chunk);
    EXPECT_EQ(m.region(), c.region);
    EXPECT_EQ(m.key(), c.key);
    EXPECT_EQ(m.offset(), c.offset);
    EXPECT_EQ(m.data(), data.substr(0, c.bytes));
    EXPECT_FALSE(m.call());
  }
}

// A last chunk's call (PutThenCall) travels after its data.
TEST(RegionWriteChunkTest, SerializesTheCallOfTheLastChunk) {
  auto pool = SendBufferPool::Create(4096);
  for (size_t bytes : {size_t{0}, size_t{100}}) {
    for (uint32_t id : {0u, 7u, 255u}) {
      RegionWriteChunk chunk;
      chunk.region = 9;
      chunk.key = "key";
      chunk.offset = 4;
      chunk.data = pool->Copy(std::string(bytes, 'd').data(), bytes);
      chunk.call = true;
      chunk.call_id = id;
      chunk.call_header = std::string(300, 'h') + '\0' + "end";
      const v1::WriteRegionChunk m = RoundTrip(chunk);
      EXPECT_EQ(m.region(), 9u);
      EXPECT_EQ(m.data(), std::string(bytes, 'd'));
      EXPECT_TRUE(m.call());
      EXPECT_EQ(m.call_id(), id);
      EXPECT_EQ(m.call_header(), chunk.call_header);
    }
  }
}

// A buffer goes back to the pool when the last slice over it is dropped, even
// after the pool's owner let go of the pool; at most `keep` stay.
TEST(RegionWriteChunkTest, BuffersReturnToThePoolWhenGrpcDropsThem) {
  auto pool = SendBufferPool::Create(4096, /*keep=*/2);
  const char bytes[4] = {1, 2, 3, 4};
  grpc::Slice a = pool->Copy(bytes, 4);
  const uint8_t* a_memory = a.begin();
  EXPECT_EQ(pool->free_buffers(), 0u);
  {
    grpc::Slice copy = a;  // another reference: not back yet
  }
  EXPECT_EQ(pool->free_buffers(), 0u);
  a = grpc::Slice();
  EXPECT_EQ(pool->free_buffers(), 1u);
  grpc::Slice b = pool->Copy(bytes, 3);
  EXPECT_EQ(b.begin(), a_memory);  // reused
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.begin()), b.size()),
            "\x01\x02\x03");
  grpc::Slice c = pool->Copy(bytes, 4), d = pool->Copy(bytes, 4);
  std::weak_ptr<SendBufferPool> weak = pool;
  pool.reset();  // the slices keep it
  ASSERT_FALSE(weak.expired());
  b = c = grpc::Slice();
  EXPECT_EQ(weak.lock()->free_buffers(), 2u);
  d = grpc::Slice();  // a third one is freed, not kept; the pool goes with it
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace zshard
