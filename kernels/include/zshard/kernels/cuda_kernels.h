// The kernels for NVIDIA GPUs (built when nvcc is found; sm_80 and sm_90).
// Same contracts and the same bits as the reference (compiled without FMA
// contraction, IEEE division and square root); GradCheck's sum may differ in
// summation order. Pointers are device pointers; `stream` is a cudaStream_t
// (null: the default stream). Calls are asynchronous on the stream unless
// they return a value that needs the result (quantize, gradient check),
// which wait for it. No CUDA header is needed to use this one.
#ifndef ZSHARD_KERNELS_CUDA_KERNELS_H_
#define ZSHARD_KERNELS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/grad_check.h"

namespace zshard {
namespace kernels {
namespace cuda {

// Number of visible CUDA devices (0 when there is none or no driver).
int DeviceCount();

// Device memory helpers, so callers need no CUDA headers. Synchronous.
absl::StatusOr<void*> Malloc(size_t bytes);
absl::Status Free(void* ptr);
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
absl::Status Synchronize(void* stream = nullptr);

absl::Status AdamW(float* param, const float* grad, float* m, float* v,
                   size_t n, const AdamWStep& hp, void* half_out = nullptr,
                   void* stream = nullptr);
absl::Status Fp32ToBf16(const float* in, uint16_t* out, size_t n,
                        void* stream = nullptr);
absl::Status Bf16ToFp32(const uint16_t* in, float* out, size_t n,
                        void* stream = nullptr);
absl::Status Fp32ToFp16(const float* in, uint16_t* out, size_t n,
                        void* stream = nullptr);
absl::Status Fp16ToFp32(const uint16_t* in, float* out, size_t n,
                        void* stream = nullptr);
// Block until done (they report non-finite blocks).
absl::Status QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                          float* scales, void* stream = nullptr);
absl::Status QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                         float* scales, void* stream = nullptr);
absl::Status DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                            size_t block, float* out, void* stream = nullptr);
absl::Status DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                           size_t block, float* out, void* stream = nullptr);
absl::StatusOr<GradCheckResult> GradCheck(float* grad, size_t n,
                                          float scale = 1.0f,
                                          void* stream = nullptr);

}  // namespace cuda
}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CUDA_KERNELS_H_
