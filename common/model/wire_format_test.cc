#include "common/model/wire_format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(WireFormatTest, BytesAndNamesOfEachFormat) {
  EXPECT_EQ(WireFormat::Fp32().Bytes(10), 40u);
  EXPECT_EQ(WireFormat::Bf16().Bytes(10), 20u);
  const WireFormat int8 = WireFormat::Quantized(WireFormat::Kind::kInt8, 64);
  EXPECT_EQ(int8.Bytes(0), 0u);
  EXPECT_EQ(int8.Bytes(1), 4u + 4u);    // one code padded to 4, one scale
  EXPECT_EQ(int8.Bytes(64), 64u + 4u);  // one block
  EXPECT_EQ(int8.Bytes(65), 68u + 8u);  // two blocks
  EXPECT_EQ(int8.Bytes(1 << 20), (1u << 20) + 4u * (1u << 14));
  EXPECT_STREQ(int8.name(), "int8");
  EXPECT_EQ(int8.dtype(), v1::INT8_BLOCKS);
  EXPECT_EQ(WireFormat::Quantized(WireFormat::Kind::kFp8, 64).dtype(),
            v1::FP8_E4M3_BLOCKS);
  for (v1::DType d :
       {v1::FLOAT32, v1::BFLOAT16, v1::INT8_BLOCKS, v1::FP8_E4M3_BLOCKS}) {
    auto kind = WireKindOf(d);
    ASSERT_TRUE(kind.ok());
    EXPECT_EQ(WireFormat::Quantized(*kind, 64).dtype(), d);
  }
  auto fp16 = WireKindOf(v1::FLOAT16);
  EXPECT_EQ(fp16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fp16.status().message().find("FLOAT16"), std::string::npos);
  EXPECT_EQ(WireKindOf(static_cast<v1::DType>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Packing and unpacking agree with the kernels' own block-wise contract:
// every value within half a quantization step of its block's scale, zeros
// exact, padding zero; the last block shorter.
TEST(WireFormatTest, PackedRunsUnpackWithinHalfAStep) {
  auto kernels = kernels::CpuKernels::Create();
  ASSERT_TRUE(kernels.ok());
  for (auto kind : {WireFormat::Kind::kInt8, WireFormat::Kind::kFp8}) {
    const WireFormat f = WireFormat::Quantized(kind, 64);
    const size_t n = 64 * 3 + 5;
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i)
      in[i] = (i % 7 == 0) ? 0.0f : std::sin(0.37f * i) * (1 + i / 64);
    std::vector<char> wire(f.Bytes(n), 'x');
    ASSERT_TRUE(PackQuantized(**kernels, f, in.data(), n, wire.data()).ok());
    for (size_t i = n; i < (n + 3) / 4 * 4; ++i) EXPECT_EQ(wire[i], 0);
    std::vector<float> out(n);
    ASSERT_TRUE(UnpackQuantized(**kernels, f, wire.data(), n, out.data()).ok());
    for (size_t b = 0; b * 64 < n; ++b) {
      float amax = 0;
      for (size_t i = b * 64; i < std::min(n, b * 64 + 64); ++i)
        amax = std::max(amax, std::fabs(in[i]));
      // int8: a step is amax/127; fp8 e4m3 has 3 mantissa bits: half a
      // step is at most 1/16 of the value (or of 2^-6 * scale below).
      for (size_t i = b * 64; i < std::min(n, b * 64 + 64); ++i) {
        const float tol =
            kind == WireFormat::Kind::kInt8
                ? amax / 127 * 0.5001f
                : std::max(std::fabs(in[i]) / 16, amax / 448 * 0.002f) * 1.001f;
        EXPECT_NEAR(out[i], in[i], tol) << f.name() << " element " << i;
        if (in[i] == 0) {
          EXPECT_EQ(out[i], 0.0f);
        }
      }
    }
  }
}

TEST(WireFormatTest, NonFiniteValuesAndPlainFormatsAreRefused) {
  auto kernels = kernels::CpuKernels::Create();
  ASSERT_TRUE(kernels.ok());
  const WireFormat f = WireFormat::Quantized(WireFormat::Kind::kInt8, 64);
  std::vector<float> in(130, 1.0f);
  in[100] = std::numeric_limits<float>::quiet_NaN();
  std::vector<char> wire(f.Bytes(in.size()));
  absl::Status st =
      PackQuantized(**kernels, f, in.data(), in.size(), wire.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 1"), std::string::npos) << st;
  std::vector<float> out(4);
  EXPECT_EQ(
      UnpackQuantized(**kernels, WireFormat::Bf16(), wire.data(), 4, out.data())
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zshard
