// The CUDA kernels against the scalar reference (ctest label `gpu`: run by
// tests/gpu/run.sh on a machine with an NVIDIA GPU, never in CI). Casts,
// AdamW and quantization must give the reference's bits; the gradient
// check's sum agrees to 1e-12 relative.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/cuda_kernels.h"
#include "zshard/kernels/grad_check.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

const size_t kSizes[] = {0, 1, 7, 4097, 1000003};

// Device copy of a host vector, freed on destruction.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    auto p = cuda::Malloc(std::max<size_t>(1, n_) * sizeof(T));
    EXPECT_TRUE(p.ok()) << p.status();
    ptr_ = static_cast<T*>(*p);
    if (n_) {
      EXPECT_TRUE(cuda::CopyToDevice(ptr_, host.data(), n_ * sizeof(T)).ok());
    }
  }
  ~DeviceVector() { (void)cuda::Free(ptr_); }
  T* get() { return ptr_; }
  std::vector<T> ToHost() {
    std::vector<T> out(n_);
    EXPECT_TRUE(cuda::Synchronize().ok());
    if (n_) {
      EXPECT_TRUE(cuda::CopyToHost(out.data(), ptr_, n_ * sizeof(T)).ok());
    }
    return out;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

std::vector<float> Floats(size_t n, uint32_t seed, bool any_bits) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (any_bits && i % 3 == 0) {
      const uint32_t bits = rng();
      std::memcpy(&out[i], &bits, 4);
    } else {
      out[i] = i % 11 == 0 ? 0.0f : normal(rng);
    }
  }
  return out;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda::DeviceCount(), 0)
        << "no CUDA device: the gpu-labelled tests need one";
  }
};

TEST_F(CudaKernelsTest, CastsAreBitExact) {
  for (size_t n : kSizes) {
    auto x = Floats(n, 1, true);
    DeviceVector<float> dx(x);
    DeviceVector<uint16_t> dh{std::vector<uint16_t>(n)};
    std::vector<uint16_t> want(n);
    ASSERT_TRUE(ReferenceFp32ToBf16(x.data(), want.data(), n).ok());
    ASSERT_TRUE(cuda::Fp32ToBf16(dx.get(), dh.get(), n).ok());
    EXPECT_EQ(dh.ToHost(), want) << n;
    ASSERT_TRUE(ReferenceFp32ToFp16(x.data(), want.data(), n).ok());
    ASSERT_TRUE(cuda::Fp32ToFp16(dx.get(), dh.get(), n).ok());
    EXPECT_EQ(dh.ToHost(), want) << n;
  }
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  DeviceVector<uint16_t> dall(all);
  DeviceVector<float> dout{std::vector<float>(65536)};
  std::vector<float> want(65536);
  ASSERT_TRUE(ReferenceBf16ToFp32(all.data(), want.data(), 65536).ok());
  ASSERT_TRUE(cuda::Bf16ToFp32(dall.get(), dout.get(), 65536).ok());
  auto got = dout.ToHost();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 65536 * 4), 0);
  ASSERT_TRUE(ReferenceFp16ToFp32(all.data(), want.data(), 65536).ok());
  ASSERT_TRUE(cuda::Fp16ToFp32(dall.get(), dout.get(), 65536).ok());
  got = dout.ToHost();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 65536 * 4), 0);
}

TEST_F(CudaKernelsTest, AdamWIsBitExact) {
  for (HalfType half : {HalfType::kNone, HalfType::kBf16, HalfType::kFp16}) {
    for (size_t n : kSizes) {
      auto p = Floats(n, 2, false), g = Floats(n, 3, false);
      auto m = Floats(n, 4, false), v = Floats(n, 5, false);
      for (float& x : v) x = x * x;
      DeviceVector<float> dp(p), dg(g), dm(m), dv(v);
      DeviceVector<uint16_t> dh{std::vector<uint16_t>(n)};
      std::vector<uint16_t> h(n);
      AdamWStep hp;
      hp.step = 5;
      hp.grad_scale = 0.5f;
      hp.half_type = half;
      ASSERT_TRUE(ReferenceAdamW(p.data(), g.data(), m.data(), v.data(), n, hp, h.data()).ok());
      ASSERT_TRUE(cuda::AdamW(dp.get(), dg.get(), dm.get(), dv.get(), n, hp, dh.get()).ok());
      auto gp = dp.ToHost(), gm = dm.ToHost(), gv = dv.ToHost();
      EXPECT_EQ(std::memcmp(gp.data(), p.data(), n * 4), 0) << n;
      EXPECT_EQ(std::memcmp(gm.data(), m.data(), n * 4), 0) << n;
      EXPECT_EQ(std::memcmp(gv.data(), v.data(), n * 4), 0) << n;
      if (half != HalfType::kNone) {
        EXPECT_EQ(dh.ToHost(), h) << n;
      }
    }
  }
}

