// Publisher against a real in-memory transport (inline): leases are granted
// the moment a version is published, a slot is rewritten only once its
// leases are released or expired, and waits end at their deadlines.
#include "server/publisher.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "common/transport/inline/inline_transport.h"
#include "gtest/gtest.h"

namespace zshard {
namespace {

class PublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = std::make_unique<InlineTransport>("publisher_test");
  }
  std::unique_ptr<Publisher> Make(
      absl::Duration lease_timeout = absl::Seconds(30)) {
    PublisherOptions o;
    o.shard_id = 3;
    o.lease_timeout = lease_timeout;
    o.transport = transport_.get();
    auto p = Publisher::Create(o, {8, 0});
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(*p);
  }
  // Writes `value` everywhere in `group`'s slot for `version` and publishes.
  static void PublishFilled(Publisher& p, uint32_t group, uint64_t version,
                            float value) {
    auto* out = static_cast<float*>(p.AcquireSlot(group, version));
    for (int i = 0; i < 8; ++i) out[i] = value;
    p.Publish(group, version, absl::Now());
  }
  std::unique_ptr<InlineTransport> transport_;
};

TEST_F(PublisherTest, LeaseWaitingForAVersionIsGrantedWhenItIsPublished) {
  auto p = Make();
  PublishFilled(*p, 0, 0, 1.0f);
  absl::StatusOr<Publisher::Grant> grant;
  absl::Time granted_at;
  std::thread waiter([&] {
    grant = p->Lease(0, 1, /*rank=*/0, absl::Now() + absl::Seconds(10), {}, {});
    granted_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time published_at = absl::Now();
  PublishFilled(*p, 0, 1, 2.0f);
  waiter.join();
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->version, 1u);
  // Woken by the publish, not by a poll interval.
  EXPECT_LT(granted_at - published_at, absl::Milliseconds(40));
  auto copy = p->Read(0, 1, absl::Now() + absl::Seconds(1), {}, {});
  ASSERT_TRUE(copy.ok());
  float first;
  std::memcpy(&first, copy->bytes.data(), sizeof(first));
  EXPECT_EQ(first, 2.0f);
  EXPECT_EQ(p->Latency().count, 1u);
}

TEST_F(PublisherTest, SlotIsRewrittenOnlyAfterItsLeaseIsReleased) {
  auto p = Make();
  PublishFilled(*p, 0, 0, 1.0f);
  auto lease = p->Lease(0, 0, 1, absl::Now() + absl::Seconds(1), {}, {});
  ASSERT_TRUE(lease.ok());
  PublishFilled(*p, 0, 1, 2.0f);  // the other slot: no wait
  // Version 2 goes into version 0's slot, which rank 1 still holds.
  std::atomic<bool> acquired{false};
  std::thread writer([&] {
    p->AcquireSlot(0, 2);
    acquired = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(acquired.load());
  // Another rank cannot release it.
  EXPECT_EQ(p->Release(0, {lease->lease_id}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->Release(1, {lease->lease_id}).ok());
  writer.join();
  EXPECT_TRUE(acquired.load());
}

TEST_F(PublisherTest, UnreleasedLeaseFreesItsSlotAtItsDeadline) {
  auto p = Make(absl::Milliseconds(200));
  PublishFilled(*p, 0, 0, 1.0f);
  ASSERT_TRUE(p->Lease(0, 0, 0, absl::Now() + absl::Seconds(1), {}, {}).ok());
  PublishFilled(*p, 0, 1, 2.0f);
  const absl::Time start = absl::Now();
  p->AcquireSlot(0, 2);  // the trainer died: its lease expires
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_EQ(p->LeaseStats()[0].expired, 1u);
}

TEST_F(PublisherTest, WaitsEndAtTheirDeadlineNamingWhatIsMissing) {
  auto p = Make();
  PublishFilled(*p, 0, 0, 1.0f);
  const absl::Time start = absl::Now();
  auto grant = p->Lease(0, 1, 0, start + absl::Milliseconds(150), {},
                        [] { return std::string("1"); });
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(grant.status().message().find("trainer ranks 1"), std::string::npos)
      << grant.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  auto cancelled = p->Lease(0, 1, 0, absl::Now() + absl::Seconds(10),
                            [] { return true; }, {});
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  // A group with no elements here is not leased.
  p->Publish(1, 0, absl::InfinitePast());
  EXPECT_EQ(
      p->Lease(1, 0, 0, absl::Now() + absl::Seconds(1), {}, {}).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zshard
