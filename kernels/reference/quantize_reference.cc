#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "cpu/kernel_table.h"
#include "reference/scalar_kernels.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace scalar {
namespace {

// max |x| of a block, or a non-finite value when the block has one.
float BlockAbsMax(const float* x, size_t n) {
  float amax = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite &= std::isfinite(a);
    amax = std::max(amax, a);
  }
  return finite ? amax : INFINITY;
}

}  // namespace

size_t QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                    float* scales) {
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const float amax = BlockAbsMax(in + start, len);
    if (!std::isfinite(amax)) return b;
    const QuantFactors f = BlockQuantFactors(amax, 127.0f);
    scales[b] = amax / 127.0f;
    for (size_t i = 0; i < len; ++i) {
      q[start + i] = QuantizeInt8Value(in[start + i] * f.pre, f.inv);
    }
  }
  return kAllFinite;
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                    size_t block, float* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(q[i]) * scales[i / block];
  }
}

size_t QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                   float* scales) {
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const float amax = BlockAbsMax(in + start, len);
    if (!std::isfinite(amax)) return b;
    const QuantFactors f = BlockQuantFactors(amax, 448.0f);
    scales[b] = amax / 448.0f;
    for (size_t i = 0; i < len; ++i) {
      q[start + i] = Fp32ToE4M3Bits((in[start + i] * f.pre) * f.inv);
    }
  }
  return kAllFinite;
}

void DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                   size_t block, float* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = E4M3BitsToFp32(q[i]) * scales[i / block];
  }
}

}  // namespace scalar

absl::Status CheckQuantizeArgs(const void* a, const void* b, const void* c,
                               size_t n, size_t block) {
  if (block < kMinQuantBlock || block > kMaxQuantBlock) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization block size must be in ", kMinQuantBlock, "..",
        kMaxQuantBlock, ", got ", block));
  }
  if (n > 0 && (!a || !b || !c)) {
    return absl::InvalidArgumentError("quantization: null buffer");
  }
  return absl::OkStatus();
}

absl::Status NonFiniteBlockError(size_t block_index) {
  return absl::InvalidArgumentError(absl::StrCat(
      "quantization: block ", block_index, " holds an Inf or NaN"));
}

absl::Status ReferenceQuantizeInt8(const float* in, size_t n, size_t block,
                                   int8_t* q, float* scales) {
  absl::Status st = CheckQuantizeArgs(in, q, scales, n, block);
  if (!st.ok()) return st;
  const size_t bad = scalar::QuantizeInt8(in, n, block, q, scales);
  return bad == kAllFinite ? absl::OkStatus() : NonFiniteBlockError(bad);
}

absl::Status ReferenceDequantizeInt8(const int8_t* q, const float* scales,
                                     size_t n, size_t block, float* out) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (st.ok()) scalar::DequantizeInt8(q, scales, n, block, out);
  return st;
}

absl::Status ReferenceQuantizeFp8(const float* in, size_t n, size_t block,
                                  uint8_t* q, float* scales) {
  absl::Status st = CheckQuantizeArgs(in, q, scales, n, block);
  if (!st.ok()) return st;
  const size_t bad = scalar::QuantizeFp8(in, n, block, q, scales);
  return bad == kAllFinite ? absl::OkStatus() : NonFiniteBlockError(bad);
}

absl::Status ReferenceDequantizeFp8(const uint8_t* q, const float* scales,
                                    size_t n, size_t block, float* out) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (st.ok()) scalar::DequantizeFp8(q, scales, n, block, out);
  return st;
}

}  // namespace kernels
}  // namespace zshard
