// AVX2 (+FMA, F16C) kernels. Compiled with -mavx2 -mf16c and
// -ffp-contract=off, so each operation rounds exactly as the scalar
// reference does; remainders shorter than a vector run the reference loop.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/kernel_table.h"
#include "reference/scalar_kernels.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace {

// 8 lanes of uint32 (each <= 0xffff) to 8 uint16.
inline __m128i Pack16(__m256i r) {
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Hints the line kBytes past p into L1. The address is formed as an
// integer: past the end of a buffer the hint is dropped, and no pointer
// leaves it.
template <uintptr_t kBytes>
inline void PrefetchAhead(const void* p) {
  _mm_prefetch(
      reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kBytes),
      _MM_HINT_T0);
}

inline __m128i Bf16x8(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  return Pack16(_mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(quiet), nan)));
}

inline __m128i Fp16x8(__m256 p) {
  return _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <HalfType kHalf>
void AdamWLoop(float* param, const float* grad, float* m, float* v, size_t n,
               const AdamWConstants& c, void* half_out) {
  const __m256 b1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.step_size);
  const __m256 isb2 = _mm256_set1_ps(c.inv_sqrt_bc2), decay = _mm256_set1_ps(c.decay);
  const __m256 gs = _mm256_set1_ps(c.grad_scale);
  auto* half = static_cast<uint16_t*>(half_out);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(omb1, g));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), isb2), eps);
    const __m256 p = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(param + i), decay),
                                   _mm256_div_ps(_mm256_mul_ps(step, mi), denom));
    _mm256_storeu_ps(param + i, p);
    if constexpr (kHalf == HalfType::kBf16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i), Bf16x8(p));
    } else if constexpr (kHalf == HalfType::kFp16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i), Fp16x8(p));
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
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Bf16x8(_mm256_loadu_ps(in + i)));
  }
  scalar::Fp32ToBf16(in + i, out + i, n - i);
}

void Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
  scalar::Bf16ToFp32(in + i, out + i, n - i);
}

void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Fp16x8(_mm256_loadu_ps(in + i)));
  }
  scalar::Fp32ToFp16(in + i, out + i, n - i);
}

void Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(in + i))));
  }
  scalar::Fp16ToFp32(in + i, out + i, n - i);
}

// The largest of m's eight 32-bit lanes (unsigned).
inline uint32_t LanesMaxBits(__m256i m) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  uint32_t top = 0;
  for (uint32_t l : lanes) top = std::max(top, l);
  return top;
}

// max |x| over a block; Inf when any value is Inf or NaN (compared as
// integers: same order for non-negative floats, Inf/NaN above all finite).
float BlockAbsMax(const float* x, size_t len) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask));
  }
  uint32_t top = LanesMaxBits(_mm256_max_epu32(m0, m1));
  for (; i < len; ++i) top = std::max(top, FloatBits(x[i]) & 0x7fffffffu);
  return top >= 0x7f800000u ? INFINITY : BitsFloat(top);
}

// Stores the 8 codes of c (32-bit lanes, each a byte once the packs
// saturate, signed or not) at q.
template <bool kSigned>
inline void Store8Codes(__m256i c, void* q) {
  const __m128i lo = _mm256_castsi256_si128(c),
                hi = _mm256_extracti128_si256(c, 1);
  const __m128i w =
      kSigned ? _mm_packs_epi32(lo, hi) : _mm_packus_epi32(lo, hi);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q),
                   kSigned ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w));
}

