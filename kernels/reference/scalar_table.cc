#include "cpu/kernel_table.h"
#include "reference/scalar_kernels.h"

namespace zshard {
namespace kernels {

const KernelTable& ScalarKernelTable() {
  static const KernelTable table = {
      scalar::AdamW,          scalar::Fp32ToBf16,     scalar::Bf16ToFp32,
      scalar::Fp32ToFp16,     scalar::Fp16ToFp32,     scalar::QuantizeInt8,
      scalar::DequantizeInt8, scalar::QuantizeFp8,    scalar::DequantizeFp8,
      scalar::GradCheck,      scalar::Add};
  return table;
}

}  // namespace kernels
}  // namespace zshard
