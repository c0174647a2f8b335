// Shard replacement from a buddy's in-memory snapshot with real processes
// (issue 16, "Shards: replacement from a peer's memory"): 3 zshard-server
// shards and 2 zshard-train trainers on 127.0.0.1. Each shard in turn is
// killed with SIGKILL (shard 1, shard 2, whose buddy is shard 0, then shard
// 0, the coordinator) and replaced by a zshard-server --replace=K (shard 0's
// with --peer: it takes over as the coordinator, and the shards and
// trainers move to it); every shard rolls back to the newest snapshot held
// everywhere, the trainers join again and train on. A shard stopped with
// SIGSTOP (shard 1, or shard 0) is replaced the same way and, when it
// continues, is fenced: it exits saying another process serves its shard.
// Rolling back and redoing steps on the same data must give the bits of an
// undisturbed run.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"

namespace zshard {
namespace {

using testing::Process;

constexpr int kShards = 3;
constexpr int kTrainers = 2;
constexpr int kSteps = 300;
const char* kConfig = R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3},
      "zshard_fault_tolerance": {"snapshot_interval_steps": 1})";
// Disk checkpoints every 40 steps besides (the same bits: checkpoints do
// not change the numbers).
const char* kCheckpoints = R"(, "zshard_checkpoint": {"interval_steps": 40})";

std::string MakeTempDir() { return testing::MakeTempDir("zsreplace"); }