// The same for the 32 codes of c0, c1, c2 and c3, in order: the packs of
// the 256-bit vectors and one lane permute, 4 instructions where
// Store8Codes takes 3 a vector.
template <bool kSigned>
inline void Store32Codes(__m256i c0, __m256i c1, __m256i c2, __m256i c3,
                         void* q) {
  const __m256i bytes = kSigned
                            ? _mm256_packs_epi16(_mm256_packs_epi32(c0, c1),
                                                 _mm256_packs_epi32(c2, c3))
                            : _mm256_packus_epi16(_mm256_packus_epi32(c0, c1),
                                                  _mm256_packus_epi32(c2, c3));
  // The packs work within 128-bit lanes: the low lane holds the first 4
  // codes of each vector, the high lane the last 4.
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(
                          bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// Writes the 32 codes of in[0, 32) * inv at q. `codes` maps 8 products to
// 8 codes in 32-bit lanes (codes(y)) and stores the codes of 32 products
// (codes.Store32(y0, y1, y2, y3, q)).
template <typename Out, typename Codes>
inline void Encode32(const float* in, Out* q, __m256 inv, Codes codes) {
  // Written out: GCC 12 at -O2 keeps a loop over the four in memory.
  codes.Store32(_mm256_mul_ps(_mm256_loadu_ps(in), inv),
                _mm256_mul_ps(_mm256_loadu_ps(in + 8), inv),
                _mm256_mul_ps(_mm256_loadu_ps(in + 16), inv),
                _mm256_mul_ps(_mm256_loadu_ps(in + 24), inv), q);
}

// Writes codes(in[i] * inv) for i in [0, len): 32 values a step, then 8,
// then scalar_code(in[i], inv) one by one. `codes` maps 8 products to 8
// codes in 32-bit lanes.
template <bool kSigned, typename Out, typename Codes, typename ScalarCode>
inline void EncodeBlock(const float* in, size_t len, Out* q, float inv_s,
                        Codes codes, ScalarCode scalar_code) {
  const __m256 inv = _mm256_set1_ps(inv_s);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    Encode32(in + i, q + i, inv, codes);
  }
  for (; i + 8 <= len; i += 8) {
    Store8Codes<kSigned>(codes(_mm256_mul_ps(_mm256_loadu_ps(in + i), inv)),
                         q + i);
  }
  for (; i < len; ++i) q[i] = scalar_code(in[i], inv_s);
}

// How far ahead the quantizers hint the block whose maximum they find (each
// of its lines once). On the development VM (AMD EPYC, Zen 3, 2026-12-07,
// kernels_bench, 64M values, paired medians against the f32->8 roofline,
// one / two threads): int8 1 KiB 0.77 / 0.80, 4 KiB 0.78 / 0.88, 8 KiB
// 0.83 / 0.85; fp8 0.63 / 0.60, 0.75 / 0.83, 0.71 / 0.51 (that run's two
// threads disturbed). 4 KiB.
constexpr size_t kMaxPrefetchBytes = 4096;

// The bits of |x[0..8)|, as integers ordered as the values (Inf and NaN
// above every finite value).
inline __m256i AbsBits(const float* x, __m256i abs_mask) {
  return _mm256_and_si256(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), abs_mask);
}

// max(m, AbsBits of x[0..32)), lane by lane.
inline __m256i MaxAbsBits32(__m256i m, const float* x, __m256i abs_mask) {
  return _mm256_max_epu32(
      _mm256_max_epu32(m, AbsBits(x, abs_mask)),
      _mm256_max_epu32(
          _mm256_max_epu32(AbsBits(x + 8, abs_mask), AbsBits(x + 16, abs_mask)),
          AbsBits(x + 24, abs_mask)));
}

// Encodes in[0, len) * inv into q (as EncodeBlock) while finding
// max |next[0, next_len)| (as BlockAbsMax), 32 values of each a step: the
// arithmetic of one block overlaps the memory reads of the next.
template <bool kSigned, typename Out, typename Codes, typename ScalarCode>
float EncodeAndFindMax(const float* in, size_t len, Out* q, float inv_s,
                       Codes codes, ScalarCode scalar_code, const float* next,
                       size_t next_len) {
  const __m256 inv = _mm256_set1_ps(inv_s);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  const size_t both = std::min(len, next_len) / 32 * 32;
  for (size_t i = 0; i < both; i += 32) {
    PrefetchAhead<kMaxPrefetchBytes>(next + i);
    PrefetchAhead<kMaxPrefetchBytes>(next + i + 16);
    if constexpr (Codes::kOpaqueIndex) asm volatile("" : "+r"(i));
    // One accumulator: with two, GCC 12 kept them in memory (the encoding's
    // constants take the other registers).
    m = MaxAbsBits32(m, next + i, abs_mask);
    Encode32(in + i, q + i, inv, codes);
  }
  EncodeBlock<kSigned>(in + both, len - both, q + both, inv_s, codes,
                       scalar_code);
  const uint32_t top = LanesMaxBits(m);
  const float rest = BlockAbsMax(next + both, next_len - both);
  return top >= 0x7f800000u ? INFINITY : std::max(BitsFloat(top), rest);
}

