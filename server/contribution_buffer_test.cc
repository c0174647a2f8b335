// ContributionBuffer over a real landing pool (the inline transport's
// memory): the folded bits do not depend on arrival order or on when the
// engine folds, slots go back to the pool once folded, admission knows which
// contributions are in order, and bad contributions change nothing.
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

constexpr uint32_t kTrainers = 16;
constexpr uint32_t kMicro = 2;
constexpr uint64_t kElements = 257;

// Contribution values whose fp32 sum depends on the order of additions.
float Value(uint32_t c, uint64_t i) {
  const float big = (c % 3 == 0) ? 1e7f : 1.0f;
  return big * static_cast<float>((c * 7919 + i * 104729) % 1000) / 997.0f -
         (c % 2 ? 3.3e6f : 0.0f);
}

// The reduce's definition: a sequential fp32 sum in (micro-step, rank)
// order, the first contribution copied.
std::vector<float> Expected(bool bf16) {
  auto v = [bf16](uint32_t c, uint64_t i) {
    return bf16 ? kernels::Bf16BitsToFp32(kernels::Fp32ToBf16Bits(Value(c, i)))
                : Value(c, i);
  };
  std::vector<float> out(kElements);
  for (uint64_t i = 0; i < kElements; ++i) {
    out[i] = v(0, i);
    for (uint32_t c = 1; c < kTrainers * kMicro; ++c) out[i] += v(c, i);
  }
  return out;
}

class ContributionBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = std::make_unique<InlineTransport>("contribution_buffer_test");
  }
  void MakePool(uint32_t slots, bool bf16 = false) {
    LandingPoolOptions o;
    o.slots = slots;
    o.slot_bytes = kElements * (bf16 ? sizeof(uint16_t) : sizeof(float));
    o.transport = transport_.get();
    auto p = LandingPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
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
    o.pool = pool_.get();
    auto b = ContributionBuffer::Create(o, step);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  // What a trainer does: a slot, its values put there, then Land.
  void Push(ContributionBuffer& b, uint32_t rank, uint32_t micro, bool bf16,
            ContributionBuffer::Arrival* arrival) {
    auto slot = pool_->TryTake(0);
    ASSERT_TRUE(slot.has_value());
    ASSERT_TRUE(b.Reserve(5, micro, rank, *slot).ok());
    const uint32_t c = micro * kTrainers + rank;  // its place in the order
    char* dst = pool_->slot_data(*slot);
    for (uint64_t i = 0; i < kElements; ++i) {
      if (bf16) {
        const uint16_t h = kernels::Fp32ToBf16Bits(Value(c, i));
        std::memcpy(dst + 2 * i, &h, 2);
      } else {
        const float f = Value(c, i);
        std::memcpy(dst + 4 * i, &f, 4);
      }
    }
    auto a = b.Land(5, micro, rank);
    ASSERT_TRUE(a.ok()) << a.status();
    *arrival = *a;
  }
  // Arrival in `order` (contribution numbers), the engine folding after a
  // random number of arrivals; returns the sum.
  std::vector<float> Run(const std::vector<uint32_t>& order, bool bf16,
                         std::mt19937& rng) {
    auto b = Make(bf16);
    size_t folded = 0;
    bool complete = false;
    for (size_t k = 0; k < order.size(); ++k) {
      ContributionBuffer::Arrival a;
      Push(*b, order[k] % kTrainers, order[k] / kTrainers, bf16, &a);
      EXPECT_EQ(a.bytes, b->contribution_bytes());
      if (rng() % 3 == 0 || k + 1 == order.size()) {
        const auto f = b->Fold();
        folded += f.contributions;
        EXPECT_FALSE(complete && f.complete);
        complete |= f.complete;
      }
    }
    EXPECT_TRUE(complete);
    EXPECT_EQ(folded, order.size());
    EXPECT_EQ(pool_->stats().in_use, 0u);  // every slot given back
    EXPECT_EQ(b->Fold().contributions, 0u);
    return std::vector<float>(b->sum(), b->sum() + kElements);
  }

  std::unique_ptr<InlineTransport> transport_;
  std::unique_ptr<LandingPool> pool_;
};

TEST_F(ContributionBufferTest, SixteenTrainersInAnyOrderGiveTheSameBits) {
  MakePool(kTrainers * kMicro);
  const std::vector<float> want = Expected(false);
  std::vector<uint32_t> order(kTrainers * kMicro);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<float> sum = Run(order, false, rng);
    ASSERT_EQ(std::memcmp(sum.data(), want.data(), kElements * sizeof(float)),
              0)
        << "trial " << trial;
  }
}