TEST_F(CudaKernelsTest, QuantizationIsBitExact) {
  for (size_t block : {size_t{64}, size_t{100}, size_t{4096}}) {
    for (size_t n : kSizes) {
      auto x = Floats(n, 6, false);
      const size_t blocks = NumBlocks(n, block);
      DeviceVector<float> dx(x), ds{std::vector<float>(blocks)}, dout{std::vector<float>(n)};
      DeviceVector<int8_t> dq{std::vector<int8_t>(n)};
      DeviceVector<uint8_t> df{std::vector<uint8_t>(n)};
      std::vector<int8_t> q(n);
      std::vector<uint8_t> f(n);
      std::vector<float> s(blocks), back(n);
      ASSERT_TRUE(ReferenceQuantizeInt8(x.data(), n, block, q.data(), s.data()).ok());
      ASSERT_TRUE(cuda::QuantizeInt8(dx.get(), n, block, dq.get(), ds.get()).ok());
      EXPECT_EQ(dq.ToHost(), q);
      EXPECT_EQ(ds.ToHost(), s);
      ASSERT_TRUE(ReferenceDequantizeInt8(q.data(), s.data(), n, block, back.data()).ok());
      ASSERT_TRUE(cuda::DequantizeInt8(dq.get(), ds.get(), n, block, dout.get()).ok());
      EXPECT_EQ(dout.ToHost(), back);
      ASSERT_TRUE(ReferenceQuantizeFp8(x.data(), n, block, f.data(), s.data()).ok());
      ASSERT_TRUE(cuda::QuantizeFp8(dx.get(), n, block, df.get(), ds.get()).ok());
      EXPECT_EQ(df.ToHost(), f);
      EXPECT_EQ(ds.ToHost(), s);
      ASSERT_TRUE(ReferenceDequantizeFp8(f.data(), s.data(), n, block, back.data()).ok());
      ASSERT_TRUE(cuda::DequantizeFp8(df.get(), ds.get(), n, block, dout.get()).ok());
      EXPECT_EQ(dout.ToHost(), back);
    }
  }
  auto x = Floats(1000, 7, false);
  x[300] = NAN;
  DeviceVector<float> dx(x), ds{std::vector<float>(16)};
  DeviceVector<int8_t> dq{std::vector<int8_t>(1000)};
  auto st = cuda::QuantizeInt8(dx.get(), 1000, 64, dq.get(), ds.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 4"), absl::string_view::npos) << st;
}

// Blocks whose max |x| is tiny enough that 448 / max overflows fp32: the
// kernels rescale them exactly as the reference does (BlockQuantFactors).
TEST_F(CudaKernelsTest, QuantizationOfTinyBlocksIsBitExact) {
  const size_t block = 64;
  std::vector<float> x;
  for (int e : {-149, -140, -126, -119, -64, -63, 0}) {
    for (size_t i = 0; i < block; ++i) {
      const float v = std::ldexp(1.0f, e) * static_cast<float>((i * 37) % 64) / 63.0f;
      x.push_back(i % 2 ? -v : v);
    }
  }
  const size_t n = x.size(), blocks = n / block;
  DeviceVector<float> dx(x), ds{std::vector<float>(blocks)};
  DeviceVector<int8_t> dq{std::vector<int8_t>(n)};
  DeviceVector<uint8_t> df{std::vector<uint8_t>(n)};
  std::vector<int8_t> q(n);
  std::vector<uint8_t> f(n);
  std::vector<float> s(blocks);
  ASSERT_TRUE(ReferenceQuantizeInt8(x.data(), n, block, q.data(), s.data()).ok());
  ASSERT_TRUE(cuda::QuantizeInt8(dx.get(), n, block, dq.get(), ds.get()).ok());
  EXPECT_EQ(dq.ToHost(), q);
  EXPECT_EQ(ds.ToHost(), s);
  ASSERT_TRUE(ReferenceQuantizeFp8(x.data(), n, block, f.data(), s.data()).ok());
  ASSERT_TRUE(cuda::QuantizeFp8(dx.get(), n, block, df.get(), ds.get()).ok());
  EXPECT_EQ(df.ToHost(), f);
  EXPECT_EQ(ds.ToHost(), s);
}

TEST_F(CudaKernelsTest, GradCheckMatchesReference) {
  for (size_t n : kSizes) {
    for (float scale : {1.0f, 0.125f}) {
      auto g = Floats(n, 8, false);
      DeviceVector<float> dg(g);
      auto want = ReferenceGradCheck(g.data(), n, scale);
      auto got = cuda::GradCheck(dg.get(), n, scale);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status();
      EXPECT_NEAR(got->sum_squares, want->sum_squares, 1e-12 * want->sum_squares);
      EXPECT_FALSE(got->non_finite);
      EXPECT_EQ(dg.ToHost(), g);
    }
  }
  auto g = Floats(5000, 9, false);
  g[1234] = INFINITY;
  DeviceVector<float> dg(g);
  auto got = cuda::GradCheck(dg.get(), 5000);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->non_finite);
}

}  // namespace
}  // namespace kernels
}  // namespace zshard
