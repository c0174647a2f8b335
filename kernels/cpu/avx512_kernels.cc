// AVX-512 (F, BW, VL, DQ) kernels. Compiled with -mavx512* and
// -ffp-contract=off, so each operation rounds exactly as the scalar
// reference does; ranges not a multiple of the vector width end in the
// reference loop itself.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/kernel_table.h"
#include "cpu/quantize_groups.h"
#include "reference/scalar_kernels.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

// Asks for the line kBytes past p to be brought into L1. One core's
// streaming reads here are limited by how many lines are in flight, not by
// the loop's work: with a hint 4 KiB ahead the quantizers of an earlier
// design went from 0.77-0.87 to 0.98-1.03 of the plain streaming loop
// (kernels_bench, one thread), and the bench's rooflines have shapes with
// the same hints (4 and 8 KiB). A hint past the end of a buffer is dropped,
// never a fault; the address is formed as an integer so no pointer leaves
// its array.
constexpr uintptr_t kPrefetchBytes = 4096;
template <uintptr_t kBytes = kPrefetchBytes>
inline void PrefetchAhead(const void* p) {
  _mm_prefetch(
      reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kBytes),
      _MM_HINT_T0);
}

// Asks for the line kPrefetchBytes past p into L1 for writing, so an output
// line's read for ownership starts before the stores reach it. On the
// dequantizers (4 bytes written per byte read) this took them from about
// 1.0 to 1.17-1.41 of the rooflines without it (kernels_bench); every kernel
// with an output stream of its own gives it. Needs -mprfchw (prefetchw).
template <uintptr_t kBytes = kPrefetchBytes>
inline void PrefetchWriteAhead(void* p) {
  __builtin_prefetch(
      reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kBytes), 1,
      3);
}

inline __m256i Bf16x16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
      16);
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  const __m512i quiet =
      _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, nan, quiet);
  return _mm512_cvtepi32_epi16(r);
}

inline __m256i Fp16x16(__m512 p) {
  return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// How far ahead AdamW hints its four input streams. On the development VMs
// (AMD EPYC, 2026-12, kernels_bench, 64M values, paired medians against the
// lowest roofline shape, 4 interleaved rounds) one thread ran at 0.985-0.999
// of the roofline with 1 KiB, 0.970-0.976 with 2, 0.907-0.918 with 4 (the
// other kernels' distance) and 0.939-0.964 with 8; two threads at
// 0.994-1.042 with 1 KiB and 0.922-0.973 with 4.
constexpr uintptr_t kAdamWPrefetchBytes = 1024;

template <HalfType kHalf>
void AdamWLoop(float* param, const float* grad, float* m, float* v, size_t n,
               const AdamWConstants& c, void* half_out) {
  const __m512 b1 = _mm512_set1_ps(c.beta1),
               omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(c.beta2),
               omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size);
  const __m512 isb2 = _mm512_set1_ps(c.inv_sqrt_bc2),
               decay = _mm512_set1_ps(c.decay);
  const __m512 gs = _mm512_set1_ps(c.grad_scale);
  auto* half = static_cast<uint16_t*>(half_out);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead<kAdamWPrefetchBytes>(param + i);
    PrefetchAhead<kAdamWPrefetchBytes>(grad + i);
    PrefetchAhead<kAdamWPrefetchBytes>(m + i);
    PrefetchAhead<kAdamWPrefetchBytes>(v + i);
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)),
                                    _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 denom =
        _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), isb2), eps);
    const __m512 p =
        _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(param + i), decay),
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
    PrefetchAhead(in + i);
    PrefetchWriteAhead(out + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Bf16x16(_mm512_loadu_ps(in + i)));
  }
  scalar::Fp32ToBf16(in + i, out + i, n - i);
}

void Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(in + i);
    PrefetchWriteAhead(out + i);
    const __m512i h = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
  scalar::Bf16ToFp32(in + i, out + i, n - i);
}

void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(in + i);
    PrefetchWriteAhead(out + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Fp16x16(_mm512_loadu_ps(in + i)));
  }
  scalar::Fp32ToFp16(in + i, out + i, n - i);
}

void Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(in + i);
    PrefetchWriteAhead(out + i);
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(in + i))));
  }
  scalar::Fp16ToFp32(in + i, out + i, n - i);
}

inline __mmask16 TailMask(size_t left) {
  return left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
}

// max(acc, |x| as an integer): for non-negative floats the order is the
// same, and Inf and NaN patterns sort above every finite value. (vrangeps
// would take one op instead of two but drops a quiet NaN: the test
// QuantizersFindEachNonFinitePatternAnywhere failed with it.)
inline __m512i MaxAbs(__m512i acc, __m512i x) {
  return _mm512_max_epu32(acc,
                          _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)));
}

// The block's max |x| from MaxAbs accumulators; Inf when a lane held Inf or
// NaN.
inline float ReduceMaxAbs(__m512i m0, __m512i m1) {
  const uint32_t top = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
  return top >= 0x7f800000u ? INFINITY : BitsFloat(top);
}

// How far ahead of the block it encodes a quantizer hints its input. On the
// development VMs (AMD EPYC, 2026-12, kernels_bench, fp8, one thread) the
// hints 8 KiB ahead in the encoding pass ran at 0.93-0.97 of the streams'
// roofline, 8 KiB ahead in the maxima's pass at 0.84-0.85, and a pass
// encoding one block while finding a later one's maximum, hinted 4 KiB
// ahead, at 0.62-0.83; a plain streaming loop also ran faster there with
// 8 KiB than with 4 (the bench's prefetch8k shape).
constexpr uintptr_t kQuantPrefetchBytes = 8192;

// max |x| over a block (len values, any length); Inf when any value is Inf
// or NaN.
float BlockAbsMax(const float* x, size_t len) {
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    m0 = MaxAbs(m0, _mm512_loadu_si512(x + i));
    m1 = MaxAbs(m1, _mm512_loadu_si512(x + i + 16));
  }
  for (; i < len; i += 16)
    m0 = MaxAbs(m0, _mm512_maskz_loadu_epi32(TailMask(len - i), x + i));
  return ReduceMaxAbs(m0, m1);
}

// 64 one-byte codes from four vectors of 32-bit codes (each in [-128, 255],
// so neither saturating pack clamps; kUnsigned picks the unsigned packs, for
// codes above 127): two dword packs and one word pack leave each 128-bit
// lane holding four codes of a, then of b, c and d, and one dword permute
// puts them in order. Four port-5 operations where four vpmovdb are eight.
template <bool kUnsigned>
inline __m512i PackCodes(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i order =
      _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  const __m512i bytes = kUnsigned
                            ? _mm512_packus_epi16(_mm512_packus_epi32(a, b),
                                                  _mm512_packus_epi32(c, d))
                            : _mm512_packs_epi16(_mm512_packs_epi32(a, b),
                                                 _mm512_packs_epi32(c, d));
  return _mm512_permutexvar_epi32(order, bytes);
}

// How far ahead of the block it encodes a quantizer with Intel's hints
// (EncodeBlock's kIntelHints) asks for its input into L2, and for its output
// into L1 for writing: the codes of the values its L1 hint reads (one byte
// per four).
constexpr uintptr_t kQuantL2PrefetchBytes = 24576;
constexpr uintptr_t kQuantWriteAheadBytes = kQuantPrefetchBytes / 4;

// Asks for the line kBytes past p to be brought into L2 (not L1).
template <uintptr_t kBytes>
inline void PrefetchToL2Ahead(const void* p) {
  _mm_prefetch(
      reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kBytes),
      _MM_HINT_T1);
}

