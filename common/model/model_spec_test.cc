#include "common/model/model_spec.h"

#include "gtest/gtest.h"

namespace zshard {
namespace {

v1::ModelSpec TwoGroups() {
  v1::ModelSpec spec;
  spec.set_name("gpt");
  auto* g0 = spec.add_groups();
  g0->set_name("embed");
  auto* t = g0->add_tensors();
  t->set_name("wte");
  t->add_shape(10);
  t->add_shape(4);
  t->set_dtype(v1::FLOAT32);
  t->set_trainable(true);
  auto* g1 = spec.add_groups();
  g1->set_name("block0");
  t = g1->add_tensors();
  t->set_name("w");
  t->add_shape(4);
  t->add_shape(4);
  t->set_dtype(v1::FLOAT32);
  t->set_trainable(true);
  return spec;
}

TEST(ModelSpecTest, HashIsStableAndSensitive) {
  const auto a = TwoGroups();
  auto b = TwoGroups();
  EXPECT_EQ(SpecHash(a), SpecHash(b));
  EXPECT_EQ(FirstSpecDifference(a, b), "");
  b.mutable_groups(1)->mutable_tensors(0)->set_shape(1, 5);
  EXPECT_NE(SpecHash(a), SpecHash(b));
  EXPECT_EQ(FirstSpecDifference(a, b), "tensor 'w' has shape [4,4] vs [4,5]");
}

TEST(ModelSpecTest, FirstDifferenceNamesTheTensor) {
  const auto a = TwoGroups();
  auto b = TwoGroups();
  b.mutable_groups(1)->mutable_tensors(0)->set_name("w2");
  EXPECT_NE(FirstSpecDifference(a, b).find("'w' vs 'w2'"), std::string::npos);
  b = TwoGroups();
  b.mutable_groups(0)->mutable_tensors(0)->set_dtype(v1::BFLOAT16);
  EXPECT_NE(FirstSpecDifference(a, b).find("wte"), std::string::npos);
  b = TwoGroups();
  b.mutable_groups(1)->mutable_tensors(0)->set_trainable(false);
  EXPECT_NE(FirstSpecDifference(a, b).find("trainable"), std::string::npos);
  b = TwoGroups();
  b.add_groups()->set_name("extra");
  EXPECT_NE(FirstSpecDifference(a, b).find("2 groups vs 3"), std::string::npos);
}

TEST(ModelSpecTest, ValidationNamesTheProblem) {
  EXPECT_TRUE(ValidateModelSpec(TwoGroups()).ok());
  auto bad = TwoGroups();
  bad.mutable_groups(1)->mutable_tensors(0)->set_shape(0, 0);
  auto st = ValidateModelSpec(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), absl::string_view::npos);
  bad = TwoGroups();
  bad.mutable_groups(1)->mutable_tensors(0)->set_name("wte");
  EXPECT_NE(ValidateModelSpec(bad).message().find("twice"),
            absl::string_view::npos);
  bad = TwoGroups();
  bad.mutable_groups(0)->mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(ValidateModelSpec(bad).ok());
  bad = TwoGroups();  // 2^40 x 2^40 would overflow 64 bits
  bad.mutable_groups(1)->mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
  bad.mutable_groups(1)->mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
  EXPECT_NE(ValidateModelSpec(bad).message().find("2^48"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace zshard
