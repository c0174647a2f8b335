#include "client/torch/torch_group_runner.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace zshard {
namespace {

void AddTensor(v1::GroupSpec* g, std::vector<int64_t> shape) {
  auto* t = g->add_tensors();
  t->set_name("t" + std::to_string(g->tensors_size()));
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(v1::FLOAT32);
  t->set_trainable(true);
}

constexpr int64_t kVocab = 11, kWidth = 8, kTokens = 6;

// Embedding, one block (layer norm, linear, tanh, a residual), a head: the
// saved tensors include weights, their transposes and the norm's weight.
class SmallModel : public GroupedModel {
 public:
  SmallModel() {
    spec_.set_name("small");
    auto* embed = spec_.add_groups();
    AddTensor(embed, {kVocab, kWidth});
    auto* block = spec_.add_groups();
    AddTensor(block, {kWidth});
    AddTensor(block, {kWidth});
    AddTensor(block, {kWidth, kWidth});
    AddTensor(block, {kWidth});
    auto* head = spec_.add_groups();
    AddTensor(head, {kVocab, kWidth});
  }
  const v1::ModelSpec& spec() const override { return spec_; }
  absl::Status Init(size_t g, float* out) const override {
    std::mt19937 rng(static_cast<unsigned>(g) + 7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    int64_t n = 0;
    for (const auto& t : spec_.groups(static_cast<int>(g)).tensors()) {
      int64_t numel = 1;
      for (int64_t d : t.shape()) numel *= d;
      n += numel;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = u(rng);
    return absl::OkStatus();
  }
  torch::Tensor Forward(size_t g, const std::vector<torch::Tensor>& p,
                        const torch::Tensor& x) const override {
    if (g == 0) return torch::embedding(p[0], x);
    if (g == 1) {
      torch::Tensor h = torch::layer_norm(x, {kWidth}, p[0], p[1]);
      return x + torch::tanh(torch::linear(h, p[2], p[3]));
    }
    return torch::linear(x, p[0]);
  }
  torch::Tensor Loss(const torch::Tensor& out,
                     const torch::Tensor& target) const override {
    return torch::cross_entropy_loss(out.view({-1, kVocab}), target.view({-1}));
  }

 private:
  v1::ModelSpec spec_;
};

// Parameters that move: every Acquire copies the group into a fresh buffer
// and Release fills it with NaN, so any read of released memory shows up
// in the gradients.
class MovingAccess : public GroupAccess {
 public:
  explicit MovingAccess(const GroupedModel& model) {
    for (int g = 0; g < model.spec().groups_size(); ++g) {
      size_t n = 0;
      for (const auto& t : model.spec().groups(g).tensors()) {
        size_t numel = 1;
        for (int64_t d : t.shape()) numel *= static_cast<size_t>(d);
        n += numel;
      }
      values_.emplace_back(n);
      EXPECT_TRUE(
          model.Init(static_cast<size_t>(g), values_.back().data()).ok());
      grads_.emplace_back(n);
      lent_.emplace_back();
    }
  }
  absl::StatusOr<const void*> Acquire(size_t g) override {
    auto buffer = std::make_unique<std::vector<float>>(values_[g]);
    const void* data = buffer->data();
    lent_[g].push_back(std::move(buffer));
    ++acquires_;
    return data;
  }
  absl::Status Release(size_t g) override {
    for (auto& b : lent_[g]) {
      std::fill(b->begin(), b->end(), std::numeric_limits<float>::quiet_NaN());
    }
    released_.insert(released_.end(), std::make_move_iterator(lent_[g].begin()),
                     std::make_move_iterator(lent_[g].end()));
    lent_[g].clear();
    return absl::OkStatus();
  }
  absl::Status PushGradient(size_t g, const void* grad, uint32_t) override {
    std::memcpy(grads_[g].data(), grad, grads_[g].size() * sizeof(float));
    return absl::OkStatus();
  }
  const std::vector<std::vector<float>>& grads() const { return grads_; }
  const std::vector<std::vector<float>>& values() const { return values_; }
  int acquires() const { return acquires_; }

 private:
  std::vector<std::vector<float>> values_, grads_;
  std::vector<std::vector<std::unique_ptr<std::vector<float>>>> lent_;
  // Kept (poisoned) so that a stale pointer reads NaN, not freed memory.
  std::vector<std::unique_ptr<std::vector<float>>> released_;
  int acquires_ = 0;
};

struct Batch {
  torch::Tensor input = torch::randint(kVocab, {2, kTokens}, torch::kInt64);
  torch::Tensor target = torch::randint(kVocab, {2, kTokens}, torch::kInt64);
};

// Both activation policies re-acquire every group in backward, read only
// memory that is currently lent, and give the same bits; both equal plain
// libtorch autograd over the whole model.
TEST(TorchGroupRunnerTest, KeptAndRecomputedActivationsGiveTheSameBits) {
  torch::manual_seed(3);
  SmallModel model;
  Batch batch;
  std::vector<std::vector<float>> grads[2];
  float losses[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    RunnerOptions options;
    options.recompute = recompute == 1;
    TorchGroupRunner runner(&model, options);
    MovingAccess access(model);
    // Twice: the second micro-step must not see the first one's gradients.
    for (int micro = 0; micro < 2; ++micro) {
      auto r = runner.TrainMicroStep(access, batch.input, batch.target,
                                     static_cast<uint32_t>(micro));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->overflow) << "a released buffer was read";
      losses[recompute] = r->loss;
    }
    EXPECT_EQ(access.acquires(), 2 * 2 * 3);
    grads[recompute] = access.grads();
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (size_t g = 0; g < grads[0].size(); ++g) {
    ASSERT_EQ(std::memcmp(grads[0][g].data(), grads[1][g].data(),
                          grads[0][g].size() * sizeof(float)),
              0)
        << "group " << g;
  }

  // Plain autograd over ordinary tensors.
  MovingAccess init(model);
  std::vector<std::vector<torch::Tensor>> params(3);
  for (size_t g = 0; g < 3; ++g) {
    torch::Tensor flat =
        torch::from_blob(const_cast<float*>(init.values()[g].data()),
                         {static_cast<int64_t>(init.values()[g].size())});
    int64_t off = 0;
    for (const auto& t : model.spec().groups(static_cast<int>(g)).tensors()) {
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      params[g].push_back(
          flat.narrow(0, off, n).view(shape).clone().requires_grad_(true));
      off += n;
    }
  }
  torch::Tensor x = batch.input;
  for (size_t g = 0; g < 3; ++g) x = model.Forward(g, params[g], x);
  model.Loss(x, batch.target).backward();
  for (size_t g = 0; g < 3; ++g) {
    std::vector<torch::Tensor> parts;
    for (auto& p : params[g]) parts.push_back(p.grad().reshape({-1}));
    torch::Tensor expected = torch::cat(parts);
    torch::Tensor got = torch::from_blob(
        grads[0][g].data(), {static_cast<int64_t>(grads[0][g].size())});
    EXPECT_TRUE(torch::allclose(got, expected, 1e-6, 1e-7)) << "group " << g;
  }
}

// An access that fails mid-backward: the error comes back as a Status and
// the runner's tensors hold no pointer into the released memory.
class FailingPushAccess : public MovingAccess {
 public:
  using MovingAccess::MovingAccess;
  absl::Status PushGradient(size_t, const void*, uint32_t) override {
    return absl::UnavailableError("shard 1 is gone");
  }
};

TEST(TorchGroupRunnerTest, AccessErrorsComeBackAsTheirStatus) {
  SmallModel model;
  Batch batch;
  TorchGroupRunner runner(&model);
  FailingPushAccess failing(model);
  auto r = runner.TrainMicroStep(failing, batch.input, batch.target, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  // The same runner trains on after the failure.
  MovingAccess access(model);
  auto ok = runner.TrainMicroStep(access, batch.input, batch.target, 0);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->overflow);
}

// A non-finite value anywhere in any group's gradient (the hook plants one
// at the last position of a group) is reported as an overflow.
TEST(TorchGroupRunnerTest, NonFiniteGradientsAreReported) {
  SmallModel model;
  Batch batch;
  for (float bad : {std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t target = 0; target < 3; ++target) {
      TorchGroupRunner runner(&model);
      runner.set_gradient_hook([&](size_t g, float* grad, size_t n) {
        if (g == target) grad[n - 1] = bad;
      });
      MovingAccess access(model);
      auto r = runner.TrainMicroStep(access, batch.input, batch.target, 0);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->overflow) << bad << " in group " << target;
    }
  }
}

}  // namespace
}  // namespace zshard
