#include "client/torch/torch_group_runner.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_spec.h"

namespace zshard {
namespace {

// Whether any of `n` IEEE values (their bits as `Bits`) is Inf or NaN: all
// exponent bits set. Branch-free, so the compiler vectorizes it (a
// std::isfinite loop that stops early does not).
template <typename Bits>
bool AnyNonFinite(const uint8_t* data, size_t n, Bits exponent) {
  Bits bad = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
    bad |= static_cast<Bits>((v & exponent) == exponent);
  }
  return bad != 0;
}

}  // namespace

TorchGroupRunner::TorchGroupRunner(const GroupedModel* model,
                                   RunnerOptions options)
    : model_(model), options_(options), elem_(options.bf16 ? 2 : 4) {
  const auto dtype = options_.bf16 ? torch::kBFloat16 : torch::kFloat32;
  size_t largest = 0;
  for (const auto& group : model_->spec().groups()) {
    std::vector<int64_t> offsets;
    std::vector<torch::Tensor> params;
    int64_t off = 0;
    for (const auto& t : group.tensors()) {
      offsets.push_back(off);
      const int64_t n = static_cast<int64_t>(TensorNumel(t));
      off += n;
      // Its own storage, holding no memory until Bind.
      at::Storage storage(at::Storage::use_byte_size_t(),
                          static_cast<size_t>(n) * elem_,
                          at::DataPtr(nullptr, at::Device(at::kCPU)),
                          /*allocator=*/nullptr, /*resizable=*/false);
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      torch::Tensor p = torch::empty({0}, torch::TensorOptions().dtype(dtype));
      p.set_(storage, 0, shape);
      params.push_back(p.requires_grad_(true));
    }
    offsets_.push_back(std::move(offsets));
    numel_.push_back(static_cast<size_t>(off));
    params_.push_back(std::move(params));
    largest = std::max(largest, static_cast<size_t>(off));
  }
  grad_.resize(largest * elem_);
  if (!options_.bf16) {
    absl::StatusOr<std::unique_ptr<kernels::CpuKernels>> k =
        kernels::CpuKernels::Create();
    if (k.ok()) kernels_ = std::move(*k);
  }
}

void TorchGroupRunner::Bind(size_t g, const void* data) {
  // The runner never writes parameters; DataPtr only takes void*.
  auto* base = static_cast<uint8_t*>(const_cast<void*>(data));
  for (size_t t = 0; t < params_[g].size(); ++t) {
    void* p = base == nullptr ? nullptr : base + offsets_[g][t] * elem_;
    params_[g][t].storage().set_data_ptr_noswap(
        at::DataPtr(p, at::Device(at::kCPU)));
  }
}

absl::Status TorchGroupRunner::AcquireBound(GroupAccess& access, size_t g) {
  ZS_ASSIGN_OR_RETURN(const void* data, access.Acquire(g));
  Bind(g, data);
  return absl::OkStatus();
}

absl::Status TorchGroupRunner::ReleaseBound(GroupAccess& access, size_t g) {
  Bind(g, nullptr);
  return access.Release(g);
}

torch::Tensor TorchGroupRunner::GroupInput(size_t g, const torch::Tensor& x,
                                           bool grad) {
  if (!grad || g == 0 || !x.is_floating_point()) return x;
  return x.detach().requires_grad_(true);
}

absl::StatusOr<MicroStepResult> TorchGroupRunner::TrainMicroStep(
    GroupAccess& access, const torch::Tensor& input,
    const torch::Tensor& target, uint32_t micro_step, float loss_scale) {
  try {
    return TrainMicroStepOrThrow(access, input, target, micro_step, loss_scale);
  } catch (const std::exception& e) {
    for (size_t g = 0; g < params_.size(); ++g) Bind(g, nullptr);
    return absl::InternalError(absl::StrCat("libtorch: ", e.what()));
  }
}