// Every contribution landed before the engine folds: the first two go into
// the sum in one pass (a + b), the same bits as a copy and then an add.
TEST_F(ContributionBufferTest, AllLandedBeforeTheFirstFoldGiveTheSameBits) {
  MakePool(kTrainers * kMicro);
  std::vector<uint32_t> order(kTrainers * kMicro);
  std::iota(order.begin(), order.end(), 0);
  auto b = Make();
  for (uint32_t c : order) {
    ContributionBuffer::Arrival a;
    Push(*b, c % kTrainers, c / kTrainers, false, &a);
  }
  const auto f = b->Fold();
  EXPECT_TRUE(f.complete);
  EXPECT_EQ(f.contributions, order.size());
  EXPECT_EQ(pool_->stats().in_use, 0u);
  const std::vector<float> want = Expected(false);
  ASSERT_EQ(std::memcmp(b->sum(), want.data(), kElements * sizeof(float)), 0);
}

TEST_F(ContributionBufferTest, Bf16ContributionsAreWidenedExactlyBeforeTheSum) {
  MakePool(kTrainers * kMicro, /*bf16=*/true);
  const std::vector<float> want = Expected(true);
  std::vector<uint32_t> order(kTrainers * kMicro);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<float> sum = Run(order, true, rng);
    for (uint64_t i = 0; i < kElements; ++i) ASSERT_EQ(sum[i], want[i]) << i;
  }
}

TEST_F(ContributionBufferTest, InOrderMeansEveryPredecessorHasASlot) {
  MakePool(4);
  auto b = Make();
  // Fold order: micro-step 0 of every rank, then micro-step 1.
  EXPECT_TRUE(*b->InOrder(5, 0, 0));
  EXPECT_FALSE(*b->InOrder(5, 0, 1));
  EXPECT_FALSE(*b->InOrder(5, 1, 0));
  ASSERT_TRUE(b->Reserve(5, 0, 0, *pool_->TryTake(0)).ok());
  EXPECT_TRUE(*b->InOrder(5, 0, 1));  // rank 0 has a slot (not landed yet)
  EXPECT_FALSE(*b->InOrder(5, 0, 2));
  ASSERT_TRUE(b->Reserve(5, 0, 2, *pool_->TryTake(0)).ok());
  ASSERT_TRUE(b->Reserve(5, 0, 1, *pool_->TryTake(0)).ok());
  EXPECT_TRUE(*b->InOrder(5, 0, 3));  // 0, 1, 2 all have one
  // Nothing folds before rank 0 lands; rank 1 and 2 then fold with it.
  ASSERT_TRUE(b->Land(5, 0, 2).ok());
  ASSERT_TRUE(b->Land(5, 0, 1).ok());
  EXPECT_EQ(b->Fold().contributions, 0u);
  EXPECT_EQ(pool_->stats().in_use, 3u);
  auto a = b->Land(5, 0, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->fold);
  EXPECT_EQ(b->Fold().contributions, 3u);
  EXPECT_EQ(pool_->stats().in_use, 0u);
  // An aborted reservation gives its slot back and is out of the prefix.
  ASSERT_TRUE(b->Reserve(5, 0, 3, *pool_->TryTake(0)).ok());
  EXPECT_TRUE(*b->InOrder(5, 0, 4));
  b->Abort(5, 0, 3);
  EXPECT_EQ(pool_->stats().in_use, 0u);
  EXPECT_FALSE(*b->InOrder(5, 0, 4));
  EXPECT_TRUE(*b->InOrder(5, 0, 3));
}

