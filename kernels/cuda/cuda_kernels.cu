// CUDA versions of the kernels. The element arithmetic is the reference's own
// (reference/adamw_element.h, cast.h, quantize.h compiled for the device);
// this file only maps it onto threads. Built with -fmad=false.
#include <cuda_runtime.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "reference/adamw_element.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/cuda_kernels.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

absl::Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(err)));
}

// Grid for a grid-stride loop over n elements.
unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

absl::Status Launched(const char* what) {
  return Check(cudaGetLastError(), what);
}

template <HalfType kHalf>
__global__ void AdamWKernel(float* p, const float* g, float* m, float* v,
                            size_t n, AdamWConstants c, uint16_t* half) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float mi = m[i], vi = v[i];
    const float pi = AdamWElement(p[i], g[i], &mi, &vi, c);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (kHalf == HalfType::kBf16) half[i] = Fp32ToBf16Bits(pi);
    if constexpr (kHalf == HalfType::kFp16) half[i] = Fp32ToFp16Bits(pi);
  }
}

__global__ void ToBf16Kernel(const float* in, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Fp32ToBf16Bits(in[i]);
  }
}
__global__ void FromBf16Kernel(const uint16_t* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Bf16BitsToFp32(in[i]);
  }
}
__global__ void ToFp16Kernel(const float* in, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Fp32ToFp16Bits(in[i]);
  }
}
__global__ void FromFp16Kernel(const uint16_t* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = Fp16BitsToFp32(in[i]);
  }
}

// One CUDA block per quantization block: max |x| by a shared-memory
// reduction, then each thread encodes its elements.
template <bool kFp8, typename Out>
__global__ void QuantizeKernel(const float* in, size_t n, size_t block,
                               Out* q, float* scales, unsigned long long* bad) {
  __shared__ float amax_s[kThreads];
  for (size_t b = blockIdx.x; b * block < n; b += gridDim.x) {
    const size_t start = b * block;
    const size_t len = min(block, n - start);
    float amax = 0.0f;
    int finite = 1;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
      const float a = fabsf(in[start + i]);
      finite &= isfinite(a);
      amax = fmaxf(amax, a);
    }
    amax_s[threadIdx.x] = amax;
    const int all_finite = __syncthreads_and(finite);
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) amax_s[threadIdx.x] = fmaxf(amax_s[threadIdx.x], amax_s[threadIdx.x + s]);
      __syncthreads();
    }
    amax = amax_s[0];
    if (!all_finite) {
      if (threadIdx.x == 0) atomicMin(bad, static_cast<unsigned long long>(b));
      __syncthreads();
      continue;
    }
    const float top = kFp8 ? 448.0f : 127.0f;
    const QuantFactors f = BlockQuantFactors(amax, top);
    if (threadIdx.x == 0) scales[b] = amax / top;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
      if constexpr (kFp8) {
        q[start + i] = Fp32ToE4M3Bits((in[start + i] * f.pre) * f.inv);
      } else {
        q[start + i] = QuantizeInt8Value(in[start + i] * f.pre, f.inv);
      }
    }
    __syncthreads();  // amax_s is reused by the next block
  }
}

template <bool kFp8, typename In>
__global__ void DequantizeKernel(const In* q, const float* scales, size_t n,
                                 size_t block, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if constexpr (kFp8) {
      out[i] = E4M3BitsToFp32(q[i]) * scales[i / block];
    } else {
      out[i] = static_cast<float>(q[i]) * scales[i / block];
    }
  }
}

__global__ void GradCheckKernel(float* g, size_t n, float scale, double* sum,
                                int* non_finite) {
  __shared__ double part[kThreads];
  double s = 0;
  int bad = 0;
  const bool write = scale != 1.0f;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float x = g[i];
    if (write) {
      x = x * scale;
      g[i] = x;
    }
    bad |= !isfinite(x);
    s += static_cast<double>(x) * static_cast<double>(x);
  }
  part[threadIdx.x] = s;
  const int any_bad = __syncthreads_or(bad);
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(sum, part[0]);
    if (any_bad) atomicOr(non_finite, 1);
  }
}

template <bool kFp8, typename Out>
absl::Status Quantize(const float* in, size_t n, size_t block, Out* q,
                      float* scales, void* stream) {
  absl::Status st = CheckQuantizeArgs(in, q, scales, n, block);
  if (!st.ok() || n == 0) return st;
  unsigned long long* bad = nullptr;
  st = Check(cudaMallocAsync(reinterpret_cast<void**>(&bad), sizeof(*bad), Stream(stream)),
             "allocating a flag");
  if (!st.ok()) return st;
  const unsigned long long none = ULLONG_MAX;
  st = Check(cudaMemcpyAsync(bad, &none, sizeof(none), cudaMemcpyHostToDevice,
                             Stream(stream)),
             "clearing a flag");
  const size_t blocks = NumBlocks(n, block);
  if (st.ok()) {
    QuantizeKernel<kFp8><<<static_cast<unsigned>(blocks < 65535 * 4 ? blocks : 65535 * 4),
                           kThreads, 0, Stream(stream)>>>(in, n, block, q, scales, bad);
    st = Launched("quantize");
  }
  unsigned long long first = ULLONG_MAX;
  if (st.ok()) {
    st = Check(cudaMemcpyAsync(&first, bad, sizeof(first), cudaMemcpyDeviceToHost,
                               Stream(stream)),
               "reading a flag");
  }
  cudaFreeAsync(bad, Stream(stream));
  if (st.ok()) st = Check(cudaStreamSynchronize(Stream(stream)), "quantize");
  if (st.ok() && first != ULLONG_MAX) {
    return NonFiniteBlockError(first);
  }
  return st;
}

}  // namespace

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

