// The public Trainer against real shard servers (in process, inline data
// plane): two trainers' step (one pushing full gradients, one only the
// trainable elements) gives the reference AdamW of their averaged
// gradients, and bad input is refused naming what was wrong.
#include "zshard/client/trainer.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "common/config/training_config.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/in_process_shards.h"
#include "zshard/kernels/adamw.h"

namespace zshard {
namespace {

constexpr uint32_t kShards = 2;
constexpr uint32_t kTrainers = 2;

ModelDesc Model() {
  ModelDesc m;
  m.name = "tiny";
  m.groups = {{"embed", {{"w", {300}, true}}},
              {"block", {{"a", {64, 20}, true}, {"frozen", {50}, false}}}};
  return m;
}

float Init(size_t g, uint64_t i) {
  return 0.02f * static_cast<float>(g + 1) + 1e-4f * (i % 89);
}
float Grad(uint32_t rank, uint64_t i) {
  return 0.1f * static_cast<float>(rank + 1) - 1e-3f * (i % 31);
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Named for this process: ctest runs this file's tests side by side,
    // and one writing the file while another read it failed the read.
    config_path_ = ::testing::TempDir() + "/trainer_test_ds_config." +
                   std::to_string(getpid()) + ".json";
    std::ofstream(config_path_) << R"({"train_batch_size": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100}})";
    auto config = LoadTrainingConfig(config_path_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    ShardServerOptions o;
    o.service.store.world_size = kTrainers;
    o.service.store.persistence_threshold =
        config_.stage3_param_persistence_threshold;
    o.service.store.adamw = config_.adamw;
    o.service.config_hash = config_.hash;
    o.service.wait_timeout = absl::Seconds(20);
    o.transport = "inline";
    auto servers = testing::StartShards(o, kShards);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
  }
  void TearDown() override { std::remove(config_path_.c_str()); }

  TrainerOptions Options(int rank) const {
    TrainerOptions o;
    o.coordinator = servers_[0]->endpoint();
    o.rank = rank;
    o.config_path = config_path_;
    o.connect_timeout_s = 20;
    o.rpc_timeout_s = 20;
    return o;
  }

  static absl::Status FillInit(const ModelDesc& m, size_t g, float* out) {
    uint64_t n = 0;
    for (const auto& t : m.groups[g].tensors) {
      uint64_t e = 1;
      for (int64_t d : t.shape) e *= static_cast<uint64_t>(d);
      n += e;
    }
    for (uint64_t i = 0; i < n; ++i) out[i] = Init(g, i);
    return absl::OkStatus();
  }

  std::string config_path_;
  TrainingConfig config_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
};

TEST_F(TrainerTest, OneStepOfTwoTrainersIsTheReferenceAdamWOfTheirMean) {
  const ModelDesc model = Model();
  std::vector<std::vector<float>> after(model.groups.size());
  auto train = [&](int rank) {
    auto t = Trainer::Connect(Options(rank), model, [&](size_t g, float* out) {
      return FillInit(model, g, out);
    });
    ASSERT_TRUE(t.ok()) << t.status();
    Trainer& tr = **t;
    EXPECT_EQ(tr.world_size(), kTrainers);
    EXPECT_EQ(tr.element_size(), 4u);
    EXPECT_EQ(tr.transport(), "inline");
    for (size_t g = tr.num_groups(); g-- > 0;) {
      ASSERT_TRUE(tr.Acquire(g).ok());
      std::vector<float> grad(tr.group_elements(g));
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = Grad(tr.rank(), i);
      ASSERT_TRUE(tr.Release(g).ok());
      if (rank == 0) {
        ASSERT_TRUE(tr.PushGradient(g, grad.data()).ok());
      } else {
        // The trainable elements only: here they come first in each group,
        // so they are the same vector's prefix.
        ASSERT_TRUE(tr.PushTrainableGradient(g, grad.data()).ok());
      }
    }
    EXPECT_EQ(tr.trainable_elements(0), 300u);
    EXPECT_EQ(tr.trainable_elements(1), 64u * 20u);
    auto done = tr.EndStep();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(tr.step(), 1u);
    if (rank != 0) return;
    for (size_t g = 0; g < tr.num_groups(); ++g) {
      auto p = tr.Acquire(g);
      ASSERT_TRUE(p.ok()) << p.status();
      const float* v = static_cast<const float*>(*p);
      after[g].assign(v, v + tr.group_elements(g));
      ASSERT_TRUE(tr.Release(g).ok());
    }
    EXPECT_GT(tr.stats().bytes_pushed, 0u);
  };
  std::thread other([&] { train(1); });
  train(0);
  other.join();
  if (HasFatalFailure()) return;

  // Reference: AdamW on (g0 + g1) / 2, trainable elements only.
  kernels::AdamWStep hp;
  hp.lr = static_cast<float>(config_.adamw.lr);
  hp.beta1 = static_cast<float>(config_.adamw.beta1);
  hp.beta2 = static_cast<float>(config_.adamw.beta2);
  hp.eps = static_cast<float>(config_.adamw.eps);
  hp.weight_decay = static_cast<float>(config_.adamw.weight_decay);
  hp.grad_scale = 0.5f;
  const uint64_t trainable[2] = {300, 64 * 20};
  for (size_t g = 0; g < 2; ++g) {
    std::vector<float> p(after[g].size()), sum(after[g].size()), m(p.size(), 0),
        v(p.size(), 0);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = Init(g, i);
      sum[i] = Grad(0, i) + Grad(1, i);
    }
    ASSERT_TRUE(kernels::ReferenceAdamW(p.data(), sum.data(), m.data(),
                                        v.data(), trainable[g], hp)
                    .ok());
    EXPECT_EQ(after[g], p) << "group "
                           << g;  // the frozen tail keeps its values
  }
}

TEST_F(TrainerTest, BadInputIsRefusedNamingWhatWasWrong) {
  const ModelDesc model = Model();
  const auto init = [&](size_t g, float* out) {
    return FillInit(model, g, out);
  };
  TrainerOptions o = Options(0);
  o.coordinator.clear();
  auto st = Trainer::Connect(o, model, init).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("coordinator"), std::string::npos) << st;
  o = Options(0);
  o.transport = "carrier-pigeon";
  EXPECT_NE(
      Trainer::Connect(o, model, init).status().message().find("transport"),
      std::string::npos);
  o = Options(0);
  o.rpc_timeout_s = 0;
  EXPECT_EQ(Trainer::Connect(o, model, init).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(0);
  o.config_path = "/nonexistent/ds_config.json";
  EXPECT_NE(
      Trainer::Connect(o, model, init).status().message().find("config_path"),
      std::string::npos);
  ModelDesc empty;
  EXPECT_EQ(Trainer::Connect(Options(0), empty, init).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto t = Trainer::Connect(Options(0), model, init);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Acquire(7).status().code(), absl::StatusCode::kNotFound);
  std::vector<float> grad(300, 1.0f);
  EXPECT_EQ((*t)->PushGradient(7, grad.data()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*t)->PushGradient(0, grad.data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*t)->PushGradient(0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zshard
