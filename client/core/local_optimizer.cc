#include "client/core/local_optimizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/config/adamw_step.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<LocalOptimizer>> LocalOptimizer::Create(
    ParameterCache* cache, const PartitionMap* map, const AdamWParams& adamw,
    const SchedulerConfig& scheduler) {
  std::unique_ptr<LocalOptimizer> o(new LocalOptimizer());
  o->cache_ = cache;
  o->map_ = map;
  o->adamw_ = adamw;
  o->scheduler_ = scheduler;
  ZS_ASSIGN_OR_RETURN(o->kernels_, kernels::CpuKernels::Create({}));
  for (size_t g = 0; g < map->num_groups(); ++g) {
    ZS_ASSIGN_OR_RETURN(const void* raw, cache->Acquire(g));
    const float* p = static_cast<const float*>(raw);
    o->params_.emplace_back(p, p + map->group_numel(g));
    o->m_.emplace_back(map->group_numel(g), 0.0f);
    o->v_.emplace_back(map->group_numel(g), 0.0f);
    ZS_RETURN_IF_ERROR(cache->Release(g));
  }
  return o;
}

absl::StatusOr<const void*> LocalOptimizer::Params(size_t g) const {
  if (g >= params_.size())
    return absl::NotFoundError(absl::StrCat("unknown group ", g));
  return static_cast<const void*>(params_[g].data());
}

absl::Status LocalOptimizer::Step() {
  const kernels::AdamWStep hp = AdamWStepFor(adamw_, scheduler_, applied_);
  for (size_t g = 0; g < map_->num_groups(); ++g) {
    // The servers publish the averaged gradient of the step just ended.
    ZS_ASSIGN_OR_RETURN(const void* grad, cache_->Acquire(g));
    const float* avg = static_cast<const float*>(grad);
    // Frozen tensors keep their values (no update, no weight decay).
    for (const auto& [lo, hi] : map_->trainable_ranges(g)) {
      ZS_RETURN_IF_ERROR(kernels_->AdamW(params_[g].data() + lo, avg + lo,
                                         m_[g].data() + lo, v_[g].data() + lo,
                                         hi - lo, hp));
    }
    ZS_RETURN_IF_ERROR(cache_->Release(g));
  }
  ++applied_;
  return absl::OkStatus();
}

uint64_t LocalOptimizer::elements() const {
  uint64_t n = 0;
  for (const auto& p : params_) n += p.size();
  return n;
}

}  // namespace zshard
