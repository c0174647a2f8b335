#include "common/model/wire_format.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zshard/kernels/quantize.h"

namespace zshard {
namespace {

absl::Status CheckQuantized(const WireFormat& format) {
  if (!format.quantized()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire format ", format.name(), " is not a quantized format"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t WireFormat::Bytes(uint64_t n) const {
  switch (kind) {
    case Kind::kFp32:
      return n * 4;
    case Kind::kBf16:
      return n * 2;
    case Kind::kInt8:
    case Kind::kFp8:
      return WireFormat::ScalesOffset(n) + 4 * kernels::NumBlocks(n, block);
  }
  return 0;
}

const char* WireFormat::name() const {
  switch (kind) {
    case Kind::kFp32:
      return "fp32";
    case Kind::kBf16:
      return "bf16";
    case Kind::kInt8:
      return "int8";
    case Kind::kFp8:
      return "fp8";
  }
  return "?";
}

v1::DType WireFormat::dtype() const {
  switch (kind) {
    case Kind::kFp32:
      return v1::FLOAT32;
    case Kind::kBf16:
      return v1::BFLOAT16;
    case Kind::kInt8:
      return v1::INT8_BLOCKS;
    case Kind::kFp8:
      return v1::FP8_E4M3_BLOCKS;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<WireFormat::Kind> WireKindOf(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return WireFormat::Kind::kFp32;
    case v1::BFLOAT16:
      return WireFormat::Kind::kBf16;
    case v1::INT8_BLOCKS:
      return WireFormat::Kind::kInt8;
    case v1::FP8_E4M3_BLOCKS:
      return WireFormat::Kind::kFp8;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype ", v1::DType_IsValid(dtype) ? v1::DType_Name(dtype) : "?",
          " (", static_cast<int>(dtype),
          ") does not travel on the data plane (FLOAT32, BFLOAT16, "
          "INT8_BLOCKS or FP8_E4M3_BLOCKS)"));
  }
}

absl::Status PackQuantized(kernels::CpuKernels& kernels,
                           const WireFormat& format, const float* in, size_t n,
                           void* out) {
  if (absl::Status st = CheckQuantized(format); !st.ok()) return st;
  if (n == 0) return absl::OkStatus();
  char* base = static_cast<char*>(out);
  float* scales = reinterpret_cast<float*>(base + WireFormat::ScalesOffset(n));
  for (uint64_t i = n; i < WireFormat::ScalesOffset(n); ++i) base[i] = 0;
  if (format.kind == WireFormat::Kind::kInt8) {
    return kernels.QuantizeInt8(in, n, format.block,
                                reinterpret_cast<int8_t*>(base), scales);
  }
  return kernels.QuantizeFp8(in, n, format.block,
                             reinterpret_cast<uint8_t*>(base), scales);
}

absl::Status PackQuantizedOrNan(kernels::CpuKernels& kernels,
                                const WireFormat& format, const float* in,
                                size_t n, void* out) {
  if (absl::Status st = CheckQuantized(format); !st.ok()) return st;
  if (PackQuantized(kernels, format, in, n, out).ok()) return absl::OkStatus();
  // Block by block: a refused one gets zero codes and a NaN scale.
  char* base = static_cast<char*>(out);
  float* scales = reinterpret_cast<float*>(base + WireFormat::ScalesOffset(n));
  std::vector<char> one(format.Bytes(format.block));
  for (size_t b = 0; b * format.block < n; ++b) {
    const size_t len = std::min<size_t>(format.block, n - b * format.block);
    if (PackQuantized(kernels, format, in + b * format.block, len, one.data())
            .ok()) {
      std::memcpy(base + b * format.block, one.data(), len);
      std::memcpy(&scales[b], one.data() + WireFormat::ScalesOffset(len), 4);
    } else {
      std::memset(base + b * format.block, 0, len);
      scales[b] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return absl::OkStatus();
}

absl::Status UnpackQuantized(kernels::CpuKernels& kernels,
                             const WireFormat& format, const void* in, size_t n,
                             float* out) {
  if (absl::Status st = CheckQuantized(format); !st.ok()) return st;
  if (n == 0) return absl::OkStatus();
  const char* base = static_cast<const char*>(in);
  const float* scales =
      reinterpret_cast<const float*>(base + WireFormat::ScalesOffset(n));
  if (format.kind == WireFormat::Kind::kInt8) {
    return kernels.DequantizeInt8(reinterpret_cast<const int8_t*>(base), scales,
                                  n, format.block, out);
  }
  return kernels.DequantizeFp8(reinterpret_cast<const uint8_t*>(base), scales,
                               n, format.block, out);
}

}  // namespace zshard
