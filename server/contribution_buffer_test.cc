// ContributionBuffer with real landing memory (the inline transport's): the
// reduced bits do not depend on arrival order, each slot lands once, and bad
// contributions change nothing.
#include "server/contribution_buffer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "common/transport/inline/inline_transport.h"
#include "gtest/gtest.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace {

constexpr uint32_t kTrainers = 8;
constexpr uint32_t kMicro = 2;
constexpr uint64_t kElements = 257;

// Contribution values whose fp32 sum depends on the order of additions.
float Value(uint32_t slot, uint64_t i) {
  const float big = (slot % 3 == 0) ? 1e7f : 1.0f;
  return big * static_cast<float>((slot * 7919 + i * 104729) % 1000) / 997.0f -
         (slot % 2 ? 3.3e6f : 0.0f);
}

class ContributionBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = std::make_unique<InlineTransport>("contribution_buffer_test");
    auto k = kernels::CpuKernels::Create({});
    ASSERT_TRUE(k.ok());
    kernels_ = std::move(*k);
  }
  std::unique_ptr<ContributionBuffer> Make(bool bf16 = false,
                                           uint64_t step = 5) {
    ContributionBufferOptions o;
    o.shard_id = 1;
    o.group = 2;
    o.slice = Slice{100, 100 + kElements};
    o.world_size = kTrainers;
    o.accumulation_steps = kMicro;
    o.bf16 = bf16;
    o.transport = transport_.get();
    auto b = ContributionBuffer::Create(o, step);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  // What a trainer's put does: its values into its landing slot.
  static void Put(ContributionBuffer& b, uint32_t rank, uint32_t micro) {
    const uint32_t slot = rank * kMicro + micro;
    float* dst = static_cast<float*>(b.landing()->data()) + slot * kElements;
    for (uint64_t i = 0; i < kElements; ++i) dst[i] = Value(slot, i);
  }
  std::unique_ptr<InlineTransport> transport_;
  std::unique_ptr<kernels::CpuKernels> kernels_;
};

TEST_F(ContributionBufferTest, ReducedBitsDoNotDependOnArrivalOrder) {
  std::vector<float> expected(kElements, 0.0f);
  for (uint64_t i = 0; i < kElements; ++i) {
    expected[i] = Value(0, i);
    for (uint32_t s = 1; s < kTrainers * kMicro; ++s)
      expected[i] += Value(s, i);
  }
  std::vector<uint32_t> order(kTrainers * kMicro);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    auto b = Make();
    for (size_t k = 0; k < order.size(); ++k) {
      const uint32_t rank = order[k] / kMicro, micro = order[k] % kMicro;
      Put(*b, rank, micro);
      auto a = b->Land(5, micro, rank);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->complete, k + 1 == order.size());
      EXPECT_EQ(a->bytes, kElements * sizeof(float));
    }
    const float* sum = b->Reduce(*kernels_);
    ASSERT_EQ(std::memcmp(sum, expected.data(), kElements * sizeof(float)), 0)
        << "trial " << trial;
  }
}

