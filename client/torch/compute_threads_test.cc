#include "client/torch/compute_threads.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(ComputeThreadsTest, OneNumberGovernsTorchAndOpenBlas) {
  const std::string blas = SetComputeThreads(1);
  EXPECT_EQ(torch::get_num_threads(), 1);
  if (blas.empty()) GTEST_SKIP() << "no OpenBLAS in this process";
  EXPECT_EQ(OpenBlasThreads(), 1);
  // A BLAS call after the setting still computes (and uses one thread).
  torch::Tensor a = torch::ones({64, 64});
  EXPECT_FLOAT_EQ(torch::mm(a, a)[0][0].item<float>(), 64.0f);
  SetComputeThreads(2);
  EXPECT_EQ(torch::get_num_threads(), 2);
  EXPECT_EQ(OpenBlasThreads(), 2);
}

}  // namespace
}  // namespace zshard
