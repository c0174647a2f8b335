// AVX-512 (F, BW, VL, DQ) kernels. Compiled with -mavx512* and
// -ffp-contract=off, so each operation rounds exactly as the scalar
// reference does; ranges not a multiple of the vector width end in the
// reference loop itself.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "cpu/kernel_table.h"
#include "reference/scalar_kernels.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

inline __m256i Bf16x16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  const __m512i quiet =
      _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, nan, quiet);
  return _mm512_cvtepi32_epi16(r);
}

inline __m256i Fp16x16(__m512 p) {
  return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <HalfType kHalf>
void AdamWLoop(float* param, const float* grad, float* m, float* v, size_t n,
               const AdamWConstants& c, void* half_out) {
  const __m512 b1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size);
  const __m512 isb2 = _mm512_set1_ps(c.inv_sqrt_bc2), decay = _mm512_set1_ps(c.decay);
  const __m512 gs = _mm512_set1_ps(c.grad_scale);
  auto* half = static_cast<uint16_t*>(half_out);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)),
                                    _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), isb2), eps);
    const __m512 p = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(param + i), decay),
                                   _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
    _mm512_storeu_ps(param + i, p);
    if constexpr (kHalf == HalfType::kBf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + i), Bf16x16(p));
    } else if constexpr (kHalf == HalfType::kFp16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + i), Fp16x16(p));
    }
  }
  scalar::AdamW(param + i, grad + i, m + i, v + i, n - i, c, kHalf,
                half ? half + i : nullptr);
}

void AdamW(float* p, const float* g, float* m, float* v, size_t n,
           const AdamWConstants& c, HalfType half_type, void* half_out) {
  switch (half_type) {
    case HalfType::kNone:
      return AdamWLoop<HalfType::kNone>(p, g, m, v, n, c, half_out);
    case HalfType::kBf16:
      return AdamWLoop<HalfType::kBf16>(p, g, m, v, n, c, half_out);
    case HalfType::kFp16:
      return AdamWLoop<HalfType::kFp16>(p, g, m, v, n, c, half_out);
  }
}

void Fp32ToBf16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Bf16x16(_mm512_loadu_ps(in + i)));
  }
  scalar::Fp32ToBf16(in + i, out + i, n - i);
}

void Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
  scalar::Bf16ToFp32(in + i, out + i, n - i);
}

void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Fp16x16(_mm512_loadu_ps(in + i)));
  }
  scalar::Fp32ToFp16(in + i, out + i, n - i);
}

void Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(in + i))));
  }
  scalar::Fp16ToFp32(in + i, out + i, n - i);
}

// max |x| over a block; non-finite (Inf) when any value is Inf or NaN.
float BlockAbsMax(const float* x, size_t len) {
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - i)) - 1);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i));
    bad |= _mm512_mask_cmp_ps_mask(k, a, inf, _CMP_NLT_UQ);
    amax = _mm512_max_ps(amax, a);
  }
  if (bad) return INFINITY;
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, amax);
  float m = 0.0f;
  for (float l : lanes) m = std::max(m, l);
  return m;
}

inline __mmask16 TailMask(size_t left) {
  return left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
}

size_t QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                    float* scales) {
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const float amax = BlockAbsMax(in + start, len);
    if (amax == INFINITY) return b;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    scales[b] = amax / 127.0f;
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 k = TailMask(len - i);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, in + start + i), inv);
      __m512i r = _mm512_cvtps_epi32(x);  // round to nearest even
      r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      _mm512_mask_cvtepi32_storeu_epi8(q + start + i, k, r);
    }
  }
  return kAllFinite;
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                    size_t block, float* out) {
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const __m512 s = _mm512_set1_ps(scales[b]);
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 k = TailMask(len - i);
      const __m128i bytes = _mm_maskz_loadu_epi8(k, q + start + i);
      const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
      _mm512_mask_storeu_ps(out + start + i, k, _mm512_mul_ps(x, s));
    }
  }
}

size_t QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                   float* scales) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i sub_limit = _mm512_set1_epi32(0x3c800000);
  const __m512 k512 = _mm512_set1_ps(512.0f);
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const float amax = BlockAbsMax(in + start, len);
    if (amax == INFINITY) return b;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 448.0f / amax : 0.0f);
    scales[b] = amax / 448.0f;
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 k = TailMask(len - i);
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, in + start + i), inv);
      const __m512i u = _mm512_castps_si512(y);
      const __m512i a = _mm512_and_si512(u, abs_mask);
      const __m512i sign = _mm512_srli_epi32(_mm512_andnot_si512(abs_mask, u), 24);
      const __m512i sub =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), k512));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
      const __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7ffff)), lsb);
      const __m512i norm = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(960));
      __m512i code = _mm512_mask_mov_epi32(
          norm, _mm512_cmplt_epu32_mask(a, sub_limit), sub);
      code = _mm512_min_epu32(code, _mm512_set1_epi32(0x7e));
      code = _mm512_or_si512(code, sign);
      _mm512_mask_cvtepi32_storeu_epi8(q + start + i, k, code);
    }
  }
  return kAllFinite;
}

void DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                   size_t block, float* out) {
  const __m512 k2m9 = _mm512_set1_ps(0.001953125f);
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const __m512 s = _mm512_set1_ps(scales[b]);
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 k = TailMask(len - i);
      const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, q + start + i));
      const __m512i e = _mm512_and_si512(_mm512_srli_epi32(c, 3), _mm512_set1_epi32(0xf));
      const __m512i m = _mm512_and_si512(c, _mm512_set1_epi32(7));
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
      const __m512i normal = _mm512_or_si512(
          _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(120)), 23),
          _mm512_slli_epi32(m, 20));
      const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), k2m9);
      __m512 val = _mm512_mask_mov_ps(_mm512_castsi512_ps(normal),
                                      _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), sub);
      val = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(val), sign));
      _mm512_mask_storeu_ps(out + start + i, k, _mm512_mul_ps(val, s));
    }
  }
}

void GradCheck(float* g, size_t n, float scale, double* sum, bool* non_finite) {
  const bool write = scale != 1.0f;
  const __m512 s = _mm512_set1_ps(scale), inf = _mm512_set1_ps(INFINITY);
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(g + i);
    if (write) {
      x = _mm512_mul_ps(x, s);
      _mm512_storeu_ps(g + i, x);
    }
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(x), inf, _CMP_NLT_UQ);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(acc0, acc1));
  double total = 0;
  for (double l : lanes) total += l;
  *sum += total;
  *non_finite |= bad != 0;
  scalar::GradCheck(g + i, n - i, scale, sum, non_finite);
}

}  // namespace

const KernelTable* Avx512KernelTable() {
  static const KernelTable table = {
      AdamW,          Fp32ToBf16,  Bf16ToFp32,    Fp32ToFp16,
      Fp16ToFp32,     QuantizeInt8, DequantizeInt8, QuantizeFp8,
      DequantizeFp8,  GradCheck};
  return &table;
}

}  // namespace kernels
}  // namespace zshard
