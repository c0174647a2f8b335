// fp32 <-> bf16 and fp32 <-> fp16 conversions, round to nearest even.
// NaN stays NaN (quietened, sign and top payload bits kept), Inf stays Inf,
// subnormals are converted exactly or rounded (never flushed), and finite
// values beyond the format's range become Inf. The scalar functions here are
// the definition; every variant produces the same bits.
#ifndef ZSHARD_KERNELS_CAST_H_
#define ZSHARD_KERNELS_CAST_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "zshard/kernels/host_device.h"

namespace zshard {
namespace kernels {

ZS_HOST_DEVICE inline uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}
ZS_HOST_DEVICE inline float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

ZS_HOST_DEVICE inline uint16_t Fp32ToBf16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

ZS_HOST_DEVICE inline float Bf16BitsToFp32(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

ZS_HOST_DEVICE inline uint16_t Fp32ToFp16Bits(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // Inf or NaN
    if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) {  // rounds to beyond 65504
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (a >= 0x38800000u) {  // normal fp16: rebias exponent, round mantissa
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Subnormal (or zero) fp16: value / 2^-24, rounded to nearest even.
  const uint32_t exp = a >> 23;
  if (exp < 102) return static_cast<uint16_t>(sign);  // below half of 2^-24
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
  return static_cast<uint16_t>(sign | rounded);
}

ZS_HOST_DEVICE inline float Fp16BitsToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {
    return BitsFloat(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
  }
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  // Subnormal: mant * 2^-24, exact in fp32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// Scalar reference loops. INVALID_ARGUMENT on null pointers with n > 0.
absl::Status ReferenceFp32ToBf16(const float* in, uint16_t* out, size_t n);
absl::Status ReferenceBf16ToFp32(const uint16_t* in, float* out, size_t n);
absl::Status ReferenceFp32ToFp16(const float* in, uint16_t* out, size_t n);
absl::Status ReferenceFp16ToFp32(const uint16_t* in, float* out, size_t n);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CAST_H_
