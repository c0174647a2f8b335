// Internal: the scalar reference loops (no validation), shared by the
// Reference* functions and the scalar KernelTable.
#ifndef ZSHARD_KERNELS_REFERENCE_SCALAR_KERNELS_H_
#define ZSHARD_KERNELS_REFERENCE_SCALAR_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "zshard/kernels/adamw.h"

namespace zshard {
namespace kernels {
namespace scalar {

void AdamW(float* p, const float* g, float* m, float* v, size_t n,
           const AdamWConstants& c, HalfType half_type, void* half_out);
void Fp32ToBf16(const float* in, uint16_t* out, size_t n);
void Bf16ToFp32(const uint16_t* in, float* out, size_t n);
void Fp32ToFp16(const float* in, uint16_t* out, size_t n);
void Fp16ToFp32(const uint16_t* in, float* out, size_t n);
size_t QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                    float* scales);
void DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                    size_t block, float* out);
size_t QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                   float* scales);
void DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                   size_t block, float* out);
void GradCheck(float* g, size_t n, float scale, double* sum, bool* non_finite);
// out[i] = a[i] + b[i]; out may be a or b.
void Add(float* out, const float* a, const float* b, size_t n);

}  // namespace scalar
}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_REFERENCE_SCALAR_KERNELS_H_
