#include "reference/scalar_kernels.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace kernels {
namespace scalar {

void Fp32ToBf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp32ToBf16Bits(in[i]);
}
void Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16BitsToFp32(in[i]);
}
void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp32ToFp16Bits(in[i]);
}
void Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp16BitsToFp32(in[i]);
}

}  // namespace scalar

namespace {
absl::Status CheckPointers(const void* in, const void* out, size_t n) {
  if (n > 0 && (!in || !out)) {
    return absl::InvalidArgumentError("cast: null buffer");
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ReferenceFp32ToBf16(const float* in, uint16_t* out, size_t n) {
  absl::Status st = CheckPointers(in, out, n);
  if (st.ok()) scalar::Fp32ToBf16(in, out, n);
  return st;
}
absl::Status ReferenceBf16ToFp32(const uint16_t* in, float* out, size_t n) {
  absl::Status st = CheckPointers(in, out, n);
  if (st.ok()) scalar::Bf16ToFp32(in, out, n);
  return st;
}
absl::Status ReferenceFp32ToFp16(const float* in, uint16_t* out, size_t n) {
  absl::Status st = CheckPointers(in, out, n);
  if (st.ok()) scalar::Fp32ToFp16(in, out, n);
  return st;
}
absl::Status ReferenceFp16ToFp32(const uint16_t* in, float* out, size_t n) {
  absl::Status st = CheckPointers(in, out, n);
  if (st.ok()) scalar::Fp16ToFp32(in, out, n);
  return st;
}

}  // namespace kernels
}  // namespace zshard