// Writes codes(x * inv) for the len values of one block (any length); x
// was read moments ago by BlockAbsMax and is served from L1. codes(y) gives
// each lane's code in [-128, 255] as a 32-bit integer. Hints each line
// kQuantPrefetchBytes past x into L1: the blocks two groups on, whose
// maxima are found next but one; with kIntelHints also each line
// kQuantL2PrefetchBytes past x into L2 and the output line
// kQuantWriteAheadBytes past out into L1 for writing.
template <bool kUnsigned, bool kIntelHints, typename Out, typename Codes>
void EncodeBlock(const float* x, size_t len, Out* out, float inv, Codes codes) {
  const __m512 iv = _mm512_set1_ps(inv);
  auto code_at = [&](size_t i) {
    return codes(_mm512_mul_ps(_mm512_loadu_ps(x + i), iv));
  };
  size_t i = 0;
  for (; i + 64 <= len; i += 64) {
    PrefetchAhead<kQuantPrefetchBytes>(x + i);
    PrefetchAhead<kQuantPrefetchBytes>(x + i + 16);
    PrefetchAhead<kQuantPrefetchBytes>(x + i + 32);
    PrefetchAhead<kQuantPrefetchBytes>(x + i + 48);
    if (kIntelHints) {
      PrefetchToL2Ahead<kQuantL2PrefetchBytes>(x + i);
      PrefetchToL2Ahead<kQuantL2PrefetchBytes>(x + i + 16);
      PrefetchToL2Ahead<kQuantL2PrefetchBytes>(x + i + 32);
      PrefetchToL2Ahead<kQuantL2PrefetchBytes>(x + i + 48);
      PrefetchWriteAhead<kQuantWriteAheadBytes>(out + i);
    }
    _mm512_storeu_si512(out + i,
                        PackCodes<kUnsigned>(code_at(i), code_at(i + 16),
                                             code_at(i + 32), code_at(i + 48)));
  }
  for (; i < len; i += 16) {
    const __mmask16 k = TailMask(len - i);
    _mm_mask_storeu_epi8(out + i, k,
                         _mm512_cvtepi32_epi8(codes(_mm512_mul_ps(
                             _mm512_maskz_loadu_ps(k, x + i), iv))));
  }
}

// 64 codes of one block at q, their values at out: each 16 widened straight
// from memory, whole-vector stores, a write hint for each output line. One
// 64-byte load split into its quarters ran at 0.78-0.97 of the roofline,
// this at 0.97-1.06 (kernels_bench, AMD EPYC VMs, 2026-12).
template <typename Decode>
inline void Dequantize64(const uint8_t* q, float* out, __m512 s,
                         Decode decode) {
  PrefetchWriteAhead(out);
  PrefetchWriteAhead(out + 16);
  PrefetchWriteAhead(out + 32);
  PrefetchWriteAhead(out + 48);
  for (size_t j = 0; j < 64; j += 16) {
    _mm512_storeu_ps(
        out + j,
        decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j)), s));
  }
}

// A block's last `len` (< 64) codes, in masked vectors.
template <typename Decode>
inline void DequantizeTail(const uint8_t* q, float* out, size_t len, __m512 s,
                           Decode decode) {
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = TailMask(len - i);
    _mm512_mask_storeu_ps(out + i, k,
                          decode(_mm_maskz_loadu_epi8(k, q + i), s));
  }
}

// Block-wise dequantization: out = decode(code, scales[b] * factor). The
// whole blocks go in pairs, block b with block b + pairs, 64 codes of each
// in turn, so one core reads two streams and writes two: its hardware
// prefetcher keeps more lines in flight than over one. Against the same
// loop over one stream (with a read hint 4 KiB ahead, which two streams ran
// better without): one thread 0.85-0.89 of the roofline before, 0.97-0.99
// after; two threads 0.94-0.99 before, 0.99-1.00 after (kernels_bench, 64M
// values, paired medians against the lowest shape, two-stream shapes
// included, 2026-12-06). Each value is computed as before: the same bits.
template <typename Decode>
void DequantizeBlocks(const uint8_t* q, const float* scales, float factor,
                      size_t n, size_t block, float* out, Decode decode) {
  const size_t pairs = n / block / 2;
  const size_t whole = block / 64 * 64;
  for (size_t b = 0; b < pairs; ++b) {
    const size_t a0 = b * block, a1 = (b + pairs) * block;
    const __m512 s0 = _mm512_set1_ps(scales[b] * factor);
    const __m512 s1 = _mm512_set1_ps(scales[b + pairs] * factor);
    for (size_t i = 0; i < whole; i += 64) {
      Dequantize64(q + a0 + i, out + a0 + i, s0, decode);
      Dequantize64(q + a1 + i, out + a1 + i, s1, decode);
    }
    DequantizeTail(q + a0 + whole, out + a0 + whole, block - whole, s0, decode);
    DequantizeTail(q + a1 + whole, out + a1 + whole, block - whole, s1, decode);
  }
  for (size_t b = 2 * pairs, start = b * block; start < n;
       ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const __m512 s = _mm512_set1_ps(scales[b] * factor);
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
      Dequantize64(q + start + i, out + start + i, s, decode);
    }
    DequantizeTail(q + start + i, out + start + i, len - i, s, decode);
  }
}