absl::Status TorchGroupRunner::ForwardPass(GroupAccess& access,
                                           const torch::Tensor& input,
                                           std::vector<Saved>* saved) {
  const bool keep = !options_.recompute;
  torch::AutoGradMode grad_mode(keep);
  torch::Tensor x = input;
  for (size_t g = 0; g < params_.size(); ++g) {
    Saved s;
    s.input = GroupInput(g, x, keep);
    ZS_RETURN_IF_ERROR(AcquireBound(access, g));
    x = model_->Forward(g, params_[g], s.input);
    ZS_RETURN_IF_ERROR(ReleaseBound(access, g));
    if (keep) s.output = x;
    saved->push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> TorchGroupRunner::BackwardGroup(
    size_t g, Saved& saved, const torch::Tensor& grad_out,
    const torch::Tensor& target, float loss_scale, uint8_t* grad,
    MicroStepResult* result) {
  torch::AutoGradMode grad_mode(true);
  torch::Tensor in = saved.input;
  torch::Tensor out = saved.output;
  if (options_.recompute) {
    in = GroupInput(g, in, true);
    out = model_->Forward(g, params_[g], in);
  }
  if (g + 1 == params_.size()) {
    torch::Tensor loss =
        model_->Loss(options_.bf16 ? out.to(torch::kFloat32) : out, target);
    result->loss = loss.item<float>();
    if (loss_scale != 1.0f) loss = loss * loss_scale;
    loss.backward();
  } else {
    out.backward(grad_out);
  }
  CollectGradient(g, grad, result);
  return in.requires_grad() ? in.grad() : torch::Tensor();
}

void TorchGroupRunner::CollectGradient(size_t g, uint8_t* out,
                                       MicroStepResult* result) {
  for (size_t t = 0; t < params_[g].size(); ++t) {
    uint8_t* dst = out + offsets_[g][t] * elem_;
    const size_t n = static_cast<size_t>(params_[g][t].numel());
    torch::Tensor& grad = params_[g][t].mutable_grad();
    if (!grad.defined()) {
      std::memset(dst, 0, n * elem_);
    } else {
      const torch::Tensor c = grad.contiguous();
      std::memcpy(dst, c.data_ptr(), n * elem_);
      grad.reset();
    }
  }
  const size_t numel = numel_[g];
  if (options_.bf16) {
    result->overflow |= AnyNonFinite<uint16_t>(out, numel, 0x7f80);
  } else {
    float* grad = reinterpret_cast<float*>(out);
    if (hook_) hook_(g, grad, numel);
    if (kernels_) {
      // Read only (scale 1), at the memory's speed.
      absl::StatusOr<kernels::GradCheckResult> r =
          kernels_->GradCheck(grad, numel, 1.0f);
      result->overflow |= !r.ok() || r->non_finite;
    } else {
      result->overflow |= AnyNonFinite<uint32_t>(out, numel, 0x7f800000);
    }
  }
}

absl::StatusOr<MicroStepResult> TorchGroupRunner::TrainMicroStepOrThrow(
    GroupAccess& access, const torch::Tensor& input,
    const torch::Tensor& target, uint32_t micro_step, float loss_scale) {
  std::vector<Saved> saved;
  ZS_RETURN_IF_ERROR(ForwardPass(access, input, &saved));
  MicroStepResult result;
  torch::Tensor grad_out;
  for (size_t g = params_.size(); g-- > 0;) {
    ZS_RETURN_IF_ERROR(AcquireBound(access, g));
    // Collected where the push takes it without a copy, if it offers that.
    auto* grad = static_cast<uint8_t*>(access.GradientBuffer(g));
    if (grad == nullptr) grad = grad_.data();
    ZS_ASSIGN_OR_RETURN(grad_out, BackwardGroup(g, saved[g], grad_out, target,
                                                loss_scale, grad, &result));
    saved[g] = Saved();
    Bind(g, nullptr);
    ZS_RETURN_IF_ERROR(access.PushGradient(g, grad, micro_step));
    ZS_RETURN_IF_ERROR(access.Release(g));
  }
  return result;
}

absl::StatusOr<torch::Tensor> TorchGroupRunner::Forward(
    GroupAccess& access, const torch::Tensor& input) {
  try {
    torch::NoGradGuard no_grad;
    torch::Tensor x = input;
    for (size_t g = 0; g < params_.size(); ++g) {
      ZS_RETURN_IF_ERROR(AcquireBound(access, g));
      x = model_->Forward(g, params_[g], x).clone();
      ZS_RETURN_IF_ERROR(ReleaseBound(access, g));
    }
    return x;
  } catch (const std::exception& e) {
    for (size_t g = 0; g < params_.size(); ++g) Bind(g, nullptr);
    return absl::InternalError(absl::StrCat("libtorch: ", e.what()));
  }
}

}  // namespace zshard
