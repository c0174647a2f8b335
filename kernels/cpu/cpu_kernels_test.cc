// Every CPU variant (scalar, AVX2, AVX-512; those the CPU lacks are skipped)
// against the scalar reference, on 1 and 2 threads: conversions and
// quantization bit-exact, AdamW bit-exact (the documented bound is 0 ulp:
// no FMA contraction, IEEE sqrt and division), gradient check within 1e-12
// relative; sizes 0, 1, 7, 4097 and unaligned pointers.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "zshard/kernels/accumulate.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/kernels/grad_check.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

const size_t kSizes[] = {0, 1, 7, 64, 4097, 100003};

// Special fp32 bit patterns: signed zeros, Inf, quiet and signalling NaNs,
// fp32 subnormals, bf16/fp16 rounding ties, fp16 subnormal range, overflow.
std::vector<uint32_t> SpecialBits() {
  return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
          0xffc00000, 0x7f800001, 0xff800001, 0x7fa00000, 0x7fbfffff,
          0x00000001, 0x807fffff, 0x00400000, 0x3f808000, 0x3f818000,
          0x3f807fff, 0x3f808001, 0x3f801000, 0x3f803000, 0x3f801001,
          0x477fe000, 0x477fefff, 0x477ff000, 0x477fffff, 0x7f7fffff,
          0xff7fffff, 0x7f7f8000, 0x38800000, 0x387fffff, 0x38000000,
          0x33800000, 0x33000000, 0x33000001, 0x32ffffff, 0x33c00000,
          0x34000000, 0x38801000, 0xb8801000, 0x3c800000, 0x3c7fffff,
          0x43e00000, 0x43f00000, 0x3f800000, 0xbf800000};
}

std::vector<float> TestFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out(n);
  const auto special = SpecialBits();
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    if (i % 5 == 0) {
      bits = special[rng() % special.size()];
    } else if (i % 5 == 1) {
      bits = rng();  // any pattern
    } else {
      // Values near 1 with random low bits: many rounding cases.
      bits = 0x3f000000u + (rng() & 0x00ffffffu);
      if (rng() & 1) bits |= 0x80000000u;
    }
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
  return out;
}

std::vector<float> FiniteFloats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (i % 13 == 0) ? 0.0f : normal(rng);
  return out;
}

class CpuKernelsTest : public ::testing::TestWithParam<std::tuple<Isa, int>> {
 protected:
  void SetUp() override {
    if (!IsaSupported(std::get<0>(GetParam()))) {
      GTEST_SKIP() << IsaName(std::get<0>(GetParam())) << " not supported here";
    }
    CpuKernelsOptions o;
    o.isa = std::get<0>(GetParam());
    o.threads = std::get<1>(GetParam());
    o.min_parallel_elements = 1000;  // exercise the split on small inputs
    auto k = CpuKernels::Create(o);
    ASSERT_TRUE(k.ok()) << k.status();
    k_ = std::move(*k);
  }
  std::unique_ptr<CpuKernels> k_;
};

TEST_P(CpuKernelsTest, Fp32ToHalfIsBitExact) {
  for (size_t n : kSizes) {
    // One extra element so the data can start unaligned.
    std::vector<float> in = TestFloats(n + 1, static_cast<uint32_t>(n));
    std::vector<uint16_t> want(n + 1), got(n + 1);
    for (int unaligned = 0; unaligned < 2; ++unaligned) {
      const float* src = in.data() + unaligned;
      ASSERT_TRUE(ReferenceFp32ToBf16(src, want.data() + unaligned, n).ok());
      ASSERT_TRUE(k_->Fp32ToBf16(src, got.data() + unaligned, n).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i + unaligned], want[i + unaligned])
            << "bf16 of bits " << std::hex << FloatBits(src[i]);
      }
      ASSERT_TRUE(ReferenceFp32ToFp16(src, want.data() + unaligned, n).ok());
      ASSERT_TRUE(k_->Fp32ToFp16(src, got.data() + unaligned, n).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i + unaligned], want[i + unaligned])
            << "fp16 of bits " << std::hex << FloatBits(src[i]);
      }
    }
  }
}

