// Internal: one instruction set's implementation of every kernel, over a
// range, with arguments already validated. The reference (scalar) table is
// the definition; SIMD tables must produce the same bits (GradCheck's sum
// excepted: its summation order may differ).
#ifndef ZSHARD_KERNELS_CPU_KERNEL_TABLE_H_
#define ZSHARD_KERNELS_CPU_KERNEL_TABLE_H_

#include <cstddef>
#include <cstdint>

#include "zshard/kernels/adamw.h"

namespace zshard {
namespace kernels {

// Returned by the quantizers when every block was finite.
constexpr size_t kAllFinite = ~size_t{0};

struct KernelTable {
  // `half_out` points at element 0 of this range (or is null).
  void (*adamw)(float* p, const float* g, float* m, float* v, size_t n,
                const AdamWConstants& c, HalfType half_type, void* half_out);
  void (*fp32_to_bf16)(const float* in, uint16_t* out, size_t n);
  void (*bf16_to_fp32)(const uint16_t* in, float* out, size_t n);
  void (*fp32_to_fp16)(const float* in, uint16_t* out, size_t n);
  void (*fp16_to_fp32)(const uint16_t* in, float* out, size_t n);
  // Return the index of the first block with a non-finite value, or
  // kAllFinite. `n` may end in a partial block.
  size_t (*quantize_int8)(const float* in, size_t n, size_t block, int8_t* q,
                          float* scales);
  void (*dequantize_int8)(const int8_t* q, const float* scales, size_t n,
                          size_t block, float* out);
  size_t (*quantize_fp8)(const float* in, size_t n, size_t block, uint8_t* q,
                         float* scales);
  void (*dequantize_fp8)(const uint8_t* q, const float* scales, size_t n,
                         size_t block, float* out);
  // Adds this range's sum of squares to *sum and ORs its non-finite flag.
  void (*grad_check)(float* g, size_t n, float scale, double* sum,
                     bool* non_finite);
  // out[i] = a[i] + b[i]; out may be a or b (sum[i] += x[i] is
  // add(sum, sum, x)).
  void (*add)(float* out, const float* a, const float* b, size_t n);
};

const KernelTable& ScalarKernelTable();
// Null when the variant was not compiled in.
const KernelTable* Avx2KernelTable();
const KernelTable* Avx512KernelTable();

// Whose cores an AVX-512 table is tuned for (its quantizers differ; see
// avx512_kernels.cc). Avx512KernelTable() is the one for this CPU's maker;
// tests check both on any AVX-512 CPU.
enum class Avx512Tuning { kIntel, kOther };
const KernelTable* Avx512KernelTableFor(Avx512Tuning tuning);

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CPU_KERNEL_TABLE_H_
