// RegionBytesSink: the inline transport's receiving end parses RegionBytes
// messages however gRPC slices them, and refuses anything else.
#include "common/transport/inline/region_bytes_sink.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "zshard/v1/inline_transport.pb.h"

namespace zshard {
namespace {

// `wire` cut into slices at `cuts` (offsets, ascending).
grpc::ByteBuffer Sliced(const std::string& wire,
                        const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(wire.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(wire.data() + from, wire.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Wire(const std::string& data) {
  v1::RegionBytes m;
  m.set_data(data);
  return m.SerializeAsString();
}

TEST(RegionBytesSinkTest, MessagesLandBackToBackHoweverSliced) {
  const std::string a(300, 'a');  // a two-byte length
  std::string b(70000, '\0');     // a three-byte length
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 7);
  std::string out(a.size() + b.size() + 1, '#');
  RegionBytesSink sink;
  sink.spans = {{out.data(), a.size() + b.size()}};
  // Cut inside the tag/length header, between header and data, inside data.
  grpc::ByteBuffer first = Sliced(Wire(a), {1, 2, 3, 100});
  ASSERT_TRUE(AppendRegionBytes(&first, &sink).ok());
  grpc::ByteBuffer second = Sliced(Wire(b), {2, 4, 4, 50000});
  ASSERT_TRUE(AppendRegionBytes(&second, &sink).ok());
  EXPECT_EQ(sink.received, a.size() + b.size());
  EXPECT_EQ(out, a + b + "#");
  // An empty message (as protobuf writes RegionBytes{data = ""}) adds nothing.
  grpc::ByteBuffer empty = Sliced("", {});
  ASSERT_TRUE(AppendRegionBytes(&empty, &sink).ok());
  EXPECT_EQ(sink.received, a.size() + b.size());
}

// A GetMany's ranges: one message may fill the end of a span, skip empty
// ones and start the next.
TEST(RegionBytesSinkTest, MessagesFillTheSpansInOrderAcrossTheirBoundaries) {
  std::string x(5, '#'), y(3, '#'), z(9, '#');
  RegionBytesSink sink;
  sink.spans = {{x.data(), 4}, {nullptr, 0}, {y.data(), 2}, {z.data(), 8}};
  EXPECT_EQ(sink.capacity(), 14u);
  for (const std::string& data : {std::string("abc"), std::string("defgh"),
                                  std::string(""), std::string("ijklmn")}) {
    grpc::ByteBuffer b = Sliced(Wire(data), {});
    ASSERT_TRUE(AppendRegionBytes(&b, &sink).ok()) << data;
  }
  EXPECT_EQ(sink.received, 14u);
  EXPECT_EQ(sink.messages, 4u);
  EXPECT_EQ(x, "abcd#");
  EXPECT_EQ(y, "ef#");
  EXPECT_EQ(z, "ghijklmn#");
  grpc::ByteBuffer more = Sliced(Wire("o"), {});
  EXPECT_EQ(AppendRegionBytes(&more, &sink).code(),
            absl::StatusCode::kDataLoss);
}

TEST(RegionBytesSinkTest, MalformedOrOversizedMessagesAreDataLoss) {
  std::string out(64, '#');
  const std::string good = Wire("0123456789");
  struct Case {
    std::string wire;
    const char* what;
  };
  const std::vector<Case> cases = {
      {std::string("\x12\x02hi", 4), "field tag 18"},  // field 2
      {std::string("\x0a", 1), "truncated length"},    // no length
      {std::string("\x0a\x0a"
                   "01234",
                   7),
       "shorter than its length"},
      {good + "x", "bytes after the data field"},
      {std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11),
       "beyond"},
      {Wire(std::string(65, 'z')), "beyond the 64 still expected"},
  };
  for (const Case& c : cases) {
    RegionBytesSink sink;
    sink.spans = {{out.data(), out.size()}};
    grpc::ByteBuffer buf = Sliced(c.wire, {});
    absl::Status st = AppendRegionBytes(&buf, &sink);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.what;
    EXPECT_NE(st.message().find(c.what), std::string::npos) << st;
    EXPECT_EQ(sink.received, 0u);
  }
  // Through gRPC's traits: the first failure is kept in the sink.
  RegionBytesSink sink;
  sink.spans = {{out.data(), 4}};
  grpc::ByteBuffer buf = Sliced(good, {});
  EXPECT_FALSE(
      (grpc::SerializationTraits<RegionBytesSink>::Deserialize(&buf, &sink)
           .ok()));
  EXPECT_EQ(sink.error.code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace zshard