// One stream of blocks (QuantizeTwoStreams' remainder and fallback): block
// b is encoded while block b + 1's maximum is found (EncodeAndFindMax). Returns
// the first block holding Inf or NaN (it and the blocks after it are left
// unwritten), or kAllFinite. On the development VM (AMD EPYC, Zen 3,
// 2026-12-07, kernels_bench, 64M values, paired medians, one / two threads)
// AVX-512's loop (QuantizeInGroups: the maxima of 1024 values, then their
// encoding from L1) ran int8 at 0.72 / 0.75 of the roofline and fp8 at 0.45 /
// 0.44; this one at 0.70-0.80 / 0.81-0.85 and 0.77-0.78 / 0.82-0.89. Taking the
// blocks of the first and second half alternately, a whole block at a time,
// gave nothing (QuantizeTwoStreams takes them in lockstep, 32 values at a
// time).
template <bool kSigned, typename Out, typename Codes, typename ScalarCode>
size_t QuantizePipelined(const float* in, size_t n, size_t block, Out* q,
                         float* scales, float top, Codes codes,
                         ScalarCode scalar_code,
                         size_t (*scalar_quantize)(const float*, size_t, size_t,
                                                   Out*, float*)) {
  const size_t blocks = NumBlocks(n, block);
  if (blocks == 0) return kAllFinite;
  float amax = BlockAbsMax(in, std::min(block, n));
  for (size_t b = 0; b < blocks; ++b) {
    if (amax == INFINITY) return b;
    const size_t start = b * block, len = std::min(block, n - start);
    const size_t next = start + len,
                 next_len = b + 1 < blocks ? std::min(block, n - next) : 0;
    const QuantFactors f = BlockQuantFactors(amax, top);
    scales[b] = amax / top;
    if (f.pre != 1.0f) {  // max |x| < 2^-64: the reference's quantizer
      scalar_quantize(in + start, len, len, q + start, scales + b);
      amax = BlockAbsMax(in + next, next_len);
    } else {
      amax = EncodeAndFindMax<kSigned>(in + start, len, q + start, f.inv, codes,
                                       scalar_code, in + next, next_len);
    }
  }
  return kAllFinite;
}

// max over the 8 lanes of m (bits of |x|, as AbsBits), as a float; Inf when
// any is Inf or NaN.
inline float LanesAbsMax(__m256i m) {
  const uint32_t top = LanesMaxBits(m);
  return top >= 0x7f800000u ? INFINITY : BitsFloat(top);
}

// Encodes a[0, len) * inv_a into qa and b[0, len) * inv_b into qb while
// finding max |na[0, len)| and max |nb[0, len)| (as BlockAbsMax), 32 values
// of each a step: two streams in lockstep, as the split2 roofline reads,
// each hinted Codes::kTwoStreamPrefetchBytes ahead. len is a multiple of 32.
template <typename Out, typename Codes>
void EncodeTwoAndFindMax(const float* a, const float* b, size_t len, Out* qa,
                         Out* qb, float inv_a, float inv_b, Codes codes,
                         const float* na, const float* nb, float* max_a,
                         float* max_b) {
  const __m256 va = _mm256_set1_ps(inv_a), vb = _mm256_set1_ps(inv_b);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i ma = _mm256_setzero_si256(), mb = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += 32) {
    PrefetchAhead<Codes::kTwoStreamPrefetchBytes>(na + i);
    PrefetchAhead<Codes::kTwoStreamPrefetchBytes>(na + i + 16);
    PrefetchAhead<Codes::kTwoStreamPrefetchBytes>(nb + i);
    PrefetchAhead<Codes::kTwoStreamPrefetchBytes>(nb + i + 16);
    ma = MaxAbsBits32(ma, na + i, abs_mask);
    mb = MaxAbsBits32(mb, nb + i, abs_mask);
    Encode32(a + i, qa + i, va, codes);
    Encode32(b + i, qb + i, vb, codes);
  }
  *max_a = LanesAbsMax(ma);
  *max_b = LanesAbsMax(mb);
}