inline __m512 Int8Values(__m128i codes, __m512 scale) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), scale);
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                    size_t block, float* out) {
  DequantizeBlocks(reinterpret_cast<const uint8_t*>(q), scales, 1.0f, n, block,
                   out, [](__m128i c, __m512 s) { return Int8Values(c, s); });
}

// int8 codes rounded half to even (vcvtps2dq under the default rounding
// mode, as AVX2's EncodeInt8); |x * inv| <= 127 * (1 + 2^-23), so the packs
// never clamp. Intel's tuning only (see Avx512KernelTableFor).
size_t QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                    float* scales) {
  auto encode = [](const float* x, size_t len, int8_t* out, float inv) {
    EncodeBlock<false, true>(x, len, out, inv,
                             [](__m512 y) { return _mm512_cvtps_epi32(y); });
  };
  return QuantizeInGroups(in, n, block, q, scales, 127.0f, BlockAbsMax, encode,
                          scalar::QuantizeInt8);
}

// e4m3 codes of y = x * inv (|y| <= 448 * (1 + 2^-23), which rounds to 448
// at most, so no saturation is needed), as Fp32ToE4M3Bits. With
// E = max(exponent field of |y|, that of 2^-6), M is the float with
// exponent field E + 20 and 8 * (E - 121) in its mantissa: its last place
// is the e4m3 step in |y|'s binade, so the adder rounds |y| + M to a
// multiple of the step, ties to even (M's low bits are a multiple of 8, so
// the parity is that of the step count), and the sum's low 7 bits are
// steps + 8 * (E - 121), the code (at most 126 for |y| <= 448; the binade
// does not change, since |y| < 2^(E + 1)). Below 2^-6 this is the
// subnormal grid of 2^-9 with E - 121 = 0. E takes 16 values (121..136),
// so M comes from a 16-entry table indexed by E mod 16 (one permute, no
// arithmetic on E); the sign (bit 31 of x, shifted to bit 7) is merged
// under the low 7 bits with one ternary-logic op, leaving the code alone in
// its lane for PackCodes. On the development VMs (AMD EPYC Zen 5, 2026-12) the
// table took the encoding served from L1 from 79 to 100 GB/s against
// computing M as (E << 23) + (E >> 20) + constant under a mask-OR sign.
inline __m512i Fp8Codes(__m512 y) {
  // M for E = 121..136 at index E mod 16.
  const __m512i table = _mm512_set_epi32(
      (147 << 23) + 8 * 6, (146 << 23) + 8 * 5, (145 << 23) + 8 * 4,
      (144 << 23) + 8 * 3, (143 << 23) + 8 * 2, (142 << 23) + 8 * 1,
      (141 << 23) + 8 * 0, (156 << 23) + 8 * 15, (155 << 23) + 8 * 14,
      (154 << 23) + 8 * 13, (153 << 23) + 8 * 12, (152 << 23) + 8 * 11,
      (151 << 23) + 8 * 10, (150 << 23) + 8 * 9, (149 << 23) + 8 * 8,
      (148 << 23) + 8 * 7);
  const __m512i u = _mm512_castps_si512(y);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i e =
      _mm512_max_epu32(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(121));
  const __m512i code = _mm512_castps_si512(
      _mm512_add_ps(_mm512_castsi512_ps(a),
                    _mm512_castsi512_ps(_mm512_permutexvar_epi32(e, table))));
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24),
                                   _mm512_set1_epi32(0x7f), 0xe4);
}

template <bool kIntelHints>
size_t QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                   float* scales) {
  auto encode = [](const float* x, size_t len, uint8_t* out, float inv) {
    EncodeBlock<true, kIntelHints>(x, len, out, inv,
                                   [](__m512 y) { return Fp8Codes(y); });
  };
  return QuantizeInGroups(in, n, block, q, scales, 448.0f, BlockAbsMax, encode,
                          scalar::QuantizeFp8);
}

