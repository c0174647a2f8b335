#include <cmath>

#include "absl/strings/str_cat.h"
#include "cpu/kernel_table.h"
#include "reference/adamw_element.h"
#include "reference/scalar_kernels.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace kernels {
namespace scalar {
namespace {

template <HalfType kHalf>
void AdamWLoop(float* param, const float* grad, float* m, float* v, size_t n,
               const AdamWConstants& c, void* half_out) {
  for (size_t i = 0; i < n; ++i) {
    const float p = AdamWElement(param[i], grad[i], &m[i], &v[i], c);
    param[i] = p;
    if constexpr (kHalf == HalfType::kBf16) {
      static_cast<uint16_t*>(half_out)[i] = Fp32ToBf16Bits(p);
    } else if constexpr (kHalf == HalfType::kFp16) {
      static_cast<uint16_t*>(half_out)[i] = Fp32ToFp16Bits(p);
    }
  }
}

}  // namespace

void AdamW(float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWConstants& c, HalfType half_type, void* half_out) {
  switch (half_type) {
    case HalfType::kNone:
      return AdamWLoop<HalfType::kNone>(param, grad, m, v, n, c, half_out);
    case HalfType::kBf16:
      return AdamWLoop<HalfType::kBf16>(param, grad, m, v, n, c, half_out);
    case HalfType::kFp16:
      return AdamWLoop<HalfType::kFp16>(param, grad, m, v, n, c, half_out);
  }
}

}  // namespace scalar

absl::Status MakeAdamWConstants(const AdamWStep& hp, AdamWConstants* out) {
  if (hp.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: step must be >= 1, got ", hp.step));
  }
  if (!(hp.lr >= 0) || !(hp.beta1 >= 0 && hp.beta1 < 1) ||
      !(hp.beta2 >= 0 && hp.beta2 < 1) || !(hp.eps > 0) ||
      !(hp.weight_decay >= 0) || !std::isfinite(hp.grad_scale) ||
      !std::isfinite(hp.lr * hp.weight_decay)) {
    return absl::InvalidArgumentError("AdamW: hyper-parameter out of range");
  }
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), hp.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), hp.step);
  out->beta1 = hp.beta1;
  out->one_minus_beta1 = 1.0f - hp.beta1;
  out->beta2 = hp.beta2;
  out->one_minus_beta2 = 1.0f - hp.beta2;
  out->eps = hp.eps;
  out->step_size = static_cast<float>(hp.lr / bc1);
  out->inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  out->decay = 1.0f - hp.lr * hp.weight_decay;
  out->grad_scale = hp.grad_scale;
  return absl::OkStatus();
}

absl::Status ReferenceAdamW(float* param, const float* grad, float* m,
                            float* v, size_t n, const AdamWStep& hp,
                            void* half_out) {
  if (n > 0 && (!param || !grad || !m || !v ||
                (hp.half_type != HalfType::kNone && !half_out))) {
    return absl::InvalidArgumentError("AdamW: null buffer");
  }
  AdamWConstants c;
  absl::Status st = MakeAdamWConstants(hp, &c);
  if (!st.ok()) return st;
  scalar::AdamW(param, grad, m, v, n, c, hp.half_type, half_out);
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace zshard
