// Block-wise quantization with one fp32 scale per block of `block` elements
// (64..4096; the last block may be shorter). blocks = ceil(n / block).
//
// int8 (symmetric): scale = max|x| / 127, q = round_half_even(x * (127 /
//   max|x|)), x' = q * scale. An all-zero block has scale 0 and q = 0.
// fp8 e4m3 (OCP "FN": no Inf, max 448, subnormals down to 2^-9):
//   scale = max|x| / 448, q = e4m3(x * (448 / max|x|)) rounded to nearest
//   even and saturated at 448, x' = value(q) * scale.
// A block with max|x| below 2^-64 is first multiplied by 2^64 (exactly), so
// that 127 / max|x| and 448 / max|x| stay finite (QuantFactors).
// Either way |x - x'| is at most half a quantization step (times the block's
// scale) and zeros stay exactly zero. Non-finite input is refused with
// INVALID_ARGUMENT naming the block; nothing useful is written then.
#ifndef ZSHARD_KERNELS_QUANTIZE_H_
#define ZSHARD_KERNELS_QUANTIZE_H_

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace kernels {

constexpr size_t kMinQuantBlock = 64;
constexpr size_t kMaxQuantBlock = 4096;

inline size_t NumBlocks(size_t n, size_t block) {
  return (n + block - 1) / block;
}

// fp32 -> e4m3 bits, round to nearest even, saturating to +-448. `f` finite.
ZS_HOST_DEVICE inline uint8_t Fp32ToE4M3Bits(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t code;
  if (a < 0x3c800000u) {  // below 2^-6: subnormal steps of 2^-9
    code = static_cast<uint32_t>(nearbyintf(BitsFloat(a) * 512.0f));
  } else {
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    code = (r >> 20) - (120u << 3);
  }
  if (code > 0x7eu) code = 0x7eu;
  return static_cast<uint8_t>(sign | code);
}

ZS_HOST_DEVICE inline float E4M3BitsToFp32(uint8_t q) {
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t e = (q >> 3) & 0xfu;
  const uint32_t m = q & 7u;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0.001953125f;  // 2^-9
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((e + 120u) << 23) | (m << 20));
}

// One int8 value: round half to even of x * inv, clamped to +-127.
ZS_HOST_DEVICE inline int8_t QuantizeInt8Value(float x, float inv) {
  const float r = nearbyintf(x * inv);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

// What a block's values are multiplied by before encoding: (x * pre) * inv,
// inv = top / (max|x| * pre), top 127 (int8) or 448 (fp8). pre is 1 unless
// max|x| < 2^-64, where top / max|x| may overflow fp32 (it does below about
// 2^-119, and 0 * Inf would turn zeros into NaN); then pre = 2^64, which
// scales every finite value of the block exactly. inv is 0 for an all-zero
// block. Every variant computes these the same way, so they agree bit for bit.
struct QuantFactors {
  float pre;
  float inv;
};
ZS_HOST_DEVICE inline QuantFactors BlockQuantFactors(float amax, float top) {
  if (!(amax > 0.0f)) return {1.0f, 0.0f};
  const float pre = amax < 0x1p-64f ? 0x1p64f : 1.0f;
  return {pre, top / (amax * pre)};
}

// The argument checks every quantization entry point makes: INVALID_ARGUMENT
// for a block size outside 64..4096 or a null buffer with n > 0.
absl::Status CheckQuantizeArgs(const void* a, const void* b, const void* c,
                               size_t n, size_t block);
// The error for a block holding Inf or NaN, naming it.
absl::Status NonFiniteBlockError(size_t block_index);

// INVALID_ARGUMENT for a block size outside 64..4096, null pointers with
// n > 0, or a non-finite input (naming the block).
absl::Status ReferenceQuantizeInt8(const float* in, size_t n, size_t block,
                                   int8_t* q, float* scales);
absl::Status ReferenceDequantizeInt8(const int8_t* q, const float* scales,
                                     size_t n, size_t block, float* out);
absl::Status ReferenceQuantizeFp8(const float* in, size_t n, size_t block,
                                  uint8_t* q, float* scales);
absl::Status ReferenceDequantizeFp8(const uint8_t* q, const float* scales,
                                    size_t n, size_t block, float* out);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_QUANTIZE_H_