class Cluster {
 public:
  explicit Cluster(bool checkpoints = false)
      : dir_(MakeTempDir()), checkpoints_(checkpoints) {
    config_ = dir_ + "/ds_config.json";
    std::ofstream(config_) << kConfig << (checkpoints ? kCheckpoints : "")
                           << "}";
    for (int s = 0; s < kShards; ++s) StartServer(s, false);
  }
  ~Cluster() {
    trainers_.clear();
    servers_.clear();
    if (std::getenv("ZSHARD_KEEP_TEST_DIR")) {
      std::printf("kept %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  // Shard `s` (a replacement with `replace`); its process stays in the list.
  Process& StartServer(int s, bool replace) {
    const std::string name = absl::StrCat("server", s, "_", runs_++);
    const std::string port_file = dir_ + "/" + name + ".port";
    std::vector<std::string> argv = {ZSHARD_SERVER_BIN,
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file,
                                     absl::StrCat("--shard_id=", s),
                                     absl::StrCat("--num_shards=", kShards),
                                     absl::StrCat("--trainers=", kTrainers),
                                     "--config=" + config_,
                                     "--wait_timeout_s=60",
                                     "--trainer_timeout_s=5"};
    if (s > 0) argv.push_back("--coordinator=" + coordinator_);
    if (checkpoints_) argv.push_back("--checkpoint_dir=" + dir_ + "/ckpt");
    if (replace) argv.push_back(absl::StrCat("--replace=", s));
    // Shard 0's replacement learns the cluster from shard 1.
    if (replace && s == 0) argv.push_back("--peer=" + endpoints_[1]);
    servers_.push_back(std::make_unique<Process>(argv, dir_ + "/" + name));
    const int port = testing::WaitForPortFile(port_file, *servers_.back(),
                                              absl::Seconds(60));
    EXPECT_GT(port, 0) << servers_.back()->Stderr();
    endpoints_[s] = absl::StrCat("127.0.0.1:", port);
    if (s == 0) coordinator_ = endpoints_[0];
    return *servers_.back();
  }
  Process& server(size_t i) { return *servers_[i]; }

  void StartTrainers() {
    for (int r = 0; r < kTrainers; ++r) {
      std::vector<std::string> argv = {ZSHARD_TRAIN_BIN,
                                       "--coordinator=" + coordinator_,
                                       "--config=" + config_,
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--steps=", kSteps),
                                       "--data=/usr/share/common-licenses",
                                       "--threads=1",
                                       "--log_every=0",
                                       "--context=16",
                                       "--d_model=32",
                                       "--layers=2",
                                       "--heads=2",
                                       "--seed=1",
                                       "--rpc_timeout_s=10",
                                       "--dump_params=" + dir_ + "/params.bin"};
      trainers_.push_back(std::make_unique<Process>(
          argv, dir_ + "/trainer" + std::to_string(r)));
    }
  }
  Process& trainer(int r) { return *trainers_[r]; }

  // The last lines of every process's output, for a failure's message.
  std::string Logs() const {
    std::string out;
    auto tail = [](const std::string& text) {
      size_t at = text.size(), lines = 0;
      while (at > 0 && lines < 8) {
        at = text.rfind('\n', at - 1);
        if (at == std::string::npos) {
          at = 0;
          break;
        }
        ++lines;
      }
      return text.substr(at);
    };
    for (size_t i = 0; i < servers_.size(); ++i) {
      absl::StrAppend(&out, "\n--- server process ", i, ":",
                      tail(servers_[i]->Stderr()));
    }
    for (size_t r = 0; r < trainers_.size(); ++r) {
      absl::StrAppend(&out, "\n--- trainer ", r, ":",
                      tail(trainers_[r]->Stdout()),
                      tail(trainers_[r]->Stderr()));
    }
    return out;
  }

  // zshardctl status --json over every shard (nullopt-like empty on error).
  nlohmann::json Status() {
    Process ctl({ZSHARDCTL_BIN, "status", "--server=" + coordinator_, "--json",
                 "--timeout_s=10"},
                dir_ + "/ctl" + std::to_string(runs_++));
    ctl.Wait(absl::Seconds(20));
    auto j = nlohmann::json::parse(ctl.Stdout(), nullptr, false);
    return j.is_discarded() ? nlohmann::json::array() : j;
  }
  // The lowest group version over every shard (0 when status fails).
  uint64_t MinVersion() {
    nlohmann::json j = Status();
    if (!j.is_array() || j.size() != kShards) return 0;
    uint64_t lo = UINT64_MAX;
    for (const auto& s : j) {
      lo = std::min<uint64_t>(lo, std::stoull(s.value("minVersion", "0")));
    }
    return lo;
  }
  // Blocks until every shard's groups reach `version` (or 60 s pass).
  bool AwaitVersion(uint64_t version) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      if (MinVersion() >= version) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  void ExpectTrainersFinish() {
    for (int r = 0; r < kTrainers; ++r) {
      auto code = trainers_[r]->Wait(absl::Seconds(240));
      ASSERT_TRUE(code.has_value()) << "trainer " << r << " did not finish";
      EXPECT_EQ(*code, 0) << "trainer " << r << ":\n"
                          << trainers_[r]->Stdout() << trainers_[r]->Stderr();
    }
  }

  std::string Params() const {
    std::ifstream in(dir_ + "/params.bin", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  const std::string dir_;
  const bool checkpoints_;
  std::string config_;
  std::string coordinator_;
  std::string endpoints_[kShards];
  std::vector<std::unique_ptr<Process>> servers_;
  std::vector<std::unique_ptr<Process>> trainers_;
  int runs_ = 0;
};

// The undisturbed run's final parameters (computed once).
const std::string& Reference() {
  static const std::string* params = [] {
    Cluster c;
    c.StartTrainers();
    c.ExpectTrainersFinish();
    return new std::string(c.Params());
  }();
  return *params;
}

TEST(ShardReplaceE2ETest, KilledShardsAreReplacedAndTheRunKeepsItsBits) {
  const std::string& reference = Reference();
  ASSERT_FALSE(reference.empty());
  Cluster c;
  c.StartTrainers();
  // Shard 1 (buddy: shard 2), shard 2 (buddy: shard 0), then shard 0 (the
  // coordinator; buddy: shard 1).
  size_t index[kShards] = {0, 1, 2};
  size_t next = kShards;
  const int kill_at[kShards] = {220, 60, 140};
  for (int shard : {1, 2, 0}) {
    ASSERT_TRUE(c.AwaitVersion(kill_at[shard])) << c.Logs();
    c.server(index[shard]).Kill();
    const absl::Time started = absl::Now();
    Process& replacement = c.StartServer(shard, true);
    index[shard] = next++;
    EXPECT_TRUE(
        absl::StrContains(replacement.Stderr(), "took the state of step"))
        << replacement.Stderr();
    ASSERT_TRUE(c.AwaitVersion(kill_at[shard] + 20)) << c.Logs();
    std::printf("shard %d: replaced and trained on within %.1f s\n", shard,
                absl::ToDoubleSeconds(absl::Now() - started));
  }
  c.ExpectTrainersFinish();
  EXPECT_EQ(c.MinVersion(), static_cast<uint64_t>(kSteps));
  EXPECT_TRUE(c.Params() == reference)
      << "the parameters differ from the undisturbed run's";
  for (int r = 0; r < kTrainers; ++r) {
    EXPECT_TRUE(absl::StrContains(c.trainer(r).Stdout(),
                                  "the cluster rolled back to step"))
        << c.trainer(r).Stdout();
    EXPECT_TRUE(
        absl::StrContains(c.trainer(r).Stdout(), "the coordinator moved to"))
        << c.trainer(r).Stdout();
  }
  nlohmann::json status = c.Status();
  ASSERT_TRUE(status.is_array() && !status.empty());
  int rolled_back = 0;
  for (const auto& e : status[0]["membershipEvents"]) {
    rolled_back += e.value("kind", "") == "ROLLED_BACK";
  }
  EXPECT_EQ(rolled_back, 3 * kTrainers);
}

// Shard 1, then shard 0 (the coordinator, whose stopped process keeps its
// port: the replacement serves elsewhere and the others find it there).
TEST(ShardReplaceE2ETest, AStoppedShardIsReplacedThenFencedWhenItContinues) {
  const std::string& reference = Reference();
  Cluster c;
  c.StartTrainers();
  for (int shard : {1, 0}) {
    const uint64_t at = shard == 1 ? 100 : 180;
    ASSERT_TRUE(c.AwaitVersion(at)) << c.Logs();
    c.server(shard).Signal(SIGSTOP);
    c.StartServer(shard, true);
    ASSERT_TRUE(c.AwaitVersion(at + 30)) << c.Logs();
    c.server(shard).Signal(SIGCONT);
    auto code = c.server(shard).Wait(absl::Seconds(20));
    ASSERT_TRUE(code.has_value())
        << "the stopped shard " << shard << " went on serving";
    EXPECT_EQ(*code, 1);
    EXPECT_TRUE(absl::StrContains(c.server(shard).Stderr(), "was replaced"))
        << c.server(shard).Stderr();
  }
  c.ExpectTrainersFinish();
  EXPECT_EQ(c.MinVersion(), static_cast<uint64_t>(kSteps));
  EXPECT_TRUE(c.Params() == reference)
      << "the parameters differ from the undisturbed run's";
}

// A shard and its buddy die together: no memory holds the first one's
// snapshot, so the cluster goes back to the last disk checkpoint. Shard 1's
// replacement restores it from disk and every live shard rolls back to it;
// shard 2's replacement (whose buddy, shard 0, lives) joins that rollback
// from the same checkpoint. The run ends with the undisturbed run's bits.
TEST(ShardReplaceE2ETest, AShardAndItsBuddyGoneGoBackToTheDiskCheckpoint) {
  const std::string& reference = Reference();
  Cluster c(/*checkpoints=*/true);
  c.StartTrainers();
  ASSERT_TRUE(c.AwaitVersion(130)) << c.Logs();
  c.server(1).Kill();
  c.server(2).Kill();
  Process& one = c.StartServer(1, true);
  EXPECT_TRUE(absl::StrContains(one.Stderr(), "from the disk checkpoint"))
      << one.Stderr();
  Process& two = c.StartServer(2, true);
  EXPECT_TRUE(absl::StrContains(two.Stderr(), "from the disk checkpoint"))
      << two.Stderr();
  ASSERT_TRUE(c.AwaitVersion(200)) << c.Logs();
  c.ExpectTrainersFinish();
  EXPECT_EQ(c.MinVersion(), static_cast<uint64_t>(kSteps));
  EXPECT_TRUE(c.Params() == reference)
      << "the parameters differ from the undisturbed run's";
  // The last checkpoint before the kill: 120 or, when the trainers ran on
  // past 160 before the kill took effect, 160.
  std::smatch m;
  const std::string log = c.server(0).Stderr();
  ASSERT_TRUE(std::regex_search(
      log, m, std::regex("every shard rolled back to the checkpoint at step ([0-9]+)")))
      << log;
  const int step = std::stoi(m[1].str());
  EXPECT_TRUE(step >= 120 && step % 40 == 0) << log;
}

TEST(ShardReplaceE2ETest, BadReplaceFlagsAreRefused) {
  const std::string dir = MakeTempDir();
  struct Case {
    std::vector<std::string> flags;
    const char* says;
  };
  const std::string off = dir + "/off.json";
  std::ofstream(off)
      << R"({"zshard_fault_tolerance": {"snapshot_interval_steps": 0}})";
  for (const Case& k : std::vector<Case>{
           {{"--shard_id=1", "--replace=2"}, "names another shard"},
           {{"--shard_id=0", "--replace=0"}, "needs --peer"},
           {{"--shard_id=1", "--peer=127.0.0.1:1"}, "only with --replace=0"},
           {{"--shard_id=1", "--replace=1", "--config=" + off},
            "snapshot_interval_steps is 0"},
           {{"--shard_id=0", "--replace=auto"},
            "--replace=auto on shard 0 needs --peer"},
           {{"--shard_id=1", "--replace=auto", "--config=" + off},
            "snapshot_interval_steps is 0"},
           {{"--shard_id=1", "--replace=sometimes"}, "--replace"}}) {
    std::vector<std::string> argv = {ZSHARD_SERVER_BIN, "--num_shards=3",
                                     "--coordinator=127.0.0.1:1"};
    argv.insert(argv.end(), k.flags.begin(), k.flags.end());
    Process p(argv, dir + "/bad");
    auto code = p.Wait(absl::Seconds(20));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2) << p.Stderr();
    EXPECT_TRUE(absl::StrContains(p.Stderr(), k.says)) << p.Stderr();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zshard