// The AVX2 quantizers: QuantizePipelined over two streams. The whole
// blocks are taken in pairs, block p of the first half with block p of the
// second (p + pairs), each pair encoded while the next pair's maxima are
// found (EncodeTwoAndFindMax). The blocks past the pairs, a block size that
// is not a multiple of 32, and everything from a pair holding a non-finite
// or tiny (max |x| < 2^-64) block on go through QuantizePipelined, so the
// first non-finite block is still the one reported. On the development VM
// (AMD EPYC, Zen 3, 2026-12-07, kernels_bench, 64M values, paired medians
// against the f32->8 roofline, one / two threads, interleaved, 2 rounds) one
// stream ran int8 at 0.80-0.83 / 0.83-0.89 and fp8 at 0.81-0.84 /
// 0.84-0.88; two streams, hinted 4 KiB ahead as one stream is, at
// 0.87-0.90 / 0.95-0.96 and 0.85-0.87 / 0.95-0.98 (kTwoStreamPrefetchBytes:
// nearer is faster still).
template <bool kSigned, typename Out, typename Codes, typename ScalarCode>
size_t QuantizeTwoStreams(const float* in, size_t n, size_t block, Out* q,
                          float* scales, float top, Codes codes,
                          ScalarCode scalar_code,
                          size_t (*scalar_quantize)(const float*, size_t,
                                                    size_t, Out*, float*)) {
  const size_t pairs = n / block / 2;
  auto from = [&](size_t b) {
    const size_t r = QuantizePipelined<kSigned>(
        in + b * block, n - b * block, block, q + b * block, scales + b, top,
        codes, scalar_code, scalar_quantize);
    return r == kAllFinite ? kAllFinite : b + r;
  };
  if (block % 32 != 0 || pairs == 0) return from(0);
  const size_t second = pairs * block;
  float amax_a = BlockAbsMax(in, block),
        amax_b = BlockAbsMax(in + second, block);
  for (size_t p = 0; p < pairs; ++p) {
    if (amax_a == INFINITY || amax_b == INFINITY) return from(p);
    const QuantFactors fa = BlockQuantFactors(amax_a, top),
                       fb = BlockQuantFactors(amax_b, top);
    if (fa.pre != 1.0f || fb.pre != 1.0f) return from(p);
    scales[p] = amax_a / top;
    scales[pairs + p] = amax_b / top;
    const size_t start = p * block;
    if (p + 1 < pairs) {
      EncodeTwoAndFindMax(in + start, in + second + start, block, q + start,
                          q + second + start, fa.inv, fb.inv, codes,
                          in + start + block, in + second + start + block,
                          &amax_a, &amax_b);
    } else {
      EncodeBlock<kSigned>(in + start, block, q + start, fa.inv, codes,
                           scalar_code);
      EncodeBlock<kSigned>(in + second + start, block, q + second + start,
                           fb.inv, codes, scalar_code);
    }
  }
  return 2 * pairs * block < n ? from(2 * pairs) : kAllFinite;
}

