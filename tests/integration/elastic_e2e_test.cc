// Elastic trainer membership with real processes (issue 16): zshard-server
// shards and zshard-train trainers on 127.0.0.1. A trainer killed with
// SIGKILL at a random point of a step is dropped after --trainer_timeout_s
// and the others go on; a new trainer takes the free rank and is admitted
// at a step boundary; a trainer stopped past the timeout is dropped and
// refused when it comes back; Joins that never become trainers hold no rank.
// Every run must end with every group on every shard at exactly --steps
// (each step applied once) and the coordinator's status must name each drop.
// The killed-trainer run's final parameters must equal an in-process
// reference that replays its membership history: the admissions, and what
// each shard recorded a dropped trainer had contributed, group by group.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/examples/char_dataset.h"
#include "client/examples/gpt_model.h"
#include "client/torch/torch_group_runner.h"
#include "common/config/adamw_step.h"
#include "common/config/training_config.h"
#include "common/model/model_spec.h"
#include "gtest/gtest.h"
#include "tests/integration/memory_access.h"
#include "tests/integration/process.h"
#include "tests/integration/reference_state.h"
#include "zshard/kernels/adamw.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

using testing::MemoryAccess;
using testing::Process;

constexpr int kMicroBatch = 2;
constexpr int kContext = 16;
const char* kConfig = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3}})";

std::string MakeTempDir() { return testing::MakeTempDir("zselastic"); }

