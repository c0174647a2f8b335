// StepReporter against a real shard server on 127.0.0.1: reports issued far
// faster than gRPC answers them all arrive, in order of sending, and errors
// are counted rather than retried.
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

  std::unique_ptr<v1::ShardService::Stub> StubTo(uint32_t shard) {
    return v1::ShardService::NewStub(grpc::CreateChannel(
        servers_[shard]->endpoint(), grpc::InsecureChannelCredentials()));
  }

  std::vector<std::unique_ptr<ShardServer>> servers_;
};

TEST_F(StepReporterTest, EveryReportArrivesWhenTheyComeFasterThanAnswers) {
  constexpr int kSteps = 500;
  auto stub = StubTo(0);
  auto reporter = std::make_unique<StepReporter>(stub.get(), /*rank=*/1);
  for (int step = 1; step <= kSteps; ++step) {
    reporter->Report(step, 1.0 / step, 4, 0.001, 3);
  }
  EXPECT_EQ(reporter->counts().dropped, 0u);
  reporter.reset();  // waits until the waiting reports went out
  const StepHistory& history = servers_[0]->service().history();
  EXPECT_EQ(history.reports(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(history.Points().back().step, static_cast<uint64_t>(kSteps));
}

TEST_F(StepReporterTest, RefusedReportsAreCountedAsFailed) {
  auto stub = StubTo(1);  // not the coordinator: every report is refused
  StepReporter reporter(stub.get(), /*rank=*/0);
  for (int step = 1; step <= 20; ++step) reporter.Report(step, 1.0, 4, 0.001, 3);
  ASSERT_TRUE(reporter.WaitIdle(absl::Seconds(30)));
  const StepReporter::Counts c = reporter.counts();
  EXPECT_EQ(c.failed, 20u);
  EXPECT_EQ(c.sent, 0u);
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(servers_[0]->service().history().reports(), 0u);
}

}  // namespace
}  // namespace zshard
