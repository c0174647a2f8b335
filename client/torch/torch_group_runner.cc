#include "client/torch/torch_group_runner.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"
#include "zshard/kernels/cast.h"

namespace zshard {

TorchGroupRunner::TorchGroupRunner(const GroupedModel* model, bool bf16)
    : model_(model), bf16_(bf16), elem_(bf16 ? 2 : 4) {
  size_t largest = 0;
  for (const auto& group : model_->spec().groups()) {
    std::vector<int64_t> offsets;
    int64_t off = 0;
    for (const auto& t : group.tensors()) {
      offsets.push_back(off);
      off += static_cast<int64_t>(TensorNumel(t));
    }
    offsets_.push_back(std::move(offsets));
    largest = std::max(largest, static_cast<size_t>(off));
  }
  grad_.resize(largest * elem_);
}

std::vector<torch::Tensor> TorchGroupRunner::Views(size_t g,
                                                   const void* data) const {
  std::vector<torch::Tensor> views;
  const auto& tensors = model_->spec().groups(static_cast<int>(g)).tensors();
  for (int t = 0; t < tensors.size(); ++t) {
    std::vector<int64_t> shape(tensors[t].shape().begin(),
                               tensors[t].shape().end());
    // The runner never writes parameters; from_blob only takes void*.
    auto* base = static_cast<uint8_t*>(const_cast<void*>(data));
    views.push_back(
        torch::from_blob(base + offsets_[g][t] * elem_, shape,
                         bf16_ ? torch::kBFloat16 : torch::kFloat32));
  }
  return views;
}

absl::StatusOr<MicroStepResult> TorchGroupRunner::TrainMicroStep(
    GroupAccess& access, const torch::Tensor& input,
    const torch::Tensor& target, uint32_t micro_step, float loss_scale) {
  try {
    return TrainMicroStepOrThrow(access, input, target, micro_step, loss_scale);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what()));
  }
}

absl::StatusOr<MicroStepResult> TorchGroupRunner::TrainMicroStepOrThrow(
    GroupAccess& access, const torch::Tensor& input,
    const torch::Tensor& target, uint32_t micro_step, float loss_scale) {
  const size_t groups = offsets_.size();
  // Forward without autograd, keeping each group's input.
  std::vector<torch::Tensor> inputs;
  torch::Tensor x = input;
  {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups; ++g) {
      inputs.push_back(x);
      ZS_ASSIGN_OR_RETURN(const void* data, access.Acquire(g));
      x = model_->Forward(g, Views(g, data), x);
      ZS_RETURN_IF_ERROR(access.Release(g));
    }
  }
  // Backward, group by group from the last, recomputing each forward.
  MicroStepResult result;
  torch::Tensor grad_out;
  for (size_t g = groups; g-- > 0;) {
    ZS_ASSIGN_OR_RETURN(const void* data, access.Acquire(g));
    {
      torch::AutoGradMode grad_mode(true);
      std::vector<torch::Tensor> params = Views(g, data);
      for (auto& p : params) p.requires_grad_(true);
      torch::Tensor in = inputs[g];
      const bool input_grad = g > 0 && in.is_floating_point();
      if (input_grad) in = in.detach().requires_grad_(true);
      torch::Tensor out = model_->Forward(g, params, in);
      if (g + 1 == groups) {
        torch::Tensor loss =
            model_->Loss(bf16_ ? out.to(torch::kFloat32) : out, target);
        result.loss = loss.item<float>();
        if (loss_scale != 1.0f) loss = loss * loss_scale;
        loss.backward();
      } else {
        out.backward(grad_out);
      }
      const auto& tensors =
          model_->spec().groups(static_cast<int>(g)).tensors();
      for (size_t t = 0; t < params.size(); ++t) {
        uint8_t* dst = grad_.data() + offsets_[g][t] * elem_;
        const size_t n = TensorNumel(tensors[static_cast<int>(t)]);
        const torch::Tensor grad = params[t].grad();
        if (!grad.defined()) {
          std::memset(dst, 0, n * elem_);
        } else {
          const torch::Tensor c = grad.contiguous();
          std::memcpy(dst, c.data_ptr(), n * elem_);
        }
      }
      grad_out = input_grad ? in.grad() : torch::Tensor();
    }
    const size_t numel = static_cast<size_t>(
        offsets_[g].back() +
        static_cast<int64_t>(TensorNumel(
            model_->spec()
                .groups(static_cast<int>(g))
                .tensors(static_cast<int>(offsets_[g].size() - 1)))));
    if (bf16_) {
      const auto* h = reinterpret_cast<const uint16_t*>(grad_.data());
      for (size_t i = 0; i < numel && !result.overflow; ++i) {
        result.overflow = !std::isfinite(kernels::Bf16BitsToFp32(h[i]));
      }
    } else {
      auto* f = reinterpret_cast<float*>(grad_.data());
      if (hook_) hook_(g, f, numel);
      for (size_t i = 0; i < numel && !result.overflow; ++i) {
        result.overflow = !std::isfinite(f[i]);
      }
    }
    ZS_RETURN_IF_ERROR(access.PushGradient(g, grad_.data(), micro_step));
    ZS_RETURN_IF_ERROR(access.Release(g));
    inputs[g] = torch::Tensor();
  }
  return result;
}

absl::StatusOr<torch::Tensor> TorchGroupRunner::Forward(
    GroupAccess& access, const torch::Tensor& input) {
  try {
    torch::NoGradGuard no_grad;
    torch::Tensor x = input;
    for (size_t g = 0; g < offsets_.size(); ++g) {
      ZS_ASSIGN_OR_RETURN(const void* data, access.Acquire(g));
      x = model_->Forward(g, Views(g, data), x).clone();
      ZS_RETURN_IF_ERROR(access.Release(g));
    }
    return x;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what()));
  }
}

}  // namespace zshard
