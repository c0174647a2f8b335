// Both AVX-512 tunings (Intel's and the others') against the scalar
// reference on any AVX-512 CPU, so the one this CPU does not dispatch to is
// checked too: quantizer codes and scales bit-exact, the first non-finite
// block found; sizes with partial blocks and unaligned pointers; the
// gradient check's sum and non-finite flag.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_table.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

// Values of mixed magnitudes and signs (blocks of tiny values included, so
// the scalar path for max |x| < 2^-64 is taken too), every one finite.
std::vector<float> MixedFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int exponent =
        (i / 256) % 7 == 3 ? -80 : static_cast<int>(rng() % 40) - 20;
    out[i] = std::ldexp(unit(rng), exponent);
    if (i % 97 == 0) out[i] = 0.0f;
  }
  return out;
}

struct Quantized {
  size_t first_non_finite;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

template <typename Out>
Quantized QuantizeWith(size_t (*quantize)(const float*, size_t, size_t, Out*,
                                          float*),
                       const float* in, size_t n, size_t block) {
  Quantized r;
  r.codes.assign(n + 1, 0xaa);
  r.scales.assign(NumBlocks(n, block) + 1, -1.0f);
  r.first_non_finite = quantize(
      in, n, block, reinterpret_cast<Out*>(r.codes.data()), r.scales.data());
  return r;
}

void ExpectSame(const Quantized& want, const Quantized& got, const char* what) {
  EXPECT_EQ(want.first_non_finite, got.first_non_finite) << what;
  if (want.first_non_finite != kAllFinite) return;  // the rest is unspecified
  EXPECT_EQ(want.codes, got.codes) << what;
  ASSERT_EQ(want.scales.size(), got.scales.size()) << what;
  EXPECT_EQ(0, std::memcmp(want.scales.data(), got.scales.data(),
                           want.scales.size() * sizeof(float)))
      << what;
}

class Avx512TuningTest : public ::testing::TestWithParam<Avx512Tuning> {};

TEST_P(Avx512TuningTest, QuantizersMatchTheReference) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 here";
  const KernelTable* simd = Avx512KernelTableFor(GetParam());
  const KernelTable& ref = ScalarKernelTable();
  ASSERT_NE(simd, nullptr);
  const std::vector<float> values = MixedFloats(100003 + 1, 7);
  for (size_t block : {size_t{64}, size_t{96}, size_t{256}, size_t{4096}}) {
    for (size_t n :
         {size_t{1}, size_t{63}, size_t{64}, size_t{4097}, size_t{100003}}) {
      for (size_t offset : {size_t{0}, size_t{1}}) {
        const float* in = values.data() + offset;
        SCOPED_TRACE(testing::Message() << "block " << block << " n " << n
                                        << " offset " << offset);
        ExpectSame(QuantizeWith(ref.quantize_int8, in, n, block),
                   QuantizeWith(simd->quantize_int8, in, n, block), "int8");
        ExpectSame(QuantizeWith(ref.quantize_fp8, in, n, block),
                   QuantizeWith(simd->quantize_fp8, in, n, block), "fp8");
      }
    }
  }
}

TEST_P(Avx512TuningTest, QuantizersNameTheFirstNonFiniteBlock) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 here";
  const KernelTable* simd = Avx512KernelTableFor(GetParam());
  const size_t n = 8192, block = 256;
  std::vector<float> values = MixedFloats(n, 11);
  // Both quantizers of `v` name block `want` first.
  auto expect_first_bad = [&](const std::vector<float>& v, size_t want) {
    std::vector<int8_t> q8(n);
    std::vector<uint8_t> q(n);
    std::vector<float> scales(NumBlocks(n, block));
    EXPECT_EQ(want, simd->quantize_int8(v.data(), n, block, q8.data(),
                                        scales.data()));
    EXPECT_EQ(want,
              simd->quantize_fp8(v.data(), n, block, q.data(), scales.data()));
  };
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (size_t at : {size_t{0}, size_t{300}, size_t{5000}, n - 1}) {
      std::vector<float> v = values;
      v[at] = bad;
      expect_first_bad(v, at / block);
    }
  }
  // Two bad blocks: the one in the second half is met first by a quantizer
  // that reads the halves side by side; the first one is still the answer.
  for (size_t later : {size_t{256}, size_t{1500}, size_t{4095}}) {
    std::vector<float> v = values;
    v[later] = NAN;
    v[5000] = INFINITY;
    expect_first_bad(v, later / block);
  }
}

// Each tuning's gradient check (its own prefetch hints) sums the squares
// as the reference does, to rounding (the order differs), flags Inf and NaN
// anywhere, and scales in place exactly.
TEST_P(Avx512TuningTest, GradCheckMatchesTheReference) {
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 here";
  const KernelTable* simd = Avx512KernelTableFor(GetParam());
  const KernelTable& ref = ScalarKernelTable();
  const std::vector<float> values = MixedFloats(100003, 13);
  for (float scale : {1.0f, 0.5f}) {
    std::vector<float> want = values, got = values;
    double want_sum = 0, got_sum = 0;
    bool want_bad = false, got_bad = false;
    ref.grad_check(want.data(), want.size(), scale, &want_sum, &want_bad);
    simd->grad_check(got.data(), got.size(), scale, &got_sum, &got_bad);
    EXPECT_FALSE(got_bad);
    EXPECT_NEAR(want_sum, got_sum, 1e-9 * want_sum) << "scale " << scale;
    EXPECT_EQ(want, got) << "scale " << scale;
  }
  for (size_t at : {size_t{0}, size_t{50000}, values.size() - 1}) {
    std::vector<float> v = values;
    v[at] = NAN;
    double sum = 0;
    bool bad = false;
    simd->grad_check(v.data(), v.size(), 1.0f, &sum, &bad);
    EXPECT_TRUE(bad) << "NaN at " << at;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tunings, Avx512TuningTest,
    ::testing::Values(Avx512Tuning::kIntel, Avx512Tuning::kOther),
    [](const ::testing::TestParamInfo<Avx512Tuning>& info) {
      return info.param == Avx512Tuning::kIntel ? "intel" : "other";
    });

}  // namespace
}  // namespace kernels
}  // namespace zshard