TEST_P(CpuKernelsTest, HalfToFp32IsBitExactForEveryPattern) {
  std::vector<uint16_t> all(65536 + 1);
  for (uint32_t i = 0; i < 65536; ++i) all[i + 1] = static_cast<uint16_t>(i);
  std::vector<float> want(65536), got(65536);
  const uint16_t* src = all.data() + 1;  // unaligned on purpose
  ASSERT_TRUE(ReferenceBf16ToFp32(src, want.data(), 65536).ok());
  ASSERT_TRUE(k_->Bf16ToFp32(src, got.data(), 65536).ok());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * 65536), 0);
  ASSERT_TRUE(ReferenceFp16ToFp32(src, want.data(), 65536).ok());
  ASSERT_TRUE(k_->Fp16ToFp32(src, got.data(), 65536).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(FloatBits(got[i]), FloatBits(want[i])) << "fp16 bits " << std::hex << i;
  }
}

TEST(CastReferenceTest, KnownValues) {
  // Ties to even, overflow to Inf, quiet NaN, subnormals kept.
  EXPECT_EQ(Fp32ToBf16Bits(BitsFloat(0x3f808000)), 0x3f80);
  EXPECT_EQ(Fp32ToBf16Bits(BitsFloat(0x3f818000)), 0x3f82);
  EXPECT_EQ(Fp32ToBf16Bits(BitsFloat(0x7f7fffff)), 0x7f80);
  EXPECT_EQ(Fp32ToBf16Bits(BitsFloat(0x7f800001)), 0x7fc0);
  EXPECT_EQ(Fp32ToBf16Bits(BitsFloat(0x00010000)), 0x0001);
  EXPECT_EQ(Fp32ToFp16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16Bits(65520.0f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16Bits(1.0f + 1.0f / 2048), 0x3c00);  // tie, even
  EXPECT_EQ(Fp32ToFp16Bits(1.0f + 3.0f / 2048), 0x3c02);  // tie, odd -> up
  EXPECT_EQ(Fp32ToFp16Bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16Bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(Fp32ToFp16Bits(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(Fp32ToFp16Bits(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_TRUE(std::isnan(Fp16BitsToFp32(0x7c01)));
  EXPECT_EQ(Fp16BitsToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(E4M3BitsToFp32(0x7e), 448.0f);
  EXPECT_EQ(E4M3BitsToFp32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp32ToE4M3Bits(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(Fp32ToE4M3Bits(-0.0f), 0x80);
  EXPECT_EQ(Fp32ToE4M3Bits(std::ldexp(1.0f, -10)), 0x00);  // tie to even 0
  EXPECT_EQ(Fp32ToE4M3Bits(1.0625f), 0x38);  // 1 + 1/16: tie, even -> 1.0
  EXPECT_EQ(Fp32ToE4M3Bits(1.1875f), 0x3a);  // 1 + 3/16: tie, odd -> 1.25
}

TEST_P(CpuKernelsTest, AdamWIsBitExact) {
  for (HalfType half : {HalfType::kNone, HalfType::kBf16, HalfType::kFp16}) {
    for (size_t n : kSizes) {
      auto p0 = FiniteFloats(n + 1, 1, 0.1f), g = FiniteFloats(n + 1, 2, 1e-2f);
      auto m0 = FiniteFloats(n + 1, 3, 1e-3f), v0 = FiniteFloats(n + 1, 4, 1e-3f);
      for (float& x : v0) x = x * x;
      auto p1 = p0, m1 = m0, v1 = v0;
      std::vector<uint16_t> h0(n + 1, 0), h1(n + 1, 0);
      AdamWStep hp;
      hp.lr = 1e-3f;
      hp.step = 7;
      hp.grad_scale = 0.25f;
      hp.half_type = half;
      const int u = n % 2 ? 1 : 0;  // odd sizes also start unaligned
      ASSERT_TRUE(ReferenceAdamW(p0.data() + u, g.data() + u, m0.data() + u,
                                 v0.data() + u, n, hp, h0.data() + u)
                      .ok());
      ASSERT_TRUE(k_->AdamW(p1.data() + u, g.data() + u, m1.data() + u,
                            v1.data() + u, n, hp, h1.data() + u)
                      .ok());
      ASSERT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * 4), 0) << n;
      ASSERT_EQ(std::memcmp(m0.data(), m1.data(), m0.size() * 4), 0) << n;
      ASSERT_EQ(std::memcmp(v0.data(), v1.data(), v0.size() * 4), 0) << n;
      ASSERT_EQ(h0, h1) << n;
      if (half == HalfType::kBf16 && n > 0) {
        EXPECT_EQ(h1[u], Fp32ToBf16Bits(p1[u]));
      }
    }
  }
  AdamWStep bad;
  bad.half_type = HalfType::kBf16;
  float x = 0;
  EXPECT_EQ(k_->AdamW(&x, &x, &x, &x, 1, bad, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// |x - dequantized| within half a step: int8's step is the block scale;
// e4m3's is the spacing of its grid at the scaled value.
double Fp8HalfStep(float y_abs) {
  if (y_abs < std::ldexp(1.0f, -6)) return std::ldexp(1.0, -10);
  int e;
  std::frexp(y_abs, &e);  // y = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 3 - 1);
}

TEST_P(CpuKernelsTest, QuantizationIsBitExactAndWithinHalfAStep) {
  for (size_t block : {size_t{64}, size_t{100}, size_t{4096}}) {
    for (size_t n : kSizes) {
      auto x = FiniteFloats(n + 1, static_cast<uint32_t>(n + block), 3.0f);
      const int u = n % 2 ? 1 : 0;
      const float* in = x.data() + u;
      const size_t blocks = NumBlocks(n, block);
      std::vector<int8_t> q0(n + 1), q1(n + 1);
      std::vector<float> s0(blocks + 1), s1(blocks + 1), back(n + 1);
      ASSERT_TRUE(ReferenceQuantizeInt8(in, n, block, q0.data() + u, s0.data()).ok());
      ASSERT_TRUE(k_->QuantizeInt8(in, n, block, q1.data() + u, s1.data()).ok());
      ASSERT_EQ(q0, q1) << "int8 n=" << n << " block=" << block;
      ASSERT_EQ(s0, s1);
      ASSERT_TRUE(k_->DequantizeInt8(q1.data() + u, s1.data(), n, block, back.data() + u).ok());
      for (size_t i = 0; i < n; ++i) {
        const float scale = s1[i / block];
        ASSERT_LE(std::fabs(in[i] - back[i + u]), 0.5f * scale * (1 + 1e-5f) + 1e-30f)
            << "int8 element " << i;
        if (in[i] == 0.0f) {
          ASSERT_EQ(back[i + u], 0.0f);
        }
      }
      std::vector<uint8_t> f0(n + 1), f1(n + 1);
      ASSERT_TRUE(ReferenceQuantizeFp8(in, n, block, f0.data() + u, s0.data()).ok());
      ASSERT_TRUE(k_->QuantizeFp8(in, n, block, f1.data() + u, s1.data()).ok());
      ASSERT_EQ(f0, f1) << "fp8 n=" << n << " block=" << block;
      ASSERT_EQ(s0, s1);
      std::vector<float> ref_back(n + 1);
      ASSERT_TRUE(ReferenceDequantizeFp8(f0.data() + u, s0.data(), n, block,
                                         ref_back.data() + u).ok());
      ASSERT_TRUE(k_->DequantizeFp8(f1.data() + u, s1.data(), n, block, back.data() + u).ok());
      ASSERT_EQ(std::memcmp(ref_back.data(), back.data(), back.size() * 4), 0);
      for (size_t i = 0; i < n; ++i) {
        const float scale = s1[i / block];
        if (scale == 0) continue;
        const float y = std::fabs(in[i] / scale);
        ASSERT_LE(std::fabs(in[i] - back[i + u]),
                  Fp8HalfStep(y) * scale * (1 + 1e-5) + 1e-30)
            << "fp8 element " << i << " value " << in[i];
        if (in[i] == 0.0f) {
          ASSERT_EQ(back[i + u], 0.0f);
        }
      }
    }
  }
}

// Every code, at scales from subnormal to FLT_MAX / 448 (the largest a
// quantizer makes) and NaN (a refused block's, see PackQuantizedOrNan), in
// runs that end in a partial block and a tail: the reference's bits.
TEST_P(CpuKernelsTest, DequantizationIsBitExactForEveryCodeAndScale) {
  const size_t block = 320;  // 5 x 64: whole-vector steps, then a tail
  const std::vector<float> scale_set = {
      1.0f, 0.37f, 1e-40f, 3.0e-39f, 7.59e35f, std::numeric_limits<float>::max() / 448,
      std::numeric_limits<float>::quiet_NaN()};
  const size_t n = block * scale_set.size() - 3;
  std::vector<uint8_t> codes(n);
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>((i * 37 + i / 256) & 0xff);
  std::vector<float> ref(n), got(n);
  ASSERT_TRUE(ReferenceDequantizeFp8(codes.data(), scale_set.data(), n, block, ref.data()).ok());
  ASSERT_TRUE(k_->DequantizeFp8(codes.data(), scale_set.data(), n, block, got.data()).ok());
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 4), 0) << "fp8";
  const int8_t* signed_codes = reinterpret_cast<const int8_t*>(codes.data());
  ASSERT_TRUE(ReferenceDequantizeInt8(signed_codes, scale_set.data(), n, block, ref.data()).ok());
  ASSERT_TRUE(k_->DequantizeInt8(signed_codes, scale_set.data(), n, block, got.data()).ok());
  ASSERT_EQ(std::memcmp(ref.data(), got.data(), n * 4), 0) << "int8";
}

// With max |x| = 448 the fp8 scale is 1, so every e4m3 value and every tie
// between neighbours reaches the encoder exactly.
TEST_P(CpuKernelsTest, Fp8TiesAndBinadeEdgesMatchReference) {
  std::vector<float> x = {448.0f};
  for (int c = 0; c < 126; ++c) {
    const float lo = E4M3BitsToFp32(static_cast<uint8_t>(c));
    const float hi = E4M3BitsToFp32(static_cast<uint8_t>(c + 1));
    for (float v : {lo, (lo + hi) / 2, std::nextafter((lo + hi) / 2, hi),
                    std::nextafter((lo + hi) / 2, lo)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  const size_t n = x.size();
  std::vector<uint8_t> want(n), got(n);
  std::vector<float> s0(NumBlocks(n, 4096)), s1(s0.size());
  ASSERT_TRUE(ReferenceQuantizeFp8(x.data(), n, 4096, want.data(), s0.data()).ok());
  ASSERT_EQ(s0[0], 1.0f);
  ASSERT_TRUE(k_->QuantizeFp8(x.data(), n, 4096, got.data(), s1.data()).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], want[i]) << "value " << x[i];
    // Round to nearest: no e4m3 value is closer than the chosen one.
    const float chosen = std::fabs(E4M3BitsToFp32(want[i]));
    for (int c = 0; c <= 126; ++c) {
      ASSERT_LE(std::fabs(std::fabs(x[i]) - chosen),
                std::fabs(std::fabs(x[i]) - E4M3BitsToFp32(static_cast<uint8_t>(c))))
          << "value " << x[i];
    }
  }
}

// Blocks whose max |x| is so small that 127 / max or 448 / max overflows
// fp32 (below about 2^-119), down to the smallest subnormal: zeros stay zero,
// every variant gives the reference's bits, and the error stays within half
// a step plus the rounding of the (subnormal) scale itself.
TEST_P(CpuKernelsTest, QuantizationOfTinyBlocksKeepsZerosAndPrecision) {
  const size_t block = 64;
  std::vector<float> x;
  for (int e : {-149, -140, -130, -126, -121, -119, -100, -64, -63}) {
    const float amax = std::ldexp(1.0f, e);
    for (size_t i = 0; i < block; ++i) {
      const float v = amax * static_cast<float>((i * 37) % 64) / 63.0f;
      x.push_back(i % 2 ? -v : v);
    }
    x[x.size() - block + 5] = amax;  // the block's max, whatever the rounding
  }
  const size_t n = x.size(), blocks = n / block;
  const double scale_rounding = std::ldexp(1.0, -149);
  std::vector<int8_t> q0(n), q1(n);
  std::vector<float> s0(blocks), s1(blocks), back(n);
  ASSERT_TRUE(ReferenceQuantizeInt8(x.data(), n, block, q0.data(), s0.data()).ok());
  ASSERT_TRUE(k_->QuantizeInt8(x.data(), n, block, q1.data(), s1.data()).ok());
  ASSERT_EQ(q0, q1);
  ASSERT_EQ(s0, s1);
  ASSERT_TRUE(k_->DequantizeInt8(q1.data(), s1.data(), n, block, back.data()).ok());
  for (size_t i = 0; i < n; ++i) {
    const double amax = std::fabs(x[i / block * block + 5]);
    if (x[i] == 0.0f) {
      ASSERT_EQ(back[i], 0.0f) << "int8 element " << i;
    }
    ASSERT_LE(std::fabs(double{x[i]} - back[i]),
              0.5 * amax / 127 * (1 + 1e-5) + 128 * scale_rounding)
        << "int8 element " << i << " value " << x[i];
  }
  std::vector<uint8_t> f0(n), f1(n);
  ASSERT_TRUE(ReferenceQuantizeFp8(x.data(), n, block, f0.data(), s0.data()).ok());
  ASSERT_TRUE(k_->QuantizeFp8(x.data(), n, block, f1.data(), s1.data()).ok());
  ASSERT_EQ(f0, f1);
  ASSERT_EQ(s0, s1);
  ASSERT_TRUE(k_->DequantizeFp8(f1.data(), s1.data(), n, block, back.data()).ok());
  for (size_t i = 0; i < n; ++i) {
    const double amax = std::fabs(x[i / block * block + 5]);
    if (x[i] == 0.0f) {
      ASSERT_EQ(back[i], 0.0f) << "fp8 element " << i;
    }
    const double scale = amax / 448;
    ASSERT_LE(std::fabs(double{x[i]} - back[i]),
              Fp8HalfStep(static_cast<float>(std::fabs(x[i]) / scale)) * scale * (1 + 1e-5) +
                  449 * scale_rounding)
        << "fp8 element " << i << " value " << x[i];
  }
}

// A tiny block (max |x| < 2^-64, quantized as the reference does) in the
// first or second half of the whole blocks, in the last pair of them, or in
// the remainder: the AVX2 quantizers take the halves' blocks in pairs and
// go on one block at a time from such a pair. The same bits as the
// reference either way.
TEST_P(CpuKernelsTest, QuantizationOfTinyBlocksAnywhereMatchesReference) {
  constexpr size_t kBlock = 64, kN = 41 * kBlock + 19;  // 20 pairs, 2 more
  for (size_t tiny : {size_t{0}, size_t{7}, size_t{19}, size_t{20}, size_t{27},
                      size_t{39}, size_t{40}, size_t{41}}) {
    auto x = FiniteFloats(kN, static_cast<uint32_t>(tiny + 3), 2.0f);
    for (size_t i = tiny * kBlock; i < std::min(kN, (tiny + 1) * kBlock); ++i) {
      x[i] = std::ldexp(x[i], -80);
    }
    std::vector<int8_t> q0(kN), q1(kN);
    std::vector<uint8_t> f0(kN), f1(kN);
    std::vector<float> s0(NumBlocks(kN, kBlock)), s1(s0.size());
    ASSERT_TRUE(
        ReferenceQuantizeInt8(x.data(), kN, kBlock, q0.data(), s0.data()).ok());
    ASSERT_TRUE(
        k_->QuantizeInt8(x.data(), kN, kBlock, q1.data(), s1.data()).ok());
    ASSERT_EQ(q0, q1) << "int8, tiny block " << tiny;
    ASSERT_EQ(s0, s1) << "int8, tiny block " << tiny;
    ASSERT_TRUE(
        ReferenceQuantizeFp8(x.data(), kN, kBlock, f0.data(), s0.data()).ok());
    ASSERT_TRUE(
        k_->QuantizeFp8(x.data(), kN, kBlock, f1.data(), s1.data()).ok());
    ASSERT_EQ(f0, f1) << "fp8, tiny block " << tiny;
    ASSERT_EQ(s0, s1) << "fp8, tiny block " << tiny;
  }
}

TEST_P(CpuKernelsTest, QuantizationRefusesNonFiniteAndBadBlocks) {
  auto x = FiniteFloats(1000, 5, 1.0f);
  x[300] = NAN;
  std::vector<int8_t> q(1000);
  std::vector<uint8_t> f(1000);
  std::vector<float> s(16);
  auto st = k_->QuantizeInt8(x.data(), 1000, 64, q.data(), s.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 4"), absl::string_view::npos) << st;
  x[300] = INFINITY;
  st = k_->QuantizeFp8(x.data(), 1000, 64, f.data(), s.data());
  EXPECT_NE(st.message().find("block 4"), absl::string_view::npos) << st;
  EXPECT_EQ(k_->QuantizeInt8(x.data(), 1000, 32, q.data(), s.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(k_->QuantizeInt8(x.data(), 1000, 8192, q.data(), s.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Each Inf and NaN pattern, at every position of a few blocks (the vector
// bodies, the tails, the block whose maximum is found while the one before
// it is encoded), makes both quantizers name its block.
TEST_P(CpuKernelsTest, QuantizersFindEachNonFinitePatternAnywhere) {
  constexpr size_t kN = 300, kBlock = 64;
  std::vector<int8_t> q(kN);
  std::vector<uint8_t> f(kN);
  std::vector<float> s(NumBlocks(kN, kBlock));
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                        0xff800001u, 0x7fbfffffu}) {
    for (size_t at = 0; at < kN; ++at) {
      auto x = FiniteFloats(kN, 11, 2.0f);
      std::memcpy(&x[at], &bits, sizeof(bits));
      const std::string block = "block " + std::to_string(at / kBlock);
      auto st = k_->QuantizeInt8(x.data(), kN, kBlock, q.data(), s.data());
      ASSERT_NE(st.message().find(block), absl::string_view::npos)
          << std::hex << bits << std::dec << " at " << at << ": " << st;
      st = k_->QuantizeFp8(x.data(), kN, kBlock, f.data(), s.data());
      ASSERT_NE(st.message().find(block), absl::string_view::npos)
          << std::hex << bits << std::dec << " at " << at << ": " << st;
    }
  }
}

// Over several groups of blocks (the SIMD quantizers find a group's maxima
// before they encode it): one non-finite value anywhere is named, and of two
// the earlier block is, in one group or two.
TEST_P(CpuKernelsTest, QuantizersNameTheFirstNonFiniteBlockOverGroups) {
  constexpr size_t kBlock = 64, kN = 4 * 1024 + 300;  // 4 whole groups
  std::vector<int8_t> q(kN);
  std::vector<uint8_t> f(kN);
  std::vector<float> s(NumBlocks(kN, kBlock));
  auto expect_block = [&](const std::vector<float>& x, size_t want) {
    const std::string block = "block " + std::to_string(want);
    auto st = k_->QuantizeInt8(x.data(), kN, kBlock, q.data(), s.data());
    EXPECT_NE(st.message().find(block + " "), absl::string_view::npos)
        << "int8, want " << block << ": " << st;
    st = k_->QuantizeFp8(x.data(), kN, kBlock, f.data(), s.data());
    EXPECT_NE(st.message().find(block + " "), absl::string_view::npos)
        << "fp8, want " << block << ": " << st;
  };
  for (size_t at = 5; at < kN; at += 97) {
    auto x = FiniteFloats(kN, 13, 2.0f);
    x[at] = NAN;
    expect_block(x, at / kBlock);
  }
  for (auto [first, second] : {std::pair<size_t, size_t>{1100, 2100},
                               {2100, 3100}, {1100, 3100}, {30, 2050},
                               {3100, 4200}, {2060, 2050}}) {
    auto x = FiniteFloats(kN, 17, 2.0f);
    x[first] = INFINITY;
    x[second] = -INFINITY;
    expect_block(x, std::min(first, second) / kBlock);
  }
}

// Every variant adds each pair once, as the reference does: the same bits,
// at every length and alignment, Inf, NaN and -0 included. Accumulate into
// the sum; Add into a third buffer gives the bits of a copy of `a` then
// Accumulate of `b` (the reduce's first two contributions in one pass).
TEST_P(CpuKernelsTest, AccumulateAndAddMatchReferenceBits) {
  for (size_t n : kSizes) {
    const int u = n % 2 ? 1 : 0;
    auto a = FiniteFloats(n + 1, 22, 3.0f);
    auto b = FiniteFloats(n + 1, 21, 3.0f);
    if (n > 3) {
      b[u + n / 2] = NAN;
      a[u + n / 3] = INFINITY;
      a[u + n / 4] = -0.0f;
      b[u + n / 4] = 0.0f;
    }
    auto want = a, sum = a;
    std::vector<float> added(n + 1, 7.0f);
    ASSERT_TRUE(ReferenceAccumulate(want.data() + u, b.data() + u, n).ok());
    ASSERT_TRUE(k_->Accumulate(sum.data() + u, b.data() + u, n).ok());
    ASSERT_TRUE(k_->Add(added.data() + u, a.data() + u, b.data() + u, n).ok());
    ASSERT_EQ(0, std::memcmp(want.data(), sum.data(), want.size() * sizeof(float)))
        << "Accumulate, n " << n;
    ASSERT_EQ(0, std::memcmp(want.data() + u, added.data() + u, n * sizeof(float)))
        << "Add, n " << n;
    EXPECT_EQ(added[u ? 0 : n], 7.0f) << "Add wrote outside its range, n " << n;
  }
  EXPECT_EQ(k_->Accumulate(nullptr, nullptr, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(k_->Accumulate(nullptr, nullptr, 0).ok());
  EXPECT_EQ(k_->Add(nullptr, nullptr, nullptr, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(k_->Add(nullptr, nullptr, nullptr, 0).ok());
}

TEST_P(CpuKernelsTest, GradCheckMatchesReference) {
  for (size_t n : kSizes) {
    for (float scale : {1.0f, 0.125f}) {
      auto g0 = FiniteFloats(n + 1, 9, 2.0f);
      auto g1 = g0;
      const int u = n % 2 ? 1 : 0;
      auto want = ReferenceGradCheck(g0.data() + u, n, scale);
      auto got = k_->GradCheck(g1.data() + u, n, scale);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(g0, g1);  // unscaled values: same bits
      EXPECT_NEAR(got->sum_squares, want->sum_squares, 1e-12 * want->sum_squares);
      EXPECT_FALSE(got->non_finite);
      if (n > 3) {
        g1[u + n / 2] = NAN;
        EXPECT_TRUE(k_->GradCheck(g1.data() + u, n, 1.0f)->non_finite);
        g1[u + n / 2] = -INFINITY;
        EXPECT_TRUE(k_->GradCheck(g1.data() + u, n, 1.0f)->non_finite);
        g1[u + n / 2] = 3e38f;  // finite, but overflows once scaled by 4
        EXPECT_TRUE(k_->GradCheck(g1.data() + u, n, 4.0f)->non_finite);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CpuKernelsTest,
    ::testing::Combine(::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                       ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<std::tuple<Isa, int>>& info) {
      return std::string(IsaName(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<1>(info.param)) + "threads";
    });

TEST(CpuKernelsCreateTest, BadOptionsAreRefused) {
  CpuKernelsOptions o;
  o.threads = 0;
  EXPECT_EQ(CpuKernels::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIsa("sse9").status().code(), absl::StatusCode::kInvalidArgument);
  setenv("ZSHARD_KERNELS_ISA", "bogus", 1);
  auto k = CpuKernels::Create({});
  unsetenv("ZSHARD_KERNELS_ISA");
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("ZSHARD_KERNELS_ISA"), absl::string_view::npos);
  setenv("ZSHARD_KERNELS_ISA", "scalar", 1);
  k = CpuKernels::Create({});
  unsetenv("ZSHARD_KERNELS_ISA");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ((*k)->isa(), Isa::kScalar);
}

}  // namespace
}  // namespace kernels
}  // namespace zshard
