// StepReporter against a real shard server on 127.0.0.1: every report is
// either accepted, refused (counted as failed) or, when 8 are already in
// flight, dropped and counted; none is lost without a count.
#include "client/core/step_reporter.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/in_process_shards.h"

namespace zshard {
namespace {

class StepReporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardServerOptions o;
    o.service.store.world_size = 2;
    o.transport = "inline";
    auto servers = testing::StartShards(o, 2);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
  }

  std::unique_ptr<v1::ShardService::Stub> ClientOf(uint32_t shard) {
    return v1::ShardService::NewStub(grpc::CreateChannel(
        servers_[shard]->endpoint(), grpc::InsecureChannelCredentials()));
  }

  std::vector<std::unique_ptr<ShardServer>> servers_;
};

TEST_F(StepReporterTest, EveryReportIsAcceptedOrCountedAsDropped) {
  constexpr int kSteps = 500;
  auto shard = ClientOf(0);
  StepReporter reporter(shard.get(), /*rank=*/1);
  for (int step = 1; step <= kSteps; ++step) {
    reporter.Report(step, 1.0 / step, 4, 0.001, 3);
  }
  ASSERT_TRUE(reporter.WaitIdle(absl::Seconds(30)));
  const StepReporter::Counts c = reporter.counts();
  EXPECT_EQ(c.failed, 0u);
  EXPECT_EQ(c.sent + c.dropped, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(servers_[0]->service().history().reports(), c.sent);
}

TEST_F(StepReporterTest, RefusedReportsAreCountedAsFailed) {
  auto shard = ClientOf(1);  // not the coordinator: every report is refused
  StepReporter reporter(shard.get(), /*rank=*/0);
  // As many as may be in flight at once, so that none is dropped.
  for (int step = 1; step <= 8; ++step) reporter.Report(step, 1.0, 4, 0.001, 3);
  ASSERT_TRUE(reporter.WaitIdle(absl::Seconds(30)));
  const StepReporter::Counts c = reporter.counts();
  EXPECT_EQ(c.failed, 8u);
  EXPECT_EQ(c.sent, 0u);
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(servers_[0]->service().history().reports(), 0u);
}

}  // namespace
}  // namespace zshard