TEST_F(ContributionBufferTest, BadContributionsAreRefusedAndChangeNothing) {
  MakePool(2);
  auto b = Make();
  const uint32_t slot = *pool_->TryTake(0);
  EXPECT_EQ(b->Reserve(5, 0, kTrainers, slot).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Reserve(5, kMicro, 0, slot).code(),
            absl::StatusCode::kInvalidArgument);
  auto past = b->Reserve(4, 0, 0, slot);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past.message().find("from the past"), std::string::npos);
  EXPECT_EQ(b->Reserve(6, 0, 0, slot).code(),
            absl::StatusCode::kFailedPrecondition);
  // Landing without a reservation.
  auto bare = b->Land(5, 0, 0);
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bare.status().message().find("without a landing slot"),
            std::string::npos);
  EXPECT_TRUE(b->Quiet());
  ASSERT_TRUE(b->Reserve(5, 1, 3, slot).ok());
  EXPECT_EQ(b->Reserve(5, 1, 3, slot).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->Land(5, 1, 3).ok());
  EXPECT_EQ(b->Land(5, 1, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto p = b->GetProgress();
  EXPECT_EQ(p.complete, 1u);
  EXPECT_EQ(p.waiting_for.size(), kTrainers);  // rank 3 misses micro-step 0
  // A chunked push out of order, outside the slice, or without a slot.
  float x[4] = {1, 2, 3, 4};
  EXPECT_EQ(b->Accept(5, 0, 0, 100, x, 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const uint32_t slot2 = *pool_->TryTake(0);
  ASSERT_TRUE(b->Reserve(5, 0, 0, slot2).ok());
  EXPECT_EQ(b->Accept(5, 0, 0, 101, x, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Accept(5, 0, 0, 99, x, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->Accept(5, 0, 0, 100, x, 4).ok());
  EXPECT_EQ(b->Land(5, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // partly pushed already
  b->Abort(5, 0, 0);  // the partial contribution is forgotten, slot back
  EXPECT_EQ(pool_->stats().in_use, 1u);
  b->Abort(5, 1, 3);  // a landed one is kept
  EXPECT_EQ(b->GetProgress().complete, 1u);
  EXPECT_EQ(pool_->stats().in_use, 1u);
}

}  // namespace
}  // namespace zshard

namespace zshard {
namespace {

// Only the trainable elements land: a contribution is their compact run; a
// slice with none takes contributions of no bytes (a Landed alone, no slot).
TEST(ContributionBufferFrozenTest, OnlyTrainableElementsLandAndAreSummed) {
  LandingPoolOptions po;
  po.slots = 2;
  po.slot_bytes = 3 * sizeof(float);
  auto pool = LandingPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ContributionBufferOptions o;
  o.slice = Slice{100, 110};
  o.trainable = std::vector<std::pair<uint64_t, uint64_t>>{{1, 3}, {7, 8}};
  o.world_size = 2;
  o.pool = pool->get();
  auto b = ContributionBuffer::Create(o, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->elements(), 3u);
  EXPECT_EQ((*b)->bytes(), 3 * sizeof(float));
  // Rank 0 puts its compact run into its slot; rank 1 pushes in process in
  // the full layout, in two chunks (the frozen values are ignored).
  const uint32_t s0 = *(*pool)->TryTake(0), s1 = *(*pool)->TryTake(0);
  ASSERT_TRUE((*b)->Reserve(0, 0, 0, s0).ok());
  ASSERT_TRUE((*b)->Reserve(0, 0, 1, s1).ok());
  const float run[3] = {1, 2, 3};
  std::memcpy((*pool)->slot_data(s0), run, sizeof(run));
  auto a = (*b)->Land(0, 0, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 3 * sizeof(float));
  EXPECT_TRUE(a->fold);
  const float full[10] = {99, 10, 20, 99, 99, 99, 99, 30, 99, 99};
  a = (*b)->Accept(0, 0, 1, 100, full, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->fold);  // not all there yet
  a = (*b)->Accept(0, 0, 1, 105, full + 5, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->fold);  // rank 0 is not folded yet: its Fold does both
  const auto f = (*b)->Fold();
  EXPECT_EQ(f.contributions, 2u);
  EXPECT_TRUE(f.complete);
  const float* sum = (*b)->sum();
  EXPECT_EQ(sum[0], 11);
  EXPECT_EQ(sum[1], 22);
  EXPECT_EQ(sum[2], 33);

  o.trainable = std::vector<std::pair<uint64_t, uint64_t>>{};
  o.pool = nullptr;  // no trainable element: no slot needed
  auto frozen = ContributionBuffer::Create(o, 0);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ((*frozen)->elements(), 0u);
  ASSERT_TRUE((*frozen)->Land(0, 0, 0).ok());
  EXPECT_EQ((*frozen)->Land(0, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // already there
  a = (*frozen)->Land(0, 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 0u);
  EXPECT_TRUE((*frozen)->Fold().complete);

  // Slots too small for a contribution, or no pool where one is needed.
  o.trainable = std::nullopt;
  o.pool = pool->get();
  EXPECT_EQ(ContributionBuffer::Create(o, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.pool = nullptr;
  EXPECT_EQ(ContributionBuffer::Create(o, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zshard