// An e4m3 code's magnitude bits shifted left by 7 are an fp16 number 2^8
// times smaller (exponent bias 15 against 7; the subnormals line up too), so
// the conversion is one vcvtph2ps with the scale multiplied by 2^8: both
// factors are exact (|scale| <= FLT_MAX / 448), so the product rounds as the
// reference's value * scale does.
inline __m512 Fp8Values(__m128i codes, __m512 scaled) {
  const __m256i w = _mm256_cvtepu8_epi16(codes);
  const __m256i half = _mm256_or_si256(
      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
  return _mm512_mul_ps(_mm512_cvtph_ps(half), scaled);
}

void DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                   size_t block, float* out) {
  DequantizeBlocks(q, scales, 256.0f, n, block, out,
                   [](__m128i c, __m512 s) { return Fp8Values(c, s); });
}

// Squares summed in double into four accumulators (the chains of dependent
// fmadds no longer pace the loads). Inf or NaN anywhere makes the sum Inf or
// NaN (a square of a finite float cannot overflow a double, nor can any sum
// of them), so the sum alone tells non-finite values apart, with no compare
// per vector. Two streams, the first and the second half, 16 values of each
// a step, each hinted 4 KiB ahead. Without the hints (the shape of
// 2026-12-06 morning, tuned on AMD EPYC) one thread ran at 1.02-1.08 of the
// single-stream read rooflines there, with them 0.97-0.99; on an Intel Xeon
// (Sapphire Rapids class, 2026-12-06 evening) the same loop without hints
// ran at 0.61-0.74 of the fastest read roofline, one stream hinted at 0.88,
// two streams hinted at 0.94 (one thread) and 0.95-0.96 (two), with 2 or
// 8 KiB instead of 4 the same within noise (kernels_bench, 64M values,
// paired medians). Read only (scale 1), each half vector is widened
// straight from memory. On a later Intel Xeon (model 207) that loop ran at
// 0.89-0.92 of the fastest read roofline (one and two threads); with
// kIntelHints each stream's line 16 KiB ahead is also asked into L2, which
// took it to 1.05 there (a single stream so hinted: 1.00-1.02). Only the
// read-only loop takes them (the scaled loop has not been measured); AMD
// keeps the loop it was tuned with.
inline __m512d Square(__m512d x, __m512d acc) {
  return _mm512_fmadd_pd(x, x, acc);
}

constexpr uintptr_t kGradCheckL2PrefetchBytes = 16384;

template <bool kIntelHints>
void GradCheck(float* g, size_t n, float scale, double* sum, bool* non_finite) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd(), _mm512_setzero_pd()};
  const size_t half = n / 32 * 16;
  float* h = g + half;
  if (scale == 1.0f) {
    for (size_t i = 0; i < half; i += 16) {
      PrefetchAhead(g + i);
      PrefetchAhead(h + i);
      if (kIntelHints) {
        PrefetchToL2Ahead<kGradCheckL2PrefetchBytes>(g + i);
        PrefetchToL2Ahead<kGradCheckL2PrefetchBytes>(h + i);
      }
      acc[0] = Square(_mm512_cvtps_pd(_mm256_loadu_ps(g + i)), acc[0]);
      acc[1] = Square(_mm512_cvtps_pd(_mm256_loadu_ps(g + i + 8)), acc[1]);
      acc[2] = Square(_mm512_cvtps_pd(_mm256_loadu_ps(h + i)), acc[2]);
      acc[3] = Square(_mm512_cvtps_pd(_mm256_loadu_ps(h + i + 8)), acc[3]);
    }
  } else {
    const __m512 s = _mm512_set1_ps(scale);
    for (size_t i = 0; i < half; i += 16) {
      PrefetchAhead(g + i);
      PrefetchAhead(h + i);
      const __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(g + i), s);
      const __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(h + i), s);
      _mm512_storeu_ps(g + i, x0);
      _mm512_storeu_ps(h + i, x1);
      acc[0] = Square(_mm512_cvtps_pd(_mm512_castps512_ps256(x0)), acc[0]);
      acc[1] = Square(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x0, 1)), acc[1]);
      acc[2] = Square(_mm512_cvtps_pd(_mm512_castps512_ps256(x1)), acc[2]);
      acc[3] = Square(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x1, 1)), acc[3]);
    }
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]),
                                       _mm512_add_pd(acc[2], acc[3])));
  double total = 0;
  for (double l : lanes) total += l;
  *sum += total;
  *non_finite |= !std::isfinite(total);
  scalar::GradCheck(g + 2 * half, n - 2 * half, scale, sum, non_finite);
}