// A cluster of shard servers and the trainers started against it.
class ElasticCluster {
 public:
  // `extra` flags go to every server.
  ElasticCluster(int shards, int trainers, double trainer_timeout_s, int steps,
                 const std::vector<std::string>& extra = {})
      : dir_(MakeTempDir()), trainers_(trainers), steps_(steps) {
    config_ = dir_ + "/ds_config.json";
    std::ofstream(config_) << kConfig;
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
      argv.insert(argv.end(), extra.begin(), extra.end());
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
    if (std::getenv("ZSHARD_KEEP_TEST_DIR")) {
      std::printf("kept %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  const std::string& coordinator() const { return coordinator_; }
  const std::string& dir() const { return dir_; }
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
                                     // As the in-process reference's.
                                     "--blas_core=keep",
                                     "--log_every=0",
                                     "--context=16",
                                     "--d_model=32",
                                     "--layers=2",
                                     "--heads=2",
                                     "--seed=1",
                                     "--dump_params=" + dir_ + "/params.bin"};
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

  // What the last rank-0 trainer dumped: every group's final values.
  std::vector<float> DumpedParams() const {
    std::ifstream dump(dir_ + "/params.bin", std::ios::binary);
    std::vector<float> out;
    if (!dump.good()) return out;
    dump.seekg(0, std::ios::end);
    out.resize(static_cast<size_t>(dump.tellg()) / sizeof(float));
    dump.seekg(0);
    dump.read(reinterpret_cast<char*>(out.data()),
              static_cast<std::streamsize>(out.size() * sizeof(float)));
    return out;
  }

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

// The membership history as the status reports it: when each process of a
// rank was admitted, and what each shard recorded it had contributed when
// it was dropped (or left).
class History {
 public:
  explicit History(const nlohmann::json& status) {
    for (const auto& e : status[0]["membershipEvents"]) {
      if (e.value("kind", "") == "ADMITTED") {
        admitted_[e.value("rank", 0u)].push_back(
            std::stoull(e.value("step", "0")));
      }
    }
    for (size_t k = 0; k < status.size(); ++k) {
      for (const auto& d :
           status[k].value("trainerDrops", nlohmann::json::array())) {
        const uint32_t rank = d.value("rank", 0u), group = d.value("group", 0u);
        drops_[{k, rank, group}].push_back(
            Drop{std::stoull(d.value("step", "0")),
                 std::stoull(d.value("landedMask", "0"))});
      }
      for (const auto& g : status[k]["groups"]) {
        slices_[{k, g.value("group", 0u)}] = {
            std::stoull(g.value("sliceBegin", "0")),
            std::stoull(g.value("sliceEnd", "0"))};
      }
    }
  }
  size_t admissions(uint32_t rank) const {
    auto it = admitted_.find(rank);
    return it == admitted_.end() ? 0 : it->second.size();
  }
  // Whether `rank`'s gradient of step `t` is in shard `k`'s sum of `group`.
  bool Contributed(uint32_t rank, uint64_t t, size_t k, uint32_t group) const {
    auto a = admitted_.find(rank);
    if (a == admitted_.end()) return false;
    // The process of the rank admitted last at or before t.
    int j = -1;
    for (size_t i = 0; i < a->second.size(); ++i) {
      if (a->second[i] <= t) j = static_cast<int>(i);
    }
    if (j < 0) return false;
    auto d = drops_.find({k, rank, group});
    if (d == drops_.end() || static_cast<size_t>(j) >= d->second.size()) {
      return true;  // never dropped
    }
    const Drop& drop = d->second[static_cast<size_t>(j)];
    return t < drop.step || (t == drop.step && (drop.mask & 1));
  }
  std::pair<uint64_t, uint64_t> Slice(size_t k, uint32_t group) const {
    auto it = slices_.find({k, group});
    return it == slices_.end() ? std::pair<uint64_t, uint64_t>{0, 0}
                               : it->second;
  }
  size_t drop_records() const {
    size_t n = 0;
    for (const auto& [key, list] : drops_) n += list.size();
    return n;
  }

 private:
  struct Drop {
    uint64_t step;
    uint64_t mask;
  };
  std::map<uint32_t, std::vector<uint64_t>> admitted_;
  std::map<std::tuple<size_t, uint32_t, uint32_t>, std::vector<Drop>> drops_;
  std::map<std::pair<size_t, uint32_t>, std::pair<uint64_t, uint64_t>> slices_;
};

// Replays `steps` steps of 2 ranks as the history says (each shard's slice
// of each group sums, in rank order, the gradients it got, and AdamW
// averages over their number) and compares with `got`.
void ExpectReplayMatches(const History& h, size_t shards, int steps,
                         const std::vector<float>& got) {
  torch::set_num_threads(1);
  auto data = CharDataset::Load({"/usr/share/common-licenses"});
  ASSERT_TRUE(data.ok()) << data.status();
  GptConfig mc;
  mc.vocab = data->vocab_size();
  mc.context = kContext;
  mc.d_model = 32;
  mc.layers = 2;
  mc.heads = 2;
  mc.seed = 1;
  auto model = GptModel::Create(mc);
  ASSERT_TRUE(model.ok()) << model.status();
  const v1::ModelSpec& spec = (*model)->spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  auto config = ParseTrainingConfig(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  auto state = testing::InitialReferenceState(**model, 2);
  ASSERT_TRUE(state.ok()) << state.status();
  auto& [params, m, v, sum, grads] = *state;
  TorchGroupRunner runner(model->get());
  torch::Tensor input = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  torch::Tensor target = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  for (int t = 0; t < steps; ++t) {
    const uint64_t step = static_cast<uint64_t>(t);
    for (uint32_t r = 0; r < 2; ++r) {
      bool any = false;
      for (size_t k = 0; k < shards; ++k) {
        for (uint32_t g = 0; g < groups; ++g) {
          any |= h.Contributed(r, step, k, g);
        }
      }
      if (!any) continue;
      data->Batch(1, step, 0, r, 2, kMicroBatch, kContext,
                  input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      MemoryAccess access(&params, &grads[r]);
      ASSERT_TRUE(runner.TrainMicroStep(access, input, target, 0).ok());
    }
    for (uint32_t g = 0; g < groups; ++g) {
      for (size_t k = 0; k < shards; ++k) {
        const auto [b, e] = h.Slice(k, g);
        if (b == e) continue;
        uint32_t count = 0;
        for (uint32_t r = 0; r < 2; ++r) {
          if (!h.Contributed(r, step, k, g)) continue;
          for (uint64_t i = b; i < e; ++i) {
            sum[g][i] =
                count == 0 ? grads[r][g][i] : sum[g][i] + grads[r][g][i];
          }
          ++count;
        }
        ASSERT_GT(count, 0u) << "step " << t << " group " << g << " shard " << k
                             << " had no contribution";
        const kernels::AdamWStep hp =
            AdamWStepFor(config->adamw, config->scheduler, step,
                         1.0f / static_cast<float>(count));
        ASSERT_TRUE(kernels::ReferenceAdamW(params[g].data() + b,
                                            sum[g].data() + b, m[g].data() + b,
                                            v[g].data() + b, e - b, hp)
                        .ok());
      }
    }
  }
  std::vector<float> expected;
  for (const auto& p : params) {
    expected.insert(expected.end(), p.begin(), p.end());
  }
  ASSERT_EQ(got.size(), expected.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(expected[i]));
    max_diff = std::max(max_diff, std::fabs(expected[i] - got[i]));
  }
  EXPECT_LE(max_diff, 1e-6f * max_abs) << "max |param| " << max_abs;
  std::printf("replayed membership: max abs diff %g (max |param| %g)\n",
              max_diff, max_abs);
}

TEST(ElasticE2ETest,
     KilledTrainersAreDroppedReplacedAndEveryStepIsAppliedOnce) {
  // Enough steps for ten kill cycles (each ~3 s: the 1.5 s timeout, a new
  // process, a pause) on a fast host: 4000 ran out after 5-6 kills on one.
  constexpr int kSteps = 10000;
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

  // The final parameters equal a replay of the same membership history.
  const nlohmann::json status = c.Status();
  std::ofstream(c.dir() + "/status.json") << status.dump(1);
  const History history(status);
  EXPECT_EQ(history.admissions(0) + history.admissions(1),
            static_cast<size_t>(2 + kills));
  EXPECT_GT(history.drop_records(), 0u);
  ExpectReplayMatches(history, status.size(), kSteps, c.DumpedParams());
}

TEST(ElasticE2ETest, AStoppedTrainerIsDroppedThenRefusedWhenItComesBack) {
  constexpr int kSteps = 4000;
  ElasticCluster c(/*shards=*/2, /*trainers=*/2, /*timeout_s=*/1.5, kSteps);
  ASSERT_FALSE(c.coordinator().empty());
  // The stopped trainer holds rank 0 (first in the fold order): the other's
  // contributions land behind its passed-over position.
  const size_t t1 = c.StartTrainer();
  const absl::Time admitted_by = absl::Now() + absl::Seconds(60);
  while (c.Events("ADMITTED").empty() && absl::Now() < admitted_by) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const size_t t0 = c.StartTrainer();
  absl::SleepFor(absl::Seconds(4));
  c.trainer(t1).Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  // Past the timeout it is dropped and the other trainer goes on alone.
  while (c.Events("DROPPED").empty() &&
         absl::Now() < stopped + absl::Seconds(20)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(c.Events("DROPPED").size(), 1u) << c.StatusText();
  const absl::Duration to_drop = absl::Now() - stopped;
  const uint64_t at_drop = c.Versions().second;
  uint64_t now = at_drop;
  while (now < at_drop + 20 && absl::Now() < stopped + absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(100));
    now = c.Versions().second;
  }
  EXPECT_LT(at_drop, static_cast<uint64_t>(kSteps)) << "the run ended early";
  EXPECT_GE(now, at_drop + 20) << "training stopped with the stopped trainer\n"
                               << c.StatusText();
  std::printf(
      "stopped trainer dropped %.1f s after SIGSTOP; 20 more steps "
      "%.1f s after SIGSTOP\n",
      absl::ToDoubleSeconds(to_drop),
      absl::ToDoubleSeconds(absl::Now() - stopped));
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

// --trainers=2 --min_trainers=2 --max_trainers=3 (torchrun's
// --nnodes=MIN:MAX): a third trainer joins a running cluster; with two of
// three killed, the one left is below the quorum and steps wait for it to
// be met; a new trainer meets it and the run ends at every step.
TEST(ElasticE2ETest, TrainersJoinUpToTheMaximumAndStepsWaitBelowTheMinimum) {
  constexpr int kSteps = 2000;
  ElasticCluster c(2, 2, 1.5, kSteps, {"--min_trainers=2", "--max_trainers=3"});
  c.StartTrainer();
  c.StartTrainer();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (c.Versions().first < 50 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  c.StartTrainer();  // rank 2: beyond --trainers, within --max_trainers
  while (c.Events("ADMITTED").size() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(c.Events("ADMITTED").size(), 3u) << c.StatusText();
  for (size_t i : {0, 1}) {
    c.trainer(i).Kill();
    c.MarkKilled(i);
  }
  while (c.Events("DROPPED").size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(c.Events("DROPPED").size(), 2u) << c.StatusText();
  // One trainer holds a rank: below --min_trainers, no step completes.
  const uint64_t stalled = c.Versions().second;
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(c.Versions().second, stalled) << c.StatusText();
  EXPECT_LT(stalled, static_cast<uint64_t>(kSteps));
  c.StartTrainer();  // the quorum again
  c.ExpectTrainersFinish(absl::Seconds(240));
  const auto [lo, hi] = c.Versions();
  EXPECT_EQ(lo, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(hi, static_cast<uint64_t>(kSteps));
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
