// GptModel: a GPT-style character-level transformer as a GroupedModel.
// Groups: "embed" (token + position embeddings), one per pre-norm block
// (causal self-attention and MLP), and "head" (final norm + output
// projection). Initial values follow GPT-2 (normal(0, 0.02), residual
// projections scaled by 1/sqrt(2 * layers)) from a seeded generator of our
// own, so every process computes the same values. Immutable; thread-safe.
#ifndef ZSHARD_CLIENT_EXAMPLES_GPT_MODEL_H_
#define ZSHARD_CLIENT_EXAMPLES_GPT_MODEL_H_

#include <cstdint>

#include "client/torch/torch_group_runner.h"

namespace zshard {

struct GptConfig {
  int64_t vocab = 0;
  int64_t context = 64;
  int64_t d_model = 160;
  int64_t layers = 4;
  int64_t heads = 4;
  uint64_t seed = 1;
};

class GptModel : public GroupedModel {
 public:
  // INVALID_ARGUMENT naming the field when a size is not positive or
  // d_model is not a multiple of heads.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& c);

  const v1::ModelSpec& spec() const override { return spec_; }
  absl::Status Init(size_t g, float* out) const override;
  torch::Tensor Forward(size_t g, const std::vector<torch::Tensor>& params,
                        const torch::Tensor& input) const override;
  torch::Tensor Loss(const torch::Tensor& output,
                     const torch::Tensor& target) const override;
  uint64_t num_parameters() const;

 private:
  explicit GptModel(const GptConfig& c);
  torch::Tensor Block(const std::vector<torch::Tensor>& p,
                      const torch::Tensor& x) const;

  const GptConfig config_;
  v1::ModelSpec spec_;
};

}  // namespace zshard

#endif  // ZSHARD_CLIENT_EXAMPLES_GPT_MODEL_H_
