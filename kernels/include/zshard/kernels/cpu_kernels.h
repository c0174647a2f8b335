// CpuKernels: the CPU kernels with the instruction set chosen at run time
// (AVX-512, AVX2 or scalar, from cpuid; ZSHARD_KERNELS_ISA=scalar|avx2|avx512
// overrides) and a persistent pool of threads that splits large slices.
// Every variant gives the same bits as the reference, except GradCheck's sum
// (summation order differs; relative difference below 1e-12).
//
// Thread-safety: one call at a time per object (the pool is shared by the
// call); create one object per thread that needs kernels concurrently. An
// object made with threads = 1 has no pool: any number of threads may call
// it at once.
#ifndef ZSHARD_KERNELS_CPU_KERNELS_H_
#define ZSHARD_KERNELS_CPU_KERNELS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "zshard/kernels/accumulate.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/grad_check.h"

namespace zshard {
namespace kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* IsaName(Isa isa);
// INVALID_ARGUMENT naming the text unless it is scalar, avx2 or avx512.
absl::StatusOr<Isa> ParseIsa(const std::string& name);
// Whether this CPU (and OS) can run `isa`.
bool IsaSupported(Isa isa);
// The best supported ISA.
Isa BestIsa();

struct CpuKernelsOptions {
  // Threads a large call is split over (the caller's own thread included).
  int threads = 1;
  // Unset: $ZSHARD_KERNELS_ISA if set, else BestIsa().
  std::optional<Isa> isa;
  // Calls on fewer elements than this run on the calling thread alone.
  size_t min_parallel_elements = 1 << 16;
};

class KernelPool;
struct KernelTable;

class CpuKernels {
 public:
  // INVALID_ARGUMENT when threads < 1, $ZSHARD_KERNELS_ISA is not a known
  // name, or the ISA asked for is not supported here.
  static absl::StatusOr<std::unique_ptr<CpuKernels>> Create(
      const CpuKernelsOptions& options = {});
  ~CpuKernels();

  Isa isa() const { return isa_; }
  int threads() const { return threads_; }

  // Same contracts as the Reference* functions.
  absl::Status AdamW(float* param, const float* grad, float* m, float* v,
                     size_t n, const AdamWStep& hp, void* half_out = nullptr);
  absl::Status Fp32ToBf16(const float* in, uint16_t* out, size_t n);
  absl::Status Bf16ToFp32(const uint16_t* in, float* out, size_t n);
  absl::Status Fp32ToFp16(const float* in, uint16_t* out, size_t n);
  absl::Status Fp16ToFp32(const uint16_t* in, float* out, size_t n);
  absl::Status QuantizeInt8(const float* in, size_t n, size_t block, int8_t* q,
                            float* scales);
  absl::Status DequantizeInt8(const int8_t* q, const float* scales, size_t n,
                              size_t block, float* out);
  absl::Status QuantizeFp8(const float* in, size_t n, size_t block, uint8_t* q,
                           float* scales);
  absl::Status DequantizeFp8(const uint8_t* q, const float* scales, size_t n,
                             size_t block, float* out);
  absl::StatusOr<GradCheckResult> GradCheck(float* grad, size_t n,
                                            float scale = 1.0f);
  absl::Status Accumulate(float* sum, const float* x, size_t n);
  // out[i] = a[i] + b[i], the same bits as copying a to out and then
  // Accumulate(out, b); out may be a or b.
  absl::Status Add(float* out, const float* a, const float* b, size_t n);

 private:
  CpuKernels() = default;
  // Runs fn(begin, end, part) over `parts` contiguous ranges of [0, n) whose
  // starts are multiples of `align`; returns the number of parts used.
  template <typename Fn>
  int Parallel(size_t n, size_t align, Fn&& fn);
  template <typename Out, typename Quant>
  absl::Status QuantizeBlocks(const float* in, size_t n, size_t block, Out* q,
                              float* scales, Quant quant);

  Isa isa_ = Isa::kScalar;
  int threads_ = 1;
  size_t min_parallel_ = 0;
  const KernelTable* table_ = nullptr;
  std::unique_ptr<KernelPool> pool_;
};

}  // namespace kernels
}  // namespace zshard

#endif  // ZSHARD_KERNELS_CPU_KERNELS_H_