// int8 codes of products, rounded half to even (the codes of Encode32).
struct Int8Codes {
  // EncodeAndFindMax's index is hidden from the compiler (an empty asm
  // that may change it), so GCC 12 addresses the streams by index instead
  // of by strength-reduced pointers: on the development VM (AMD EPYC, Zen
  // 3, 2026-12-07, kernels_bench, 64M values, interleaved) the int8
  // quantizer then ran at 0.75-0.80 of the roofline on one thread where
  // it ran at 0.68-0.74 (two threads: 0.78-0.90 against 0.80-0.85). The
  // cause is not known: this VM exposes no cache or prefetch counters, and
  // the slower-issuing loop is the faster one, as the fp8 loop (more
  // arithmetic, same memory) is faster than the int8 one. fp8 gains
  // nothing from it (0.76-0.82 against 0.78-0.82).
  static constexpr bool kOpaqueIndex = true;
  // How far ahead QuantizeTwoStreams hints each stream. On the development
  // VM (as QuantizeTwoStreams, 2-3 rounds, one / two threads): 512 B
  // 0.86-0.90 / 0.89-0.94, 768 B 0.85-0.96 / 0.86-0.97, 1 KiB 0.92-0.94 /
  // 0.93-0.99 (0.91-0.99 / 0.84-0.98 with the opaque index, which this
  // loop does without), 1.5 KiB 0.86-0.94 / 0.90-0.94, 2 KiB 0.84-0.95 /
  // 0.83-0.96, 3 KiB 0.88-0.93 / 0.76-0.94, 4 KiB 0.84-0.90 / 0.88-0.96.
  static constexpr uintptr_t kTwoStreamPrefetchBytes = 1024;
  __m256i operator()(__m256 y) const { return _mm256_cvtps_epi32(y); }
  void Store32(__m256 y0, __m256 y1, __m256 y2, __m256 y3, void* q) const {
    Store32Codes<true>((*this)(y0), (*this)(y1), (*this)(y2), (*this)(y3), q);
  }
};

// int8 codes of x * inv, rounded half to even. |x * inv| <= 127 * (1 + 2^-23),
// since |x| <= max|x| and inv = 127 / max|x| rounded, so the saturating packs
// never clamp. Also the AVX-512 table's int8 quantizer on AMD and other
// non-Intel CPUs (see Avx512KernelTableFor).
size_t QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                    float* scales) {
  return QuantizeTwoStreams<true>(in, n, block, q, scales, 127.0f, Int8Codes(),
                                  QuantizeInt8Value, scalar::QuantizeInt8);
}

// Block-wise dequantization: out = decode(8 codes, scales[b]) 8 values at a
// time, scalar(code, scales[b]) for a block's last few. As the AVX-512
// dequantizers, the whole blocks go in pairs, block b with block b + pairs,
// 32 codes of each in turn: one core then reads two streams and writes two,
// and its prefetchers keep more lines in flight than over one. On the
// development VM (AMD EPYC, Zen 3, 2026-12-07, kernels_bench, 64M values,
// paired medians, one / two threads) one block at a time ran int8 at 0.87 /
// 0.85 of the roofline and fp8 at 0.78 / 0.85; the pairs at 0.99-1.01 /
// 1.00-1.02 and 0.90-0.93 / 0.96-0.97. Each value is computed as before:
// the same bits.
template <typename Decode, typename Scalar, typename Code>
void DequantizeBlocks(const Code* q, const float* scales, size_t n,
                      size_t block, float* out, Decode decode, Scalar scalar) {
  auto load8 = [](const Code* c) {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c));
  };
  // len codes at c into o, scaled by s (= scale).
  auto run = [&](const Code* c, float* o, size_t len, __m256 s, float scale) {
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      _mm256_storeu_ps(o + i, decode(load8(c + i), s));
    }
    for (; i < len; ++i) o[i] = scalar(c[i], scale);
  };
  const size_t pairs = n / block / 2;
  const size_t whole = block / 32 * 32;
  for (size_t b = 0; b < pairs; ++b) {
    const size_t a0 = b * block, a1 = (b + pairs) * block;
    const __m256 s0 = _mm256_set1_ps(scales[b]),
                 s1 = _mm256_set1_ps(scales[b + pairs]);
    for (size_t i = 0; i < whole; i += 32) {
      const Code* c0 = q + a0 + i;
      const Code* c1 = q + a1 + i;
      float* o0 = out + a0 + i;
      float* o1 = out + a1 + i;
      _mm256_storeu_ps(o0, decode(load8(c0), s0));
      _mm256_storeu_ps(o0 + 8, decode(load8(c0 + 8), s0));
      _mm256_storeu_ps(o0 + 16, decode(load8(c0 + 16), s0));
      _mm256_storeu_ps(o0 + 24, decode(load8(c0 + 24), s0));
      _mm256_storeu_ps(o1, decode(load8(c1), s1));
      _mm256_storeu_ps(o1 + 8, decode(load8(c1 + 8), s1));
      _mm256_storeu_ps(o1 + 16, decode(load8(c1 + 16), s1));
      _mm256_storeu_ps(o1 + 24, decode(load8(c1 + 24), s1));
    }
    run(q + a0 + whole, out + a0 + whole, block - whole, s0, scales[b]);
    run(q + a1 + whole, out + a1 + whole, block - whole, s1, scales[b + pairs]);
  }
  for (size_t b = 2 * pairs, start = b * block; start < n;
       ++b, start += block) {
    run(q + start, out + start, std::min(block, n - start),
        _mm256_set1_ps(scales[b]), scales[b]);
  }
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                    size_t block, float* out) {
  DequantizeBlocks(
      q, scales, n, block, out,
      [](__m128i c, __m256 s) {
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s);
      },
      [](int8_t c, float scale) { return static_cast<float>(c) * scale; });
}

