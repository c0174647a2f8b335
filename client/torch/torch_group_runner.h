// The libtorch adapter: runs a model defined as an ordered list of groups,
// fetching each group's parameters through a GroupAccess just before use and
// releasing them right after, in forward and again in backward — ZeRO-3's
// schedule. Backward walks the groups in reverse, re-acquires each one and
// pushes its gradient as soon as the group's backward is done.
//
// Two policies for activations (RunnerOptions::recompute):
//  - kept (the default): forward runs with autograd and keeps every group's
//    graph; the parameter tensors autograd saved are rebound to the group's
//    re-fetched memory before its backward (their storage holds no memory
//    in between), so released parameter memory is never read;
//  - recompute (activation checkpointing): forward keeps only each group's
//    input, and backward recomputes the group's forward before its
//    backward.
// Both give the same bits. No torch exception crosses this API: they become
// INTERNAL.
//
// Thread-compatible: one runner per training loop.
#ifndef ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_
#define ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/core/group_access.h"
#include "zshard/kernels/cpu_kernels.h"
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
  // The result must not alias `params` (their memory is released after the
  // call); autograd may save them (or views of them).
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

struct RunnerOptions {
  // Parameters and gradients are bf16 (as GroupAccess hands them over) and
  // so is the compute; the loss is taken in fp32.
  bool bf16 = false;
  // Activation checkpointing: recompute each group's forward in backward
  // instead of keeping its activations.
  bool recompute = false;
};

class TorchGroupRunner {
 public:
  // `model` must outlive the runner.
  explicit TorchGroupRunner(const GroupedModel* model,
                            RunnerOptions options = {});

  // Called with each group's flat fp32 gradient before it is checked and
  // pushed (fault injection in tests; not called in bf16; null: none).
  using GradientHook = std::function<void(size_t g, float* grad, size_t n)>;
  void set_gradient_hook(GradientHook hook) { hook_ = std::move(hook); }

  // One micro-step: forward through every group, loss (times `loss_scale`,
  // so the gradients carry it), backward group by group; each group's
  // gradient goes to `access` with `micro_step`.
  absl::StatusOr<MicroStepResult> TrainMicroStep(GroupAccess& access,
                                                 const torch::Tensor& input,
                                                 const torch::Tensor& target,
                                                 uint32_t micro_step,
                                                 float loss_scale = 1.0f);

  // Forward only (no gradients); returns the last group's output.
  absl::StatusOr<torch::Tensor> Forward(GroupAccess& access,
                                        const torch::Tensor& input);

 private:
  // What forward left for backward, per group.
  struct Saved {
    torch::Tensor input;   // the group's input (a leaf when it needs a grad)
    torch::Tensor output;  // kept policy only: the output, with its graph
  };

  // Points group g's parameter tensors at `data` (its flat buffer) or, with
  // null, at no memory. Tensors autograd saved share the storage, so they
  // follow; the version counter is untouched.
  void Bind(size_t g, const void* data);
  // Acquire(g), then Bind to what it lent; ReleaseBound unbinds first.
  absl::Status AcquireBound(GroupAccess& access, size_t g);
  absl::Status ReleaseBound(GroupAccess& access, size_t g);
  // The input group g's forward sees: a leaf requiring grad where backward
  // must produce its gradient.
  static torch::Tensor GroupInput(size_t g, const torch::Tensor& x, bool grad);
  absl::Status ForwardPass(GroupAccess& access, const torch::Tensor& input,
                           std::vector<Saved>* saved);
  // Group g's backward from `grad_out` (or the loss, for the last group),
  // its flat gradient collected into `grad` (numel_[g] elements); returns
  // the gradient of its input.
  absl::StatusOr<torch::Tensor> BackwardGroup(size_t g, Saved& saved,
                                              const torch::Tensor& grad_out,
                                              const torch::Tensor& target,
                                              float loss_scale, uint8_t* grad,
                                              MicroStepResult* result);
  // Copies group g's parameter gradients into `out` (zeros where none),
  // runs the hook and notes an overflow; clears the tensors' grads.
  void CollectGradient(size_t g, uint8_t* out, MicroStepResult* result);
  absl::StatusOr<MicroStepResult> TrainMicroStepOrThrow(
      GroupAccess& access, const torch::Tensor& input,
      const torch::Tensor& target, uint32_t micro_step, float loss_scale);

  const GroupedModel* const model_;
  const RunnerOptions options_;
  const size_t elem_;                          // bytes per element
  std::vector<std::vector<int64_t>> offsets_;  // [group][tensor], elements
  std::vector<size_t> numel_;                  // [group]
  // [group][tensor]: leaves requiring grad whose storage Bind re-points.
  std::vector<std::vector<torch::Tensor>> params_;
  std::vector<uint8_t> grad_;  // largest group, reused (when none is lent)
  GradientHook hook_;
  // The fp32 gradients' check (one thread, this one's); null if it could not
  // be made ($ZSHARD_KERNELS_ISA names what this CPU lacks): a plain loop.
  std::unique_ptr<kernels::CpuKernels> kernels_;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_TORCH_TORCH_GROUP_RUNNER_H_