absl::StatusOr<void*> Malloc(size_t bytes) {
  void* p = nullptr;
  absl::Status st = Check(cudaMalloc(&p, bytes), "cudaMalloc");
  if (!st.ok()) return st;
  return p;
}
absl::Status Free(void* ptr) { return Check(cudaFree(ptr), "cudaFree"); }
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}
absl::Status CopyToHost(void* dst, const void* src, size_t bytes) {
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}
absl::Status Synchronize(void* stream) {
  return Check(cudaStreamSynchronize(Stream(stream)), "synchronize");
}

absl::Status AdamW(float* p, const float* g, float* m, float* v, size_t n,
                   const AdamWStep& hp, void* half_out, void* stream) {
  if (n > 0 && (!p || !g || !m || !v ||
                (hp.half_type != HalfType::kNone && !half_out))) {
    return absl::InvalidArgumentError("AdamW: null buffer");
  }
  AdamWConstants c;
  absl::Status st = MakeAdamWConstants(hp, &c);
  if (!st.ok() || n == 0) return st;
  auto* half = static_cast<uint16_t*>(half_out);
  switch (hp.half_type) {
    case HalfType::kNone:
      AdamWKernel<HalfType::kNone><<<Blocks(n), kThreads, 0, Stream(stream)>>>(p, g, m, v, n, c, half);
      break;
    case HalfType::kBf16:
      AdamWKernel<HalfType::kBf16><<<Blocks(n), kThreads, 0, Stream(stream)>>>(p, g, m, v, n, c, half);
      break;
    case HalfType::kFp16:
      AdamWKernel<HalfType::kFp16><<<Blocks(n), kThreads, 0, Stream(stream)>>>(p, g, m, v, n, c, half);
      break;
  }
  return Launched("AdamW");
}

#define ZS_CAST(Name, Kernel, In, Out)                                      \
  absl::Status Name(const In* in, Out* out, size_t n, void* stream) {      \
    if (n > 0 && (!in || !out)) {                                           \
      return absl::InvalidArgumentError("cast: null buffer");               \
    }                                                                       \
    if (n == 0) return absl::OkStatus();                                    \
    Kernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(in, out, n);         \
    return Launched(#Name);                                                 \
  }
ZS_CAST(Fp32ToBf16, ToBf16Kernel, float, uint16_t)
ZS_CAST(Bf16ToFp32, FromBf16Kernel, uint16_t, float)
ZS_CAST(Fp32ToFp16, ToFp16Kernel, float, uint16_t)
ZS_CAST(Fp16ToFp32, FromFp16Kernel, uint16_t, float)
#undef ZS_CAST

absl::Status QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                          float* scales, void* stream) {
  return Quantize<false>(in, n, block, q, scales, stream);
}
absl::Status QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                         float* scales, void* stream) {
  return Quantize<true>(in, n, block, q, scales, stream);
}

absl::Status DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                            size_t block, float* out, void* stream) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (!st.ok() || n == 0) return st;
  DequantizeKernel<false><<<Blocks(n), kThreads, 0, Stream(stream)>>>(q, scales, n, block, out);
  return Launched("dequantize int8");
}
absl::Status DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                           size_t block, float* out, void* stream) {
  absl::Status st = CheckQuantizeArgs(q, scales, out, n, block);
  if (!st.ok() || n == 0) return st;
  DequantizeKernel<true><<<Blocks(n), kThreads, 0, Stream(stream)>>>(q, scales, n, block, out);
  return Launched("dequantize fp8");
}

absl::StatusOr<GradCheckResult> GradCheck(float* g, size_t n, float scale,
                                          void* stream) {
  if (n > 0 && !g) return absl::InvalidArgumentError("gradient check: null buffer");
  if (!isfinite(scale)) {
    return absl::InvalidArgumentError("gradient check: non-finite scale");
  }
  GradCheckResult r;
  if (n == 0) return r;
  struct Acc {
    double sum;
    int bad;
  };
  Acc* acc = nullptr;
  absl::Status st = Check(
      cudaMallocAsync(reinterpret_cast<void**>(&acc), sizeof(Acc), Stream(stream)),
      "allocating an accumulator");
  if (!st.ok()) return st;
  st = Check(cudaMemsetAsync(acc, 0, sizeof(Acc), Stream(stream)), "clearing");
  if (st.ok()) {
    const unsigned blocks = Blocks(n) < 1024 ? Blocks(n) : 1024;
    GradCheckKernel<<<blocks, kThreads, 0, Stream(stream)>>>(g, n, scale, &acc->sum,
                                                              &acc->bad);
    st = Launched("gradient check");
  }
  Acc host{0, 0};
  if (st.ok()) {
    st = Check(cudaMemcpyAsync(&host, acc, sizeof(Acc), cudaMemcpyDeviceToHost,
                               Stream(stream)),
               "reading the sum");
  }
  cudaFreeAsync(acc, Stream(stream));
  if (st.ok()) st = Check(cudaStreamSynchronize(Stream(stream)), "gradient check");
  if (!st.ok()) return st;
  r.sum_squares = host.sum;
  r.non_finite = host.bad != 0;
  return r;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace zshard
