#include "client/examples/local_groups.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/config/adamw_step.h"
#include "common/model/model_spec.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<LocalGroups>> LocalGroups::Create(
    const GroupedModel& model, const TrainingConfig& config) {
  if (config.bf16_enabled) {
    return absl::UnimplementedError(
        "bf16.enabled: local training (the compute floor) runs fp32 only");
  }
  std::unique_ptr<LocalGroups> l(new LocalGroups());
  l->config_ = config;
  ZS_ASSIGN_OR_RETURN(l->kernels_, kernels::CpuKernels::Create({}));
  for (int g = 0; g < model.spec().groups_size(); ++g) {
    const size_t n = GroupNumel(model.spec().groups(g));
    l->params_.emplace_back(n);
    ZS_RETURN_IF_ERROR(
        model.Init(static_cast<size_t>(g), l->params_.back().data()));
    l->grads_.emplace_back(n, 0.0f);
    l->m_.emplace_back(n, 0.0f);
    l->v_.emplace_back(n, 0.0f);
  }
  return l;
}

absl::StatusOr<const void*> LocalGroups::Acquire(size_t g) {
  if (g >= params_.size())
    return absl::NotFoundError(absl::StrCat("unknown group ", g));
  return static_cast<const void*>(params_[g].data());
}

absl::Status LocalGroups::Release(size_t g) {
  if (g >= params_.size())
    return absl::NotFoundError(absl::StrCat("unknown group ", g));
  return absl::OkStatus();
}

absl::Status LocalGroups::PushGradient(size_t g, const void* grad,
                                       uint32_t micro_step) {
  if (g >= params_.size())
    return absl::NotFoundError(absl::StrCat("unknown group ", g));
  const float* in = static_cast<const float*>(grad);
  std::vector<float>& sum = grads_[g];
  if (micro_step == 0) {
    std::memcpy(sum.data(), in, sum.size() * sizeof(float));
  } else {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += in[i];
  }
  return absl::OkStatus();
}

absl::Status LocalGroups::Step() {
  const kernels::AdamWStep hp = AdamWStepFor(
      config_.adamw, config_.scheduler, applied_,
      1.0f / static_cast<float>(config_.gradient_accumulation_steps));
  for (size_t g = 0; g < params_.size(); ++g) {
    ZS_RETURN_IF_ERROR(kernels_->AdamW(params_[g].data(), grads_[g].data(),
                                       m_[g].data(), v_[g].data(),
                                       params_[g].size(), hp));
  }
  ++applied_;
  return absl::OkStatus();
}

}  // namespace zshard