TEST_F(ContributionBufferTest, BadContributionsAreRefusedAndChangeNothing) {
  auto b = Make();
  EXPECT_EQ(b->Land(5, 0, kTrainers).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Land(5, kMicro, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto past = b->Land(4, 0, 0);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past.status().message().find("from the past"), std::string::npos);
  EXPECT_EQ(b->Land(6, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(b->Quiet());
  ASSERT_TRUE(b->Land(5, 1, 3).ok());
  EXPECT_EQ(b->Land(5, 1, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto p = b->GetProgress();
  EXPECT_EQ(p.complete, 1u);
  EXPECT_EQ(p.waiting_for.size(),
            kTrainers);  // rank 3 still misses micro-step 0
  // A chunked push out of order, outside the slice, or after a complete one.
  float x[4] = {1, 2, 3, 4};
  EXPECT_EQ(b->Accept(5, 0, 0, 101, x, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Accept(5, 0, 0, 99, x, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->Accept(5, 0, 0, 100, x, 4).ok());
  b->Abort(5, 0, 0);  // the partial contribution is forgotten
  ASSERT_TRUE(b->Accept(5, 0, 0, 100, x, 4).ok());
  b->Abort(5, 1, 3);  // a complete one is kept
  EXPECT_EQ(b->GetProgress().complete, 1u);
  b->Reset(6);
  EXPECT_TRUE(b->Quiet());
  EXPECT_TRUE(b->Land(6, 1, 3).ok());
}

TEST_F(ContributionBufferTest, Bf16ContributionsAreWidenedExactlyBeforeTheSum) {
  auto b = Make(/*bf16=*/true);
  for (uint32_t s = 0; s < kTrainers * kMicro; ++s) {
    auto* dst = static_cast<uint16_t*>(b->landing()->data()) + s * kElements;
    for (uint64_t i = 0; i < kElements; ++i)
      dst[i] = kernels::Fp32ToBf16Bits(Value(s, i));
    ASSERT_TRUE(b->Land(5, s % kMicro, s / kMicro).ok());
  }
  EXPECT_EQ(b->landing()->size(),
            kTrainers * kMicro * kElements * sizeof(uint16_t));
  const float* sum = b->Reduce(*kernels_);
  for (uint64_t i = 0; i < kElements; ++i) {
    float want = kernels::Bf16BitsToFp32(kernels::Fp32ToBf16Bits(Value(0, i)));
    for (uint32_t s = 1; s < kTrainers * kMicro; ++s) {
      want += kernels::Bf16BitsToFp32(kernels::Fp32ToBf16Bits(Value(s, i)));
    }
    ASSERT_EQ(sum[i], want) << i;
  }
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// Only the trainable elements land: a contribution is their compact run; a
// slice with none takes contributions of no bytes (a Landed alone).
TEST(ContributionBufferFrozenTest, OnlyTrainableElementsLandAndAreSummed) {
  InlineTransport transport("contribution_buffer_frozen_test");
  auto k = kernels::CpuKernels::Create({});
  ASSERT_TRUE(k.ok());
  ContributionBufferOptions o;
  o.slice = Slice{100, 110};
  o.trainable = std::vector<std::pair<uint64_t, uint64_t>>{{1, 3}, {7, 8}};
  o.world_size = 2;
  o.transport = &transport;
  auto b = ContributionBuffer::Create(o, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->elements(), 3u);
  ASSERT_NE((*b)->landing(), nullptr);
  EXPECT_EQ((*b)->landing()->size(), 2 * 3 * sizeof(float));
  // Rank 0 puts its compact run into its slot; rank 1 pushes in process in
  // the full layout, in two chunks (the frozen values are ignored).
  float* slot0 = static_cast<float*>((*b)->landing()->data());
  slot0[0] = 1;
  slot0[1] = 2;
  slot0[2] = 3;
  auto a = (*b)->Land(0, 0, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 3 * sizeof(float));
  EXPECT_FALSE(a->complete);
  const float full[10] = {99, 10, 20, 99, 99, 99, 99, 30, 99, 99};
  a = (*b)->Accept(0, 0, 1, 100, full, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 2 * sizeof(float));
  EXPECT_FALSE(a->complete);
  a = (*b)->Accept(0, 0, 1, 105, full + 5, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->complete);
  const float* sum = (*b)->Reduce(**k);
  EXPECT_EQ(sum[0], 11);
  EXPECT_EQ(sum[1], 22);
  EXPECT_EQ(sum[2], 33);

  o.trainable = std::vector<std::pair<uint64_t, uint64_t>>{};
  auto frozen = ContributionBuffer::Create(o, 0);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ((*frozen)->elements(), 0u);
  EXPECT_EQ((*frozen)->landing(), nullptr);
  ASSERT_TRUE((*frozen)->Land(0, 0, 0).ok());
  EXPECT_EQ((*frozen)->Land(0, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // already there
  a = (*frozen)->Land(0, 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->complete);
  EXPECT_EQ(a->bytes, 0u);
}

}  // namespace
}  // namespace zshard
