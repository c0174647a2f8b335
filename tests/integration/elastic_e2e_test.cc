// Elastic trainer membership with real processes (issue 16): zshard-server
// shards and zshard-train trainers on 127.0.0.1. A trainer killed with
// SIGKILL at a random point of a step is dropped after --trainer_timeout_s
// and the others go on; a new trainer takes the free rank and is admitted
// at a step boundary; a trainer stopped past the timeout is dropped and
// refused when it comes back; Joins that never become trainers hold no rank.
// Every run must end with every group on every shard at exactly --steps
// (each step applied once) and the coordinator's status must name each drop.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

using testing::Process;

std::string MakeTempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "zselastic.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

// A cluster of shard servers and the trainers started against it.
class ElasticCluster {
 public:
  ElasticCluster(int shards, int trainers, double trainer_timeout_s, int steps)
      : dir_(MakeTempDir()), trainers_(trainers), steps_(steps) {
    config_ = dir_ + "/ds_config.json";
    std::ofstream(config_) << R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3}})";
    for (int s = 0; s < shards; ++s) {
      const std::string port_file = dir_ + "/port" + std::to_string(s);
      std::vector<std::string> argv = {
          ZSHARD_SERVER_BIN,
          "--listen=127.0.0.1:0",
          "--port_file=" + port_file,
          "--shard_id=" + std::to_string(s),
          "--num_shards=" + std::to_string(shards),
          "--trainers=" + std::to_string(trainers),
          "--config=" + config_,
          "--wait_timeout_s=60",
          absl::StrCat("--trainer_timeout_s=", trainer_timeout_s)};
      if (s > 0) argv.push_back("--coordinator=" + coordinator_);
      servers_.push_back(std::make_unique<Process>(
          argv, dir_ + "/server" + std::to_string(s)));
      const int port = testing::WaitForPortFile(port_file, *servers_.back(),
                                                absl::Seconds(30));
      EXPECT_GT(port, 0) << servers_.back()->Stderr();
      if (s == 0) coordinator_ = "127.0.0.1:" + std::to_string(port);
    }
  }
  ~ElasticCluster() {
    trainer_procs_.clear();
    servers_.clear();
    std::filesystem::remove_all(dir_);
  }

  const std::string& coordinator() const { return coordinator_; }
  Process& server(int s) { return *servers_[s]; }

  // Starts a trainer process (any free rank); its index among all started.
  size_t StartTrainer() {
    const size_t i = trainer_procs_.size();
    std::vector<std::string> argv = {ZSHARD_TRAIN_BIN,
                                     "--coordinator=" + coordinator_,
                                     "--config=" + config_,
                                     "--steps=" + std::to_string(steps_),
                                     "--data=/usr/share/common-licenses",
                                     "--threads=1",
                                     "--log_every=0",
                                     "--context=16",
                                     "--d_model=32",
                                     "--layers=2",
                                     "--heads=2",
                                     "--seed=1"};
    trainer_procs_.push_back(
        std::make_unique<Process>(argv, dir_ + "/trainer" + std::to_string(i)));
    return i;
  }
  Process& trainer(size_t i) { return *trainer_procs_[i]; }
  size_t trainers_started() const { return trainer_procs_.size(); }

  // zshardctl status --json: every shard's GetStatus.
  nlohmann::json Status() {
    Process ctl({ZSHARDCTL_BIN, "status", "--server=" + coordinator_, "--json",
                 "--timeout_s=20"},
                dir_ + "/ctl" + std::to_string(ctl_runs_++));
    auto code = ctl.Wait(absl::Seconds(30));
    EXPECT_TRUE(code.has_value());
    auto j = nlohmann::json::parse(ctl.Stdout(), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << ctl.Stdout() << ctl.Stderr();
    return j;
  }
  // zshardctl status as an operator reads it.
  std::string StatusText() {
    Process ctl(
        {ZSHARDCTL_BIN, "status", "--server=" + coordinator_, "--timeout_s=20"},
        dir_ + "/ctl" + std::to_string(ctl_runs_++));
    ctl.Wait(absl::Seconds(30));
    return ctl.Stdout();
  }

  // Every shard's lowest and highest group version.
  std::pair<uint64_t, uint64_t> Versions() {
    nlohmann::json j = Status();
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& s : j) {
      lo = std::min<uint64_t>(lo, std::stoull(s.value("minVersion", "0")));
      hi = std::max<uint64_t>(hi, std::stoull(s.value("maxVersion", "0")));
    }
    return {lo, hi};
  }

  // Membership events of `kind` ("DROPPED", "ADMITTED", ...).
  std::vector<nlohmann::json> Events(const std::string& kind) {
    nlohmann::json j = Status();
    std::vector<nlohmann::json> out;
    if (!j.is_array() || j.empty()) return out;
    for (const auto& e :
         j[0].value("membershipEvents", nlohmann::json::array())) {
      if (e.value("kind", "") == kind) out.push_back(e);
    }
    return out;
  }

  // Waits for every trainer still running; EXPECTs each exits 0.
  void ExpectTrainersFinish(absl::Duration timeout) {
    for (size_t i = 0; i < trainer_procs_.size(); ++i) {
      if (killed_.count(i)) continue;
      auto code = trainer_procs_[i]->Wait(timeout);
      ASSERT_TRUE(code.has_value()) << "trainer " << i << " did not finish";
      EXPECT_EQ(*code, 0) << "trainer " << i << ":\n"
                          << trainer_procs_[i]->Stderr();
    }
  }
  void MarkKilled(size_t i) { killed_.insert(i); }

 private:
  const std::string dir_;
  const int trainers_;
  const int steps_;
  std::string config_;
  std::string coordinator_;
  std::vector<std::unique_ptr<Process>> servers_;
  std::vector<std::unique_ptr<Process>> trainer_procs_;
  std::set<size_t> killed_;
  int ctl_runs_ = 0;
};

