#include "client/torch/blas_core.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace zshard {
namespace {

TEST(BlasCoreTest, TiersFollowTheWidestVectors) {
  EXPECT_EQ(BlasCoreTier("Cooperlake"), 3);
  EXPECT_EQ(BlasCoreTier("skylakex"), 3);  // case-insensitive
  EXPECT_EQ(BlasCoreTier("Haswell"), 2);
  EXPECT_EQ(BlasCoreTier("Zen"), 2);
  EXPECT_EQ(BlasCoreTier("Sandybridge"), 1);
  EXPECT_EQ(BlasCoreTier("Prescott"), 0);
  EXPECT_EQ(BlasCoreTier("Nehalem"), 0);
  EXPECT_EQ(BlasCoreTier(""), 0);
}

TEST(BlasCoreTest, AutoReplacesOnlyAGenericCoreTheUserDidNotChoose) {
  // OpenBLAS did not know the CPU: its generic core goes.
  EXPECT_EQ(AutoBlasCore("Prescott", nullptr, "Cooperlake"), "Cooperlake");
  EXPECT_EQ(AutoBlasCore("Nehalem", nullptr, "Haswell"), "Haswell");
  // A core OpenBLAS chose on purpose stays, even a narrower one.
  EXPECT_EQ(AutoBlasCore("Zen", nullptr, "SkylakeX"), "");
  EXPECT_EQ(AutoBlasCore("SkylakeX", nullptr, "Cooperlake"), "");
  // The user's $OPENBLAS_CORETYPE stays, set or empty.
  EXPECT_EQ(AutoBlasCore("Prescott", "Prescott", "Cooperlake"), "");
  EXPECT_EQ(AutoBlasCore("Prescott", "", "Cooperlake"), "");
  // Nothing wider to go to, or no OpenBLAS.
  EXPECT_EQ(AutoBlasCore("Prescott", nullptr, "Prescott"), "");
  EXPECT_EQ(AutoBlasCore("", nullptr, "Cooperlake"), "");
}

TEST(BlasCoreTest, NamesTheCoreOfThisProcessAndThisCpu) {
  // A BLAS call first, so a lazily loaded BLAS is there.
  torch::Tensor a = torch::ones({8, 8});
  EXPECT_FLOAT_EQ(torch::mm(a, a)[0][0].item<float>(), 8.0f);
  const std::string cpu = CpuBlasCore();
#if defined(__x86_64__)
  EXPECT_FALSE(cpu.empty());
  // Every x86-64 CPU has SSE3 at least; the name is one OpenBLAS knows.
  EXPECT_TRUE(cpu == "Prescott" || BlasCoreTier(cpu) > 0) << cpu;
#endif
  const std::string running = OpenBlasCore();
  if (running.empty()) GTEST_SKIP() << "no OpenBLAS in this process";
  // Whatever OpenBLAS chose (this test is not started again by
  // --blas_core), it runs on this CPU, so its vectors are not wider.
  EXPECT_LE(BlasCoreTier(running), BlasCoreTier(cpu))
      << running << " on " << cpu;
}

}  // namespace
}  // namespace zshard
