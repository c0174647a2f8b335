#include "common/base/cluster_identity.h"

#include <map>

#include "gtest/gtest.h"

namespace zshard {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

TEST(OrdinalFromHostnameTest, StatefulSetNamesGiveTheirOrdinal) {
  EXPECT_EQ(*OrdinalFromHostname("zshard-0"), 0u);
  EXPECT_EQ(*OrdinalFromHostname("zshard-17"), 17u);
  EXPECT_EQ(*OrdinalFromHostname("my-shard-set-3"), 3u);
  EXPECT_EQ(*OrdinalFromHostname("zshard-2.zshard.ns.svc.cluster.local"), 2u);
}

TEST(OrdinalFromHostnameTest, NamesWithoutAnOrdinalAreRefusedNamingThem) {
  for (const char* bad : {"", "zshard", "zshard-", "-3", "zshard-a1",
                          "zshard-1a", "zshard-99999999999", "zshard-+1",
                          "zshard-2147483648", "node.zshard-1"}) {
    auto r = OrdinalFromHostname(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"),
              absl::string_view::npos)
        << r.status();
  }
}

TEST(DefaultTrainerRankTest, IndexedJobThenSlurmStepThenAssigned) {
  EXPECT_EQ(DefaultTrainerRank(FakeEnv({})), "-1");
  EXPECT_EQ(DefaultTrainerRank(FakeEnv({{"JOB_COMPLETION_INDEX", "3"},
                                        {"SLURM_PROCID", "1"},
                                        {"SLURM_STEP_ID", "0"}})),
            "3");
  EXPECT_EQ(DefaultTrainerRank(
                FakeEnv({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "2"}})),
            "1");
  // The batch script itself (no step) does not pick a rank.
  EXPECT_EQ(DefaultTrainerRank(FakeEnv({{"SLURM_PROCID", "0"}})), "-1");
}

TEST(CheckSlurmTaskCountTest, AStepWhoseTaskCountDisagreesIsRefused) {
  EXPECT_TRUE(CheckSlurmTaskCount(4, FakeEnv({})).ok());
  EXPECT_TRUE(
      CheckSlurmTaskCount(4, FakeEnv({{"SLURM_STEP_NUM_TASKS", "4"}})).ok());
  absl::Status st =
      CheckSlurmTaskCount(4, FakeEnv({{"SLURM_STEP_NUM_TASKS", "2"}}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--num_shards"), absl::string_view::npos);
  EXPECT_NE(st.message().find("SLURM_STEP_NUM_TASKS=2"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace zshard