// e4m3 codes of products y = x * inv (the codes of Encode32), by the step
// counting of Fp8Codes in avx512_kernels.cc: s = |y| + 2^(max(e, -6) + 20)
// rounds |y| to e4m3's step in s's low mantissa bits, and the code is
// 8 * exponent(s) + mantissa(s) - 1128, which one madd forms from s's two
// halves. The packs saturate (|y| <= 448 * (1 + 2^-23) rounds to 448).
struct Fp8Codes {
  static constexpr bool kOpaqueIndex = false;  // see Int8Codes
  // As Int8Codes': 1 KiB 0.85-0.95 / 0.90-0.95, 1.25 KiB 0.92-0.93 /
  // 0.94-0.97, 1.5 KiB 0.92-0.96 / 0.90-1.01, 1.75 KiB 0.79-0.88 /
  // 0.84-0.95, 2 KiB 0.89-0.96 / 0.92-0.95, 3 KiB 0.81-0.90 / 0.84-0.94,
  // 4 KiB 0.81-0.89 / 0.84-0.98.
  static constexpr uintptr_t kTwoStreamPrefetchBytes = 1536;
  // 16 * (code + 1128) of |y|, in 32-bit lanes (< 2^15).
  static __m256i Steps16(__m256 y) {
    const __m256i u = _mm256_castps_si256(y);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i m = _mm256_add_epi32(
        _mm256_max_epu32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)),
                         _mm256_set1_epi32(121 << 23)),
        _mm256_set1_epi32(20 << 23));
    const __m256i s = _mm256_castps_si256(
        _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(m)));
    return _mm256_madd_epi16(s, _mm256_set1_epi32(0x00010010));
  }

  __m256i operator()(__m256 y) const {
    return _mm256_or_si256(
        _mm256_sub_epi32(_mm256_srli_epi32(Steps16(y), 4),
                         _mm256_set1_epi32(1128)),
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 24),
                         _mm256_set1_epi32(0x80)));
  }

  // The shift, offset and sign of 32 codes at once: the offset and shift
  // on 16-bit lanes, the sign on bytes (the signed packs of the products'
  // bits saturate a negative one to 0x80). 41 vector operations where
  // four Fp8Codes and Store32Codes take 52. On the development VM (AMD
  // EPYC, Zen 3, 2026-12-07, kernels_bench, interleaved): from cache
  // (262144 values) 22.1-24.3 GB/s where those ran at 19.6-20.2; at 64M
  // values 0.79-0.80 / 0.87-0.88 of the roofline on one / two threads,
  // where they ran at 0.75-0.78 / 0.82-0.84.
  void Store32(__m256 y0, __m256 y1, __m256 y2, __m256 y3, void* q) const {
    const __m256i k1128 = _mm256_set1_epi16(1128);
    const __m256i c01 = _mm256_sub_epi16(
        _mm256_srli_epi16(_mm256_packs_epi32(Steps16(y0), Steps16(y1)), 4),
        k1128);
    const __m256i c23 = _mm256_sub_epi16(
        _mm256_srli_epi16(_mm256_packs_epi32(Steps16(y2), Steps16(y3)), 4),
        k1128);
    const __m256i sign = _mm256_and_si256(
        _mm256_packs_epi16(_mm256_packs_epi32(_mm256_castps_si256(y0),
                                              _mm256_castps_si256(y1)),
                           _mm256_packs_epi32(_mm256_castps_si256(y2),
                                              _mm256_castps_si256(y3))),
        _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i bytes = _mm256_or_si256(_mm256_packus_epi16(c01, c23), sign);
    // The packs work within 128-bit lanes (see Store32Codes).
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(
                            bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
};

// e4m3 codes of x * inv.
size_t QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                   float* scales) {
  return QuantizeTwoStreams<false>(
      in, n, block, q, scales, 448.0f, Fp8Codes(),
      [](float x, float inv) { return Fp32ToE4M3Bits(x * inv); },
      scalar::QuantizeFp8);
}

// 8 e4m3 codes (the low 8 bytes of c) as floats times s. As AVX-512's
// Fp8Values: a code's magnitude bits shifted left by 7 are an fp16 number
// 2^8 times smaller (exponent bias 15 against 7; the subnormals line up
// too), converted by one vcvtph2ps; the sign extension of the codes to 16
// bits puts each sign at bit 15 once bit 14 is cleared. Both products
// are exact but the last, which rounds as the reference's value * scale
// does, for any scale. On the development VM (AMD EPYC, Zen 3,
// 2026-12-07, kernels_bench, 64M values, paired medians, one / two
// threads, 3 rounds interleaved) the decoding by integer fields, 16 vector
// operations where this takes 6, ran at 0.85-0.87 / 0.84-0.92 of the
// roofline, this at 0.94-0.95 / 0.94-0.97 (from cache: 24.6 and 47.7
// GB/s on one thread).
inline __m256 Fp8Values(__m128i codes, __m256 s) {
  const __m128i half =
      _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7),
                    _mm_set1_epi16(static_cast<int16_t>(0xbf80)));
  return _mm256_mul_ps(
      _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f)), s);
}

void DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                   size_t block, float* out) {
  DequantizeBlocks(
      q, scales, n, block, out,
      [](__m128i c, __m256 s) { return Fp8Values(c, s); },
      [](uint8_t c, float scale) { return E4M3BitsToFp32(c) * scale; });
}

// x's 8 values squared in double and added to lo (the first 4) and hi.
inline void AddSquares(__m256 x, __m256d* lo, __m256d* hi) {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  *lo = _mm256_fmadd_pd(a, a, *lo);
  *hi = _mm256_fmadd_pd(b, b, *hi);
}

// How far ahead the gradient check hints each of its four streams. On the
// development VM (AMD EPYC, Zen 3, 2026-12-07, 64M values, one thread, a
// standalone copy of the loop, medians of 25 interleaved runs): 1 KiB 23.5-23.8
// GB/s, 2 KiB 21.9-22.3, 4 KiB 18.0, none 19.6-19.8, against 22.8-23.3 for a
// plain four-stream read (kernels_bench's split4 shape).
constexpr uintptr_t kGradCheckPrefetchBytes = 1024;

// Loads 8 floats at p, with kScale multiplied by s and written back.
template <bool kScale>
inline __m256 LoadScaled(float* p, __m256 s) {
  __m256 x = _mm256_loadu_ps(p);
  if constexpr (kScale) {
    x = _mm256_mul_ps(x, s);
    _mm256_storeu_ps(p, x);
  }
  return x;
}