// Hints out's line ahead for writing only when it is a third stream (when
// it is a or b, a's read hint already brings the line).
void Add(float* out, const float* a, const float* b, size_t n) {
  const bool third = out != a && out != b;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    PrefetchAhead(a + i);
    PrefetchAhead(b + i);
    PrefetchAhead(a + i + 16);
    PrefetchAhead(b + i + 16);
    if (third) {
      PrefetchWriteAhead(out + i);
      PrefetchWriteAhead(out + i + 16);
    }
    const __m512 lo =
        _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    const __m512 hi =
        _mm512_add_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
    _mm512_storeu_ps(out + i, lo);
    _mm512_storeu_ps(out + i + 16, hi);
  }
  scalar::Add(out + i, a + i, b + i, n - i);
}

}  // namespace

// The quantizers differ by CPU maker, as measured (kernels_bench, 64M
// values, paired medians against the fastest f32->8 roofline shape, 2026-12):
// - int8: on AMD EPYC (Zen 4/5) AVX2's 256-bit loops ran at 0.88-0.92 (1.07
//   on one VM), every 512-bit version tried slower: 0.73-0.88 with the
//   hints in either pass or both, 0.64-0.89 as one pass finding a later
//   block's maximum while encoding; those narrowed each vector with
//   vpmovsdb. On an Intel Xeon (Sapphire Rapids class) AVX2's ran at
//   0.86-0.87 (one thread), the 512-bit loop above, narrowing four vectors
//   with two packs and a permute (PackCodes), at 0.92-0.94 (one and two
//   threads); it has not been measured on AMD, which keeps AVX2's.
// - fp8: the L2 hints 24 KiB ahead took the Intel Xeon from 0.88-0.90 to
//   0.91-0.92 (one and two threads; 16 or 32 KiB: 0.90-0.92), and the int8
//   quantizer there from 0.92-0.93 to 0.90-0.91. Both then sat at
//   0.84-0.90 of the fastest roofline on a later Intel Xeon (model 207); a
//   write hint for the output's line took int8 with the L2 hints to
//   0.95-0.98 and fp8 to 0.91-0.96 (one and two threads; without the L2
//   hints int8 0.91, fp8 0.88-0.90; the hint 1 or 4 KiB ahead instead of 2
//   the same within noise), so on Intel both quantizers give all the hints
//   (kIntelHints). On AMD neither has been measured; it keeps the loop it
//   was tuned with (0.93-0.97 there).
const KernelTable* Avx512KernelTableFor(Avx512Tuning tuning) {
  static const KernelTable intel = {
      AdamW,         Fp32ToBf16,      Bf16ToFp32,     Fp32ToFp16,
      Fp16ToFp32,    QuantizeInt8,    DequantizeInt8, QuantizeFp8<true>,
      DequantizeFp8, GradCheck<true>, Add};
  static const KernelTable other = {
      AdamW,          Fp32ToBf16,
      Bf16ToFp32,     Fp32ToFp16,
      Fp16ToFp32,     Avx2KernelTable()->quantize_int8,
      DequantizeInt8, QuantizeFp8<false>,
      DequantizeFp8,  GradCheck<false>,
      Add};
  return tuning == Avx512Tuning::kIntel ? &intel : &other;
}

const KernelTable* Avx512KernelTable() {
  __builtin_cpu_init();
  return Avx512KernelTableFor(__builtin_cpu_is("intel") ? Avx512Tuning::kIntel
                                                        : Avx512Tuning::kOther);
}

}  // namespace kernels
}  // namespace zshard
