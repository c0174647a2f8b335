// Internal: the AVX-512 quantizers' block loop (AVX2's pipelines its two
// passes instead: QuantizePipelined in avx2_kernels.cc). Blocks are taken in
// groups of at least kQuantGroup values: first the maxima and scales of the
// group's blocks, then their encoding.
// Measured on the development VMs (fp8, 64M values, one thread, AVX-512):
// groups of 1024 values ran at 21-23 GB/s where one block of 256 at a time ran
// at 15-18; the encoding pass, heavy on arithmetic and served from L1, leaves
// memory idle, and that costs less when each stretch of streaming reads is
// longer.
#ifndef ZSHARD_KERNELS_CPU_QUANTIZE_GROUPS_H_
#define ZSHARD_KERNELS_CPU_QUANTIZE_GROUPS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "cpu/kernel_table.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {

constexpr size_t kQuantGroup = 1024;

// Quantizes n values (the last block may be short) with top 127 or 448.
// abs_max(x, len) -> max |x|, or INFINITY when the block holds Inf or NaN;
// encode(x, len, out, inv) writes the codes of x * inv; scalar_quantize is
// the reference's quantizer (scalar::QuantizeInt8 or QuantizeFp8), run on a
// single block whose BlockQuantFactors need pre != 1 (max |x| < 2^-64:
// rare). Returns the first block holding Inf or NaN (blocks before it in its
// group are left unwritten), or kAllFinite.
template <typename Out, typename AbsMax, typename Encode>
size_t QuantizeInGroups(const float* in, size_t n, size_t block, Out* q,
                        float* scales, float top, AbsMax abs_max, Encode encode,
                        size_t (*scalar_quantize)(const float*, size_t, size_t, Out*,
                                                  float*)) {
  const size_t group_blocks = std::max<size_t>(1, kQuantGroup / block);
  const size_t blocks = NumBlocks(n, block);
  float inv[kQuantGroup / kMinQuantBlock];  // < 0: to scalar_quantize
  for (size_t g = 0; g < blocks; g += group_blocks) {
    const size_t end = std::min(blocks, g + group_blocks);
    for (size_t b = g; b < end; ++b) {
      const size_t start = b * block;
      const float amax = abs_max(in + start, std::min(block, n - start));
      if (amax == INFINITY) return b;
      const QuantFactors f = BlockQuantFactors(amax, top);
      scales[b] = amax / top;
      inv[b - g] = f.pre == 1.0f ? f.inv : -1.0f;
    }
    for (size_t b = g; b < end; ++b) {
      const size_t start = b * block, len = std::min(block, n - start);
      if (inv[b - g] < 0.0f) {
        scalar_quantize(in + start, len, len, q + start, scales + b);
      } else {
        encode(in + start, len, q + start, inv[b - g]);
      }
    }
  }
  return kAllFinite;
}

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CPU_QUANTIZE_GROUPS_H_
