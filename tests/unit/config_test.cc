#include "common/config.h"

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(ConfigTest, DeepSpeedFileAsIs) {
  auto c = ParseTrainingConfig(R"({
    "train_batch_size": 64, "gradient_accumulation_steps": 8,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "weight_decay": 0.01,
                  "betas": [0.8, 0.95], "eps": 1e-6}},
    "fp16": {"enabled": false},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,
                          "stage3_param_persistence_threshold": 1e4},
    "steps_per_print": 2000})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gradient_accumulation_steps, 8u);
  EXPECT_DOUBLE_EQ(c->adamw.lr, 6e-5);
  EXPECT_DOUBLE_EQ(c->adamw.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c->adamw.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c->adamw.eps, 1e-6);
  EXPECT_EQ(c->stage3_param_persistence_threshold, 10000u);
  EXPECT_EQ(c->steps_per_print, 2000u);
  EXPECT_EQ(c->ignored_keys,
            (std::vector<std::string>{"fp16",
                                      "zero_optimization.reduce_bucket_size"}));
  EXPECT_TRUE(CheckBatchSize(*c, 2).ok());
  auto st = CheckBatchSize(*c, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("train_batch_size 64"), absl::string_view::npos);
}

TEST(ConfigTest, BadValuesNameTheKeyPath) {
  auto c = ParseTrainingConfig(R"({"optimizer": {"params": {"lr": -1}}})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().substr(0, 21), "optimizer.params.lr: ");
  c = ParseTrainingConfig(R"({"zero_optimization": {"stage": 5}})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "zero_optimization.stage: expected an integer in 0..3, got 5");
  c = ParseTrainingConfig(R"({"gradient_accumulation_steps": "8"})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("gradient_accumulation_steps"),
            absl::string_view::npos);
  EXPECT_FALSE(ParseTrainingConfig("{").ok());
}

TEST(ConfigTest, HashCoversActedOnKeysOnly) {
  auto a = ParseTrainingConfig(R"({"optimizer": {"params": {"lr": 0.1}}})");
  auto b = ParseTrainingConfig(
      R"({"optimizer": {"params": {"lr": 0.1}}, "wall_clock_breakdown": true})");
  auto c = ParseTrainingConfig(R"({"optimizer": {"params": {"lr": 0.2}}})");
  EXPECT_EQ(a->hash, b->hash);
  EXPECT_NE(a->hash, c->hash);
}

}  // namespace
}  // namespace zshard
