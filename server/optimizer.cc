#include "server/optimizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/base/status_macros.h"
#include "common/config/adamw_step.h"
#include "zshard/kernels/adamw.h"

namespace zshard {

uint64_t GroupShape::trainable_size() const {
  uint64_t n = 0;
  for (const auto& [lo, hi] : trainable) n += hi - lo;
  return n;
}

void ExpandMoments(const GroupShape& shape, const float* compact, float* full) {
  std::memset(full, 0, shape.slice.size() * sizeof(float));
  for (const auto& [lo, hi] : shape.trainable) {
    std::memcpy(full + lo, compact, (hi - lo) * sizeof(float));
    compact += hi - lo;
  }
}

void CompactMoments(const GroupShape& shape, const float* full,
                    float* compact) {
  for (const auto& [lo, hi] : shape.trainable) {
    std::memcpy(compact, full + lo, (hi - lo) * sizeof(float));
    compact += hi - lo;
  }
}

Optimizer::Optimizer(const OptimizerOptions& options,
                     std::unique_ptr<kernels::CpuKernels> kernels)
    : options_(options), kernels_(std::move(kernels)) {}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerOptions& options, std::vector<GroupShape> groups,
    std::vector<std::vector<float>> masters) {
  if (!masters.empty()) {
    bool ok = masters.size() == groups.size();
    for (size_t i = 0; ok && i < groups.size(); ++i) {
      ok = masters[i].size() == groups[i].slice.size();
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          "initial master weights do not match the groups' slices");
    }
  }
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::CpuKernels> k,
                      kernels::CpuKernels::Create(options.kernels));
  std::unique_ptr<Optimizer> opt(new Optimizer(options, std::move(k)));
  for (size_t i = 0; i < groups.size(); ++i) {
    GroupShape& shape = groups[i];
    auto g = std::make_unique<Group>();
    const size_t n = shape.slice.size();
    const size_t trainable = shape.trainable_size();
    g->shape = std::move(shape);
    absl::MutexLock lock(&g->mu);
    if (masters.empty()) {
      g->state.master.assign(n, 0.0f);
    } else {
      g->state.master = std::move(masters[i]);
    }
    g->state.m.assign(trainable, 0.0f);
    g->state.v.assign(trainable, 0.0f);
    opt->groups_.push_back(std::move(g));
  }
  return opt;
}

uint64_t Optimizer::version(uint32_t group) const {
  const Group& g = *groups_[group];
  absl::ReaderMutexLock lock(&g.mu);
  return g.state.version;
}

void Optimizer::Read(uint32_t group,
                     const std::function<void(const State&)>& fn) const {
  const Group& g = *groups_[group];
  absl::ReaderMutexLock lock(&g.mu);
  fn(g.state);
}

void Optimizer::Write(uint32_t group, const std::function<void(State&)>& fn) {
  Group& g = *groups_[group];
  absl::MutexLock lock(&g.mu);
  fn(g.state);
}

void Optimizer::CopyOutLocked(Group& g, void* out) {
  const std::vector<float>& master = g.state.master;
  if (!out || master.empty()) return;
  if (options_.publish_bf16) {
    // Pointers and sizes are ours; a failure is a bug.
    if (!kernels_
             ->Fp32ToBf16(master.data(), static_cast<uint16_t*>(out),
                          master.size())
             .ok()) {
      std::abort();
    }
  } else {
    std::memcpy(out, master.data(), master.size() * sizeof(float));
  }
}

void Optimizer::WriteQuantized(uint32_t group, void* out) {
  Group& g = *groups_[group];
  absl::ReaderMutexLock lock(&g.mu);
  const std::vector<float>& master = g.state.master;
  if (!out || master.empty() || !options_.quantized.quantized()) return;
  // The format is quantized and the sizes are ours: a failure is a bug.
  if (!PackQuantizedOrNan(*kernels_, options_.quantized, master.data(),
                          master.size(), out)
           .ok()) {
    std::abort();
  }
}

void Optimizer::WriteCopy(uint32_t group, void* out) {
  Group& g = *groups_[group];
  absl::ReaderMutexLock lock(&g.mu);
  CopyOutLocked(g, out);
}

void Optimizer::Update(uint32_t group, float* grad, float grad_scale, bool skip,
                       void* out, const void* current) {
  Group& g = *groups_[group];
  absl::MutexLock lock(&g.mu);
  State& s = g.state;
  if (options_.sum_only) {
    // The published "values" are the averaged gradient; frozen: 0.
    if (g.shape.trainable_size() != s.master.size()) {
      std::fill(s.master.begin(), s.master.end(), 0.0f);
    }
    size_t c = 0;
    for (const auto& [lo, hi] : g.shape.trainable) {
      for (size_t i = lo; i < hi; ++i) s.master[i] = grad[c++] * grad_scale;
    }
    CopyOutLocked(g, out);
  } else if (!skip) {
    kernels::AdamWStep hp =
        AdamWStepFor(options_.adamw, options_.scheduler, s.applied, grad_scale);
    uint16_t* half = nullptr;
    if (options_.publish_bf16 && out) {
      hp.half_type = kernels::HalfType::kBf16;
      half = static_cast<uint16_t*>(out);
    }
    size_t moment = 0;  // where this range's moments start
    for (const auto& [lo, hi] : g.shape.trainable) {
      // Arguments were validated at construction; a failure is a bug. The
      // bf16 copy goes straight into the publish slot in the same pass;
      // frozen ranges there already hold their (unchanging) values.
      absl::Status st = kernels_->AdamW(
          s.master.data() + lo, grad + moment, s.m.data() + moment,
          s.v.data() + moment, hi - lo, hp, half ? half + lo : nullptr);
      if (!st.ok()) std::abort();
      moment += hi - lo;
    }
    if (!options_.publish_bf16) CopyOutLocked(g, out);
    ++s.applied;
  } else if (out && current && !s.master.empty()) {
    // Skipped: the same values again in the new slot.
    if (options_.publish_bf16) {
      std::memcpy(out, current, s.master.size() * sizeof(uint16_t));
    } else {
      CopyOutLocked(g, out);
    }
  }
  ++s.version;
}

}  // namespace zshard