TEST(ElasticE2ETest,
     KilledTrainersAreDroppedReplacedAndEveryStepIsAppliedOnce) {
  constexpr int kSteps = 4000;
  constexpr int kKills = 10;
  ElasticCluster c(/*shards=*/2, /*trainers=*/2, /*timeout_s=*/1.5, kSteps);
  ASSERT_FALSE(c.coordinator().empty());
  std::vector<size_t> live = {c.StartTrainer(), c.StartTrainer()};
  std::mt19937 rng(16);
  int kills = 0;
  for (int i = 0; i < kKills; ++i) {
    // Both live trainers admitted (the replacement is training), then a
    // random point of some step.
    const absl::Time admitted_by = absl::Now() + absl::Seconds(60);
    while (c.Events("ADMITTED").size() < static_cast<size_t>(2 + kills) &&
           absl::Now() < admitted_by) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    absl::SleepFor(
        absl::Milliseconds(std::uniform_int_distribution<int>(300, 1200)(rng)));
    if (c.Versions().second >= kSteps) break;
    const size_t pick = std::uniform_int_distribution<size_t>(0, 1)(rng);
    c.trainer(live[pick]).Signal(SIGKILL);
    c.trainer(live[pick]).Wait(absl::Seconds(10));
    c.MarkKilled(live[pick]);
    ++kills;
    live[pick] = c.StartTrainer();  // a new process takes the free rank
  }
  EXPECT_EQ(kills, kKills) << "the run ended before every kill";
  c.ExpectTrainersFinish(absl::Seconds(300));
  if (HasFatalFailure()) return;

  // Every step applied exactly once, on every shard.
  const auto [lo, hi] = c.Versions();
  EXPECT_EQ(lo, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(hi, static_cast<uint64_t>(kSteps));
  // Each kill is named in the status: dropped for its silence.
  const auto dropped = c.Events("DROPPED");
  EXPECT_EQ(dropped.size(), static_cast<size_t>(kills));
  for (const auto& e : dropped) {
    EXPECT_TRUE(absl::StrContains(e.value("reason", ""), "no heartbeat for"))
        << e.dump();
  }
  EXPECT_EQ(c.Events("ADMITTED").size(), static_cast<size_t>(2 + kills));
  const std::string text = c.StatusText();
  EXPECT_TRUE(absl::StrContains(text, "dropped: no heartbeat for")) << text;
  EXPECT_TRUE(absl::StrContains(c.server(0).Stderr(), "dropped at step"));
}

TEST(ElasticE2ETest, AStoppedTrainerIsDroppedThenRefusedWhenItComesBack) {
  constexpr int kSteps = 4000;
  ElasticCluster c(/*shards=*/2, /*trainers=*/2, /*timeout_s=*/1.5, kSteps);
  ASSERT_FALSE(c.coordinator().empty());
  const size_t t0 = c.StartTrainer();
  const size_t t1 = c.StartTrainer();
  absl::SleepFor(absl::Seconds(3));
  c.trainer(t1).Signal(SIGSTOP);
  // Past the timeout the other trainer goes on alone.
  absl::SleepFor(absl::Seconds(3));
  const uint64_t during = c.Versions().second;
  absl::SleepFor(absl::Seconds(1));
  const uint64_t later = c.Versions().second;
  EXPECT_LT(during, static_cast<uint64_t>(kSteps)) << "the run ended early";
  EXPECT_GT(later, during) << "training stopped with the stopped trainer\n"
                           << c.StatusText();
  c.trainer(t1).Signal(SIGCONT);
  // It comes back to find its rank gone: it exits saying so.
  auto code = c.trainer(t1).Wait(absl::Seconds(60));
  ASSERT_TRUE(code.has_value()) << "the stopped trainer never exited";
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(absl::StrContains(c.trainer(t1).Stderr(), "dropped"))
      << c.trainer(t1).Stderr();
  c.MarkKilled(t1);
  // A new trainer takes the rank; the run ends with every step applied once.
  c.StartTrainer();
  c.ExpectTrainersFinish(absl::Seconds(300));
  (void)t0;
  const auto [lo, hi] = c.Versions();
  EXPECT_EQ(lo, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(hi, static_cast<uint64_t>(kSteps));
  ASSERT_EQ(c.Events("DROPPED").size(), 1u);
}

TEST(ElasticE2ETest, JoinsThatNeverTrainHoldNoRank) {
  ElasticCluster c(/*shards=*/1, /*trainers=*/2, /*timeout_s=*/1.0,
                   /*steps=*/20);
  ASSERT_FALSE(c.coordinator().empty());
  auto stub = v1::ShardService::NewStub(
      grpc::CreateChannel(c.coordinator(), grpc::InsecureChannelCredentials()));
  // Two phantoms take both ranks and never heartbeat.
  for (uint64_t instance : {0xdeadull, 0xbeefull}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::JoinRequest req;
    req.set_requested_rank(-1);
    req.set_instance_id(instance);
    req.set_host("phantom");
    v1::JoinResponse resp;
    ASSERT_TRUE(stub->Join(&ctx, req, &resp).ok());
  }
  {
    // Without an identity nothing is held at all.
    grpc::ClientContext ctx;
    v1::JoinRequest req;
    req.set_requested_rank(-1);
    v1::JoinResponse resp;
    EXPECT_EQ(stub->Join(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Real trainers find every rank held, wait, and get them once the
  // phantoms expire.
  c.StartTrainer();
  c.StartTrainer();
  c.ExpectTrainersFinish(absl::Seconds(120));
  const auto expired = c.Events("EXPIRED");
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_TRUE(absl::StrContains(expired[0].value("identity", ""), "phantom"));
  const auto [lo, hi] = c.Versions();
  EXPECT_EQ(lo, 20u);
  EXPECT_EQ(hi, 20u);
}

}  // namespace
}  // namespace zshard