// The sum of the squares of the four runs q[k][0, len) (k < 4), in double,
// 16 values of each a step (each stream's line hinted kGradCheckPrefetchBytes
// ahead), into eight accumulators; with kScale the values are first
// multiplied by s and written back. len must be a multiple of 16. Four
// streams, not two: on the development VM (AMD EPYC, Zen 3, 2026-12-07) one
// core read 64M floats at 22.8-23.3 GB/s over four streams against 19.8-20.7
// over two, and the two-stream loop (hinted 2 KiB ahead) ran at 0.85-0.91 of
// the two-stream read in kernels_bench. Named accumulators and an unrolled
// step, not arrays and a loop: GCC 12 kept those in memory, each
// accumulator's load, fmadd and store a chain through the stack (a copy of
// that loop ran at 22 GB/s from L1).
template <bool kScale>
double SumSquaresFourStreams(float* q0, float* q1, float* q2, float* q3,
                             size_t len, __m256 s) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
          a6 = a0, a7 = a0;
  for (size_t i = 0; i < len; i += 16) {
    PrefetchAhead<kGradCheckPrefetchBytes>(q0 + i);
    PrefetchAhead<kGradCheckPrefetchBytes>(q1 + i);
    PrefetchAhead<kGradCheckPrefetchBytes>(q2 + i);
    PrefetchAhead<kGradCheckPrefetchBytes>(q3 + i);
    AddSquares(LoadScaled<kScale>(q0 + i, s), &a0, &a1);
    AddSquares(LoadScaled<kScale>(q1 + i, s), &a2, &a3);
    AddSquares(LoadScaled<kScale>(q2 + i, s), &a4, &a5);
    AddSquares(LoadScaled<kScale>(q3 + i, s), &a6, &a7);
    AddSquares(LoadScaled<kScale>(q0 + i + 8, s), &a0, &a1);
    AddSquares(LoadScaled<kScale>(q1 + i + 8, s), &a2, &a3);
    AddSquares(LoadScaled<kScale>(q2 + i + 8, s), &a4, &a5);
    AddSquares(LoadScaled<kScale>(q3 + i + 8, s), &a6, &a7);
  }
  const __m256d total4 = _mm256_add_pd(
      _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)),
      _mm256_add_pd(_mm256_add_pd(a4, a5), _mm256_add_pd(a6, a7)));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, total4);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// Squares summed in double over four streams, the quarters of g
// (SumSquaresFourStreams), the rest by the reference; Inf or NaN told by the
// sum alone (a square of a finite float cannot overflow a double, nor can any
// sum of them). One stream with a compare per vector and two chains of
// fmadds ran at 0.58 of the read roofline on AVX-512.
void GradCheck(float* g, size_t n, float scale, double* sum, bool* non_finite) {
  const size_t q = n / 64 * 16;
  const __m256 s = _mm256_set1_ps(scale);
  const double total =
      scale != 1.0f
          ? SumSquaresFourStreams<true>(g, g + q, g + 2 * q, g + 3 * q, q, s)
          : SumSquaresFourStreams<false>(g, g + q, g + 2 * q, g + 3 * q, q, s);
  *sum += total;
  *non_finite |= !std::isfinite(total);
  scalar::GradCheck(g + 4 * q, n - 4 * q, scale, sum, non_finite);
}

void Add(float* out, const float* a, const float* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 lo = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    const __m256 hi =
        _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    _mm256_storeu_ps(out + i, lo);
    _mm256_storeu_ps(out + i + 8, hi);
  }
  scalar::Add(out + i, a + i, b + i, n - i);
}

}  // namespace

const KernelTable* Avx2KernelTable() {
  static const KernelTable table = {
      AdamW,          Fp32ToBf16,  Bf16ToFp32,    Fp32ToFp16,
      Fp16ToFp32,     QuantizeInt8, DequantizeInt8, QuantizeFp8,
      DequantizeFp8,  GradCheck,    Add};
  return &table;
}

}  // namespace kernels
}  // namespace zshard
