// The libtorch adapter: runs a model defined as an ordered list of groups,
// fetching each group's parameters through a GroupAccess just before use.
// Forward keeps only each group's input; backward walks the groups in
// reverse, re-acquires each one, recomputes its forward with autograd, and
// pushes its gradient at once — so parameters move layer by layer in both
// passes. No torch exception crosses this API: they become INTERNAL.
//
// Thread-compatible: one runner per training loop.
#ifndef ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_
#define ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/core/group_access.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

// A model as a sequence of groups; spec() lists each group's tensors in the
// order Forward receives them.
class GroupedModel {
 public:
  virtual ~GroupedModel() = default;
  virtual const v1::ModelSpec& spec() const = 0;
  // Writes group g's initial values (flat, spec order) to `out`.
  virtual absl::Status Init(size_t g, float* out) const = 0;
  // Group g applied to `input` (the previous group's output, or the batch).
  // The result must not alias `params` (they are released after the call).
  virtual torch::Tensor Forward(size_t g,
                                const std::vector<torch::Tensor>& params,
                                const torch::Tensor& input) const = 0;
  // Scalar loss of the last group's output.
  virtual torch::Tensor Loss(const torch::Tensor& output,
                             const torch::Tensor& target) const = 0;
};

struct MicroStepResult {
  float loss = 0;         // unscaled
  bool overflow = false;  // Inf or NaN in a gradient this micro-step
};

class TorchGroupRunner {
 public:
  // `model` must outlive the runner. With `bf16`, parameters and gradients
  // are bf16 (as GroupAccess hands them over) and so is the compute; the
  // loss is taken in fp32.
  explicit TorchGroupRunner(const GroupedModel* model, bool bf16 = false);

  // Called with each group's flat fp32 gradient before it is checked and
  // pushed (fault injection in tests; not called in bf16; null: none).
  using GradientHook = std::function<void(size_t g, float* grad, size_t n)>;
  void set_gradient_hook(GradientHook hook) { hook_ = std::move(hook); }

  // One micro-step: forward through every group, loss (times `loss_scale`,
  // so the gradients carry it), backward with per-group recompute; each
  // group's gradient goes to `access` with `micro_step`.
  absl::StatusOr<MicroStepResult> TrainMicroStep(GroupAccess& access,
                                                 const torch::Tensor& input,
                                                 const torch::Tensor& target,
                                                 uint32_t micro_step,
                                                 float loss_scale = 1.0f);

  // Forward only (no gradients); returns the last group's output.
  absl::StatusOr<torch::Tensor> Forward(GroupAccess& access,
                                        const torch::Tensor& input);

 private:
  // Views over a group's flat buffer, one per tensor, in spec order.
  std::vector<torch::Tensor> Views(size_t g, const void* data) const;
  absl::StatusOr<MicroStepResult> TrainMicroStepOrThrow(
      GroupAccess& access, const torch::Tensor& input,
      const torch::Tensor& target, uint32_t micro_step, float loss_scale);

  const GroupedModel* const model_;
  std::vector<std::vector<int64_t>> offsets_;  // [group][tensor]
  const bool bf16_;
  const size_t elem_;          // bytes per element
  std::vector<uint8_t> grad_;  // largest group, reused
  GradientHook hook_;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_
