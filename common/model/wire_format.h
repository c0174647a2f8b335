// WireFormat: how a slice's values travel on the data plane (DESIGN.md, "Data
// plane"): fp32, bf16, or block-wise quantized (ZeRO++'s qwZ / qgZ): int8 or
// fp8 (e4m3) codes with one fp32 scale per block of `block` elements. A
// quantized run of n values is laid out as its n one-byte codes, zero bytes
// up to a multiple of 4, then the ceil(n / block) scales; the blocks start at
// the run's first value. Servers and trainers read the same format from the
// shared ds_config (zero_optimization.zero_quantized_weights /
// zero_quantized_gradients, zshard_quantization), whose hash they compare at
// Join; the data plane names it with a v1::DType.
//
// Plain values; thread-compatible.
#ifndef ZSHARD_COMMON_MODEL_WIRE_FORMAT_H_
#define ZSHARD_COMMON_MODEL_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zshard/kernels/cpu_kernels.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

struct WireFormat {
  enum class Kind { kFp32, kBf16, kInt8, kFp8 };
  Kind kind = Kind::kFp32;
  // Quantized kinds: elements per scale (64..4096).
  uint32_t block = 256;

  static WireFormat Fp32() { return {}; }
  static WireFormat Bf16() { return {Kind::kBf16, 256}; }
  static WireFormat Quantized(Kind kind, uint32_t block) {
    return {kind, block};
  }

  bool quantized() const { return kind == Kind::kInt8 || kind == Kind::kFp8; }
  // Bytes of `n` values in this format (quantized: codes, padding, scales).
  uint64_t Bytes(uint64_t n) const;
  // Quantized kinds: where the scales of a run of `n` values start.
  static uint64_t ScalesOffset(uint64_t n) { return (n + 3) & ~uint64_t{3}; }
  // "fp32", "bf16", "int8" or "fp8".
  const char* name() const;
  v1::DType dtype() const;
  bool operator==(const WireFormat& o) const {
    return kind == o.kind && (!quantized() || block == o.block);
  }
  bool operator!=(const WireFormat& o) const { return !(*this == o); }
};

// The kind a data-plane request names; INVALID_ARGUMENT for a dtype that does
// not travel on the data plane (FLOAT16, unspecified, unknown numbers).
absl::StatusOr<WireFormat::Kind> WireKindOf(v1::DType dtype);

// Quantized formats only. Pack encodes `n` floats into `out` (format.Bytes(n)
// bytes, 4-byte aligned); INVALID_ARGUMENT naming the block when one holds
// Inf or NaN (then `out` holds nothing useful). Unpack decodes such bytes
// into `n` floats. Both run on the calling thread and `kernels`' pool.
absl::Status PackQuantized(kernels::CpuKernels& kernels,
                           const WireFormat& format, const float* in, size_t n,
                           void* out);
// PackQuantized, except that a block holding Inf or NaN is encoded with a
// NaN scale and zero codes (its values decode to NaN), so that the receiver's
// own inf/nan handling sees it as it would unquantized. Never fails on the
// values; INVALID_ARGUMENT only for a format that is not quantized.
absl::Status PackQuantizedOrNan(kernels::CpuKernels& kernels,
                                const WireFormat& format, const float* in,
                                size_t n, void* out);
absl::Status UnpackQuantized(kernels::CpuKernels& kernels,
                             const WireFormat& format, const void* in, size_t n,
                             float* out);

}  // namespace zshard

#endif  // ZSHARD_COMMON_MODEL_WIRE_FORMAT_H_
