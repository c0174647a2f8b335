// Checkpoints with real processes (zshard-server, zshard-train, zshardctl)
// on 127.0.0.1: a run that checkpoints every 10 steps, then restores of its
// base-only and base+delta chains onto 3, 4 and 6 shards that must reach the
// same final bits as the uninterrupted run; kill -9 while the writers are
// mid-file; a corrupt data file; export to safetensors read back by us and
// by the reference Python reader.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"
#include "zshard/kernels/cast.h"

namespace zshard {
namespace {

using testing::Process;
namespace fs = std::filesystem;

constexpr int kTrainers = 2;
const char* kData = "/usr/share/common-licenses";

// fp32 and no clipping: every element's update is independent of the shard
// count, so restores onto any number of shards must give the same bits.
std::string Config(bool checkpoints, bool fixed_batch = true) {
  return absl::StrCat(
      fixed_batch ? R"({"train_batch_size": 8, )" : "{",
      R"("train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                              "eps": 1e-8, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000})",
      checkpoints
          ? R"(, "zshard_checkpoint": {"interval_steps": 10, "full_every": 3,
                       "keep_bases": 2, "chunk_kib": 16})"
          : "",
      "}");
}

std::string MakeTempDir() { return testing::MakeTempDir("zsckpt"); }

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) { return fs::exists(path); }

// One cluster of servers in `dir`; processes die with the object.
class Cluster {
 public:
  // Checkpoints go to `ckpt` (default: DIR/ckpt).
  Cluster(std::string dir, std::string tag, std::string ckpt = "")
      : dir_(std::move(dir)), tag_(std::move(tag)), ckpt_(ckpt.empty() ? dir_ + "/ckpt" : ckpt) {}

  // Starts `shards` servers for `trainers` trainers; `extra` flags go to
  // every one of them. With trainers other than kTrainers the config leaves
  // train_batch_size to the trainer count.
  void Start(int shards, bool checkpoint_config,
             const std::vector<std::string>& extra, int trainers = kTrainers) {
    trainers_count_ = trainers;
    const std::string config = dir_ + "/config-" + tag_ + ".json";
    std::ofstream(config) << Config(checkpoint_config, trainers == kTrainers);
    config_ = config;
    for (int s = 0; s < shards; ++s) {
      const std::string port_file = absl::StrCat(dir_, "/port-", tag_, "-", s);
      std::vector<std::string> argv = {ZSHARD_SERVER_BIN,
                                       "--listen=127.0.0.1:0",
                                       "--port_file=" + port_file,
                                       absl::StrCat("--shard_id=", s),
                                       absl::StrCat("--num_shards=", shards),
                                       absl::StrCat("--trainers=", trainers),
                                       "--config=" + config,
                                       "--checkpoint_dir=" + ckpt_,
                                       "--wait_timeout_s=60"};
      if (s > 0) argv.push_back("--coordinator=" + coordinator_);
      for (const auto& f : extra) argv.push_back(f);
      servers_.push_back(std::make_unique<Process>(argv, absl::StrCat(dir_, "/server-", tag_, "-", s)));
      const int port = testing::WaitForPortFile(port_file, *servers_.back(), absl::Seconds(60));
      ASSERT_GT(port, 0) << "server " << s << ":\n" << servers_.back()->Stderr();
      if (s == 0) coordinator_ = absl::StrCat("127.0.0.1:", port);
    }
  }

  // Starts the trainers (training until `steps`), dumping the parameters.
  void StartTrainers(int steps) {
    for (int r = 0; r < trainers_count_; ++r) {
      std::vector<std::string> argv = {
          ZSHARD_TRAIN_BIN, "--coordinator=" + coordinator_, absl::StrCat("--rank=", r),
          "--config=" + config_, absl::StrCat("--steps=", steps), std::string("--data=") + kData,
          "--threads=1", "--log_every=0", "--context=16", "--d_model=32", "--layers=4",
          "--heads=2", "--seed=1", "--rpc_timeout_s=30", "--dump_params=" + params_path()};
      trainers_.push_back(std::make_unique<Process>(argv, absl::StrCat(dir_, "/trainer-", tag_, "-", r)));
    }
  }

  // Waits for the trainers; each must exit 0.
  void FinishTrainers() {
    for (int r = 0; r < trainers_count_; ++r) {
      auto code = trainers_[r]->Wait(absl::Seconds(300));
      ASSERT_TRUE(code.has_value()) << "trainer " << r << " did not finish";
      ASSERT_EQ(*code, 0) << "trainer " << r << ":\n" << trainers_[r]->Stderr();
    }
  }

  void Train(int steps) {
    StartTrainers(steps);
    FinishTrainers();
  }

  void KillAll() {
    for (auto& p : servers_) p->Kill();
    for (auto& p : trainers_) p->Kill();
  }

  std::string params_path() const { return dir_ + "/params-" + tag_ + ".bin"; }
  std::vector<float> params() const { return ReadFloats(params_path()); }
  const std::string& coordinator() const { return coordinator_; }
  Process& server(int s) { return *servers_[s]; }
  Process& trainer(int r) { return *trainers_[r]; }

 private:
  std::string dir_, tag_, ckpt_, config_, coordinator_;
  int trainers_count_ = kTrainers;
  std::vector<std::unique_ptr<Process>> servers_, trainers_;
};

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_FALSE(want.empty()) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << got.size() << " parameters differ";
}

// A run of `steps` steps on 4 shards, checkpointing every 10 (bases at 10 and
// 40, deltas between), in `dir`/ckpt.
std::vector<float> ReferenceRun(const std::string& dir, int steps) {
  Cluster c(dir, "ref");
  c.Start(4, true, {});
  if (::testing::Test::HasFatalFailure()) return {};
  c.Train(steps);
  if (::testing::Test::HasFatalFailure()) return {};
  // The last checkpoint's write may still be finishing after the trainers
  // stop: wait for its global manifest.
  const std::string last = absl::StrCat(dir, "/ckpt/step-000000", steps, "/MANIFEST.json");
  for (int i = 0; i < 500 && !Exists(last); ++i) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(Exists(last)) << c.server(0).Stderr();
  return c.params();
}

TEST(CheckpointE2ETest, ResumeIsBitIdenticalForBaseAndDeltaChainsOnThreeFourAndSixShards) {
  const std::string dir = MakeTempDir();
  const std::vector<float> final_params = ReferenceRun(dir, 40);
  if (HasFatalFailure()) return;
  for (int step : {10, 20, 30, 40}) {
    EXPECT_TRUE(Exists(absl::StrCat(dir, "/ckpt/step-000000", step, "/MANIFEST.json"))) << step;
  }
  // Manifests say which are bases: 10 and 40 (full_every 3).
  for (int step : {10, 20, 30, 40}) {
    auto m = nlohmann::json::parse(
        ReadText(absl::StrCat(dir, "/ckpt/step-000000", step, "/MANIFEST.json")));
    EXPECT_EQ(m["base_step"].get<int>(), step == 40 ? 40 : 10) << step;
    EXPECT_EQ(m["trainer_states"].size(), 2u) << step;
  }
  struct Case {
    int shards;
    int step;
  } cases[] = {{4, 10}, {4, 20}, {3, 30}, {6, 20}};
  for (const Case& k : cases) {
    SCOPED_TRACE(absl::StrCat(k.shards, " shards from step ", k.step));
    // A restore sets newer checkpoints aside (another timeline): each case
    // restores from its own copy of the reference run's checkpoints.
    const std::string ckpt = absl::StrCat(dir, "/ckpt-", k.shards, "-", k.step);
    fs::copy(dir + "/ckpt", ckpt, fs::copy_options::recursive);
    Cluster c(dir, absl::StrCat("r", k.shards, "-", k.step), ckpt);
    c.Start(k.shards, false, {absl::StrCat("--restore=", k.step)});
    if (HasFatalFailure()) return;
    EXPECT_NE(c.server(0).Stderr().find(absl::StrCat("restored step ", k.step)), std::string::npos);
    c.Train(40);
    if (HasFatalFailure()) return;
    EXPECT_NE(c.trainer(0).Stdout().find(absl::StrCat("resuming at step ", k.step)),
              std::string::npos)
        << c.trainer(0).Stdout();
    ExpectSameBits(c.params(), final_params, "resumed run at step 40");
    // Newer checkpoints were moved out of the way of `latest`.
    auto later = fs::directory_iterator(ckpt);
    for (const auto& e : later) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step-", 0) == 0) {
        EXPECT_LE(std::stoi(name.substr(5)), k.step) << name;
      }
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointE2ETest, KillNineMidWriteRestoresThePreviousCompleteCheckpoint) {
  const std::string dir = MakeTempDir();
  {
    Cluster c(dir, "slow");
    // Slow writers: each chunk takes 40 ms, so the write of step 20 is long.
    c.Start(4, true, {"--testing_checkpoint_chunk_delay_ms=40"});
    if (HasFatalFailure()) return;
    c.StartTrainers(30);
    // Each shard writes on its own: shard 2 may start step 20 while another
    // still finishes step 10. Kill once step 10 is complete and shard 2 is
    // mid-write of step 20.
    const std::string tmp = dir + "/ckpt/step-00000020/shard-00002.data.tmp";
    const std::string previous = dir + "/ckpt/step-00000010/MANIFEST.json";
    bool seen = false;
    for (int i = 0; i < 6000 && !seen; ++i) {
      seen = Exists(tmp) && Exists(previous);
      if (!seen) absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_TRUE(seen) << c.server(2).Stderr();
    c.KillAll();  // kill -9, every server mid-write of step 20
    EXPECT_FALSE(Exists(dir + "/ckpt/step-00000020/MANIFEST.json"));
    EXPECT_TRUE(Exists(dir + "/ckpt/step-00000010/MANIFEST.json"));
  }
  Cluster resumed(dir, "resumed");
  resumed.Start(4, true, {"--restore=latest"});
  if (HasFatalFailure()) return;
  EXPECT_NE(resumed.server(0).Stderr().find("restored step 10"), std::string::npos)
      << resumed.server(0).Stderr();
  EXPECT_NE(resumed.server(3).Stderr().find("restored step 10"), std::string::npos)
      << resumed.server(3).Stderr();
  resumed.Train(20);
  if (HasFatalFailure()) return;

  const std::string ref_dir = MakeTempDir();
  Cluster ref(ref_dir, "plain");
  ref.Start(4, false, {});
  if (HasFatalFailure()) return;
  ref.Train(20);
  if (HasFatalFailure()) return;
  ExpectSameBits(resumed.params(), ref.params(), "resumed after kill -9 vs uninterrupted");
  fs::remove_all(dir);
  fs::remove_all(ref_dir);
}

// SIGTERM (scancel, a pod deleted) or SIGHUP right after the trainers finish,
// while every shard is still writing the last checkpoint: each keeps serving
// until it is complete, exits 0, and the cluster restores from it.
TEST(CheckpointE2ETest, SigtermWaitsForTheCheckpointBeingWritten) {
  const std::string dir = MakeTempDir();
  {
    Cluster c(dir, "term");
    // 40 ms a chunk: the write of step 10 takes seconds.
    c.Start(3, true, {"--testing_checkpoint_chunk_delay_ms=40"});
    if (HasFatalFailure()) return;
    c.Train(11);
    if (HasFatalFailure()) return;
    EXPECT_FALSE(Exists(dir + "/ckpt/step-00000010/MANIFEST.json"))
        << "the write was not slow enough to test the stop";
    // SIGHUP (a hung-up terminal) stops a server the same way.
    for (int s = 0; s < 3; ++s) c.server(s).Signal(s == 2 ? SIGHUP : SIGTERM);
    for (int s = 0; s < 3; ++s) {
      auto code = c.server(s).Wait(absl::Seconds(30));
      ASSERT_TRUE(code.has_value()) << "shard " << s << " did not stop";
      EXPECT_EQ(*code, 0) << c.server(s).Stderr();
    }
    EXPECT_NE(c.server(0).Stderr().find("checkpoint at step 10 complete"),
              std::string::npos)
        << c.server(0).Stderr();
  }
  Cluster resumed(dir, "resumed");
  resumed.Start(3, true, {"--restore=latest"});
  if (HasFatalFailure()) return;
  EXPECT_NE(resumed.server(0).Stderr().find("restored step 10"), std::string::npos)
      << resumed.server(0).Stderr();
  fs::remove_all(dir);
}

TEST(CheckpointE2ETest, CorruptDataFileIsNamedAndLatestFallsBack) {
  const std::string dir = MakeTempDir();
  const std::vector<float> final_params = ReferenceRun(dir, 30);
  if (HasFatalFailure()) return;
  const std::string bad = dir + "/ckpt/step-00000030/shard-00001.data";
  const auto size = fs::file_size(bad);
  ASSERT_GT(size, 0u);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x10);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(&ch, 1);
  }
  // Asked for exactly that step: refused, naming the file.
  {
    Process p({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0", "--num_shards=1", "--trainers=2",
               "--checkpoint_dir=" + dir + "/ckpt", "--restore=30"},
              dir + "/explicit");
    auto code = p.Wait(absl::Seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0);
    EXPECT_NE(p.Stderr().find("step-00000030/shard-00001.data"), std::string::npos) << p.Stderr();
  }
  // "latest": step 30 is refused, step 20 restored, and training from there
  // reaches the same bits at step 30.
  Cluster c(dir, "fallback");
  c.Start(4, false, {"--restore=latest"});
  if (HasFatalFailure()) return;
  const std::string err = c.server(0).Stderr();
  EXPECT_NE(err.find("refused step 30"), std::string::npos) << err;
  EXPECT_NE(err.find("shard-00001.data"), std::string::npos) << err;
  EXPECT_NE(err.find("restored step 20"), std::string::npos) << err;
  c.Train(30);
  if (HasFatalFailure()) return;
  ExpectSameBits(c.params(), final_params, "restored from 20, trained to 30");
  fs::remove_all(dir);
}

// zshardctl's output and exit code.
std::pair<int, std::string> Ctl(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ZSHARDCTL_BIN};
  for (const auto& a : args) argv.push_back(a);
  Process p(argv, dir + "/ctl");
  auto code = p.Wait(absl::Seconds(120));
  return {code.value_or(-1), p.Stdout() + p.Stderr()};
}

TEST(CheckpointE2ETest, OnDemandCheckpointThenRestoreOntoTwoShards) {
  const std::string dir = MakeTempDir();
  {
    Cluster c(dir, "a");
    c.Start(4, false, {});  // no interval: on demand only
    if (HasFatalFailure()) return;
    c.Train(7);
    if (HasFatalFailure()) return;
    auto [code, out] = Ctl(dir, {"checkpoint", "--server=" + c.coordinator(), "--timeout_s=60"});
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("checkpoint at step 7 complete (base"), std::string::npos) << out;
    const std::string data = dir + "/ckpt/step-00000007/shard-00003.data";
    ASSERT_TRUE(Exists(data));
    const auto size = fs::file_size(data);
    // Asked again between the same steps: the same checkpoint, not rewritten.
    std::tie(code, out) = Ctl(dir, {"checkpoint", "--server=" + c.coordinator(), "--timeout_s=60"});
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("checkpoint at step 7 complete"), std::string::npos) << out;
    EXPECT_EQ(fs::file_size(data), size);
    std::tie(code, out) = Ctl(dir, {"status", "--server=" + c.coordinator()});
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("last complete at step 7"), std::string::npos) << out;
    c.KillAll();
  }
  // A fresh cluster refuses a directory that holds another run's checkpoints.
  {
    Process p({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0", "--checkpoint_dir=" + dir + "/ckpt"},
              dir + "/fresh");
    auto code = p.Wait(absl::Seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0);
    EXPECT_NE(p.Stderr().find("already holds checkpoints (newest: step 7)"), std::string::npos)
        << p.Stderr();
  }
  Cluster resumed(dir, "b");
  // auto: the directory holds a checkpoint, so the newest is restored.
  resumed.Start(2, false, {"--restore=auto"});
  if (HasFatalFailure()) return;
  resumed.Train(12);
  if (HasFatalFailure()) return;
  EXPECT_NE(resumed.trainer(1).Stdout().find("resuming at step 7"), std::string::npos);

  const std::string ref_dir = MakeTempDir();
  Cluster ref(ref_dir, "plain");
  ref.Start(3, false, {});
  if (HasFatalFailure()) return;
  ref.Train(12);
  if (HasFatalFailure()) return;
  ExpectSameBits(resumed.params(), ref.params(), "4 shards -> checkpoint -> 2 shards vs 3 shards");
  fs::remove_all(dir);
  fs::remove_all(ref_dir);
}

// A checkpoint taken by 2 trainers restores with 1 and with 3: every rank
// resumes at the checkpoint's step (ranks it has no state for from rank 0's),
// the batches of a step stay disjoint (they are drawn per step and rank),
// and the run goes on to its last step.
TEST(CheckpointE2ETest, ACheckpointRestoresWithFewerOrMoreTrainers) {
  const std::string dir = MakeTempDir();
  {
    Cluster c(dir, "two");
    c.Start(2, false, {}, /*trainers=*/2);
    if (HasFatalFailure()) return;
    c.Train(5);
    if (HasFatalFailure()) return;
    auto [code, out] = Ctl(
        dir, {"checkpoint", "--server=" + c.coordinator(), "--timeout_s=60"});
    ASSERT_EQ(code, 0) << out;
    c.KillAll();
  }
  for (int trainers : {1, 3}) {
    const std::string copy = absl::StrCat(dir, "/copy", trainers);
    fs::copy(dir + "/ckpt", copy, fs::copy_options::recursive);
    Cluster resumed(dir, absl::StrCat("resumed", trainers), copy);
    resumed.Start(2, false, {"--restore=latest"}, trainers);
    if (HasFatalFailure()) return;
    EXPECT_NE(resumed.server(0).Stderr().find(
                  "taken with 2 trainers; resuming with --trainers=" +
                  std::to_string(trainers)),
              std::string::npos)
        << resumed.server(0).Stderr();
    resumed.Train(9);
    if (HasFatalFailure()) return;
    for (int r = 0; r < trainers; ++r) {
      EXPECT_NE(resumed.trainer(r).Stdout().find(
                    "resuming at step 5 from a checkpoint"),
                std::string::npos)
          << "rank " << r << ": " << resumed.trainer(r).Stdout();
    }
    auto [code, out] =
        Ctl(dir, {"status", "--server=" + resumed.coordinator(), "--json"});
    ASSERT_EQ(code, 0) << out;
    const nlohmann::json status = nlohmann::json::parse(out);
    for (const auto& shard : status) {
      EXPECT_EQ(shard.value("minVersion", ""), "9") << out;
      EXPECT_EQ(shard.value("maxVersion", ""), "9") << out;
    }
    // The membership history went with the checkpoint: the two trainers
    // admitted at step 0 before it, then this run's.
    int admitted_at_0 = 0, admitted = 0;
    for (const auto& e : status[0]["membershipEvents"]) {
      if (e.value("kind", "") != "ADMITTED") continue;
      ++admitted;
      admitted_at_0 += e.value("step", "") == "0";
    }
    EXPECT_EQ(admitted_at_0, 2) << out;
    EXPECT_EQ(admitted, 2 + trainers) << out;
    EXPECT_EQ(resumed.params().size(),
              ReadFloats(dir + "/params-two.bin").size());
    resumed.KillAll();
  }
  fs::remove_all(dir);
}

// A checkpoint directory that stops being writable mid-run: zshardctl
// checkpoint reports the shards' error at once instead of waiting out its
// deadline, and training goes on.
TEST(CheckpointE2ETest, AnUnwritableDirectoryFailsTheCheckpointNamingTheShard) {
  const std::string dir = MakeTempDir();
  Cluster c(dir, "ro");
  c.Start(2, false, {});
  if (HasFatalFailure()) return;
  c.Train(3);
  if (HasFatalFailure()) return;
  const std::string ckpt = dir + "/ckpt";
  ::chmod(ckpt.c_str(), 0555);
  if (FILE* probe = std::fopen((ckpt + "/probe").c_str(), "w")) {
    // Root writes through any mode bits: put a regular file where the
    // directory was, which no process can create a step directory in.
    std::fclose(probe);
    fs::remove_all(ckpt);
    std::ofstream(ckpt) << "not a directory";
  }
  const absl::Time start = absl::Now();
  auto [code, out] =
      Ctl(dir, {"checkpoint", "--server=" + c.coordinator(), "--timeout_s=60"});
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(code, 1) << out;
  EXPECT_LT(took, absl::Seconds(20)) << out;
  EXPECT_NE(out.find("checkpoint at step 3 failed on shard "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(ckpt), std::string::npos) << out;
  std::tie(code, out) = Ctl(dir, {"status", "--server=" + c.coordinator()});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("last error: "), std::string::npos) << out;
  c.Train(5);  // the run goes on
  c.KillAll();
  fs::remove_all(dir);
}

// The safetensors file: header length, JSON header, data in spec order.
struct Safetensors {
  nlohmann::json header;
  std::string data;
};

Safetensors ReadSafetensors(const std::string& path) {
  const std::string bytes = ReadText(path);
  Safetensors s;
  if (bytes.size() < 8) return s;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (8 + n > bytes.size()) return s;
  s.header = nlohmann::json::parse(bytes.substr(8, n));
  s.data = bytes.substr(8 + n);
  return s;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    params_ = ReferenceRun(dir_, 20);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs zshardctl export; returns its exit code.
  int Export(const std::string& out, const std::string& dtype) {
    Process p({ZSHARDCTL_BIN, "export", "--checkpoint_dir=" + dir_ + "/ckpt", "--out=" + out,
               "--format=safetensors", "--dtype=" + dtype},
              out);
    auto code = p.Wait(absl::Seconds(60));
    EXPECT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0) << p.Stderr();
    return code.value_or(-1);
  }

  std::string dir_;
  std::vector<float> params_;
};

// Export writes a new file and renames it over the target: a device node or
// a symbolic link there is refused and left as it was.
TEST_F(ExportTest, RefusesTargetsThatAreNotRegularFiles) {
  if (HasFatalFailure()) return;
  const std::string real = dir_ + "/real.txt",
                    link = dir_ + "/link.safetensors";
  {
    std::ofstream f(real);
    f << "keep me";
  }
  fs::create_symlink(real, link);
  for (const std::string& out : {std::string("/dev/full"), link, dir_}) {
    Process p({ZSHARDCTL_BIN, "export", "--checkpoint_dir=" + dir_ + "/ckpt",
               "--out=" + out},
              dir_ + "/refused");
    auto code = p.Wait(absl::Seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0) << out;
    EXPECT_NE(p.Stderr().find("is not a regular file"), std::string::npos)
        << p.Stderr();
  }
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(ReadText(real), "keep me");
}

TEST_F(ExportTest, Fp32AndBf16FilesHoldEveryTensorInOrder) {
  if (HasFatalFailure()) return;
  const std::string f32 = dir_ + "/model.safetensors", bf16 = dir_ + "/model-bf16.safetensors";
  ASSERT_EQ(Export(f32, "fp32"), 0);
  ASSERT_EQ(Export(bf16, "bf16"), 0);
  Safetensors a = ReadSafetensors(f32);
  ASSERT_TRUE(a.header.is_object());
  ASSERT_EQ(a.data.size(), params_.size() * 4);
  EXPECT_EQ(0, std::memcmp(a.data.data(), params_.data(), a.data.size()));
  EXPECT_EQ(a.header["__metadata__"]["zshard_step"], "20");
  // Offsets tile the data with no hole, in order; shapes match sizes.
  uint64_t next = 0, tensors = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = a.header.begin(); it != a.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    EXPECT_EQ((*it)["dtype"], "F32");
    uint64_t numel = 1;
    for (const auto& d : (*it)["shape"]) numel *= d.get<uint64_t>();
    const auto off = (*it)["data_offsets"];
    EXPECT_EQ(off[1].get<uint64_t>() - off[0].get<uint64_t>(), numel * 4) << it.key();
    ranges.emplace_back(off[0].get<uint64_t>(), off[1].get<uint64_t>());
    ++tensors;
  }
  std::sort(ranges.begin(), ranges.end());
  for (const auto& [lo, hi] : ranges) {
    EXPECT_EQ(lo, next);
    next = hi;
  }
  EXPECT_EQ(next, a.data.size());
  EXPECT_GE(tensors, 10u);
  const std::string raw = ReadText(f32);
  EXPECT_EQ((8 + (raw.size() - a.data.size() - 8)) % 8, 0u) << "data starts 8-byte aligned";

  Safetensors b = ReadSafetensors(bf16);
  ASSERT_EQ(b.data.size(), params_.size() * 2);
  std::vector<uint16_t> want(params_.size());
  ASSERT_TRUE(kernels::ReferenceFp32ToBf16(params_.data(), want.data(), want.size()).ok());
  EXPECT_EQ(0, std::memcmp(b.data.data(), want.data(), b.data.size()));
}

// The Python interpreter with the reference safetensors package
// (tests/run.sh installs it into a virtual environment), or "".
std::string ReferencePython() {
  const char* env = std::getenv("ZSHARD_TEST_PYTHON");
  std::vector<std::string> candidates;
  if (env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  for (const std::string& py : candidates) {
    if (std::system((py + " -c 'import safetensors.numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  }
  return "";
}

TEST_F(ExportTest, LoadsInTheReferenceSafetensorsReader) {
  if (HasFatalFailure()) return;
  const std::string py = ReferencePython();
  if (py.empty()) {
    GTEST_SKIP() << "no Python with the safetensors package (tests/run.sh installs one; "
                    "set ZSHARD_TEST_PYTHON)";
  }
  const std::string f32 = dir_ + "/model.safetensors";
  ASSERT_EQ(Export(f32, "fp32"), 0);
  Safetensors a = ReadSafetensors(f32);
  std::vector<std::pair<uint64_t, std::string>> names;
  for (auto it = a.header.begin(); it != a.header.end(); ++it) {
    if (it.key() != "__metadata__") names.emplace_back((*it)["data_offsets"][0].get<uint64_t>(), it.key());
  }
  std::sort(names.begin(), names.end());
  const std::string script = dir_ + "/read.py", out = dir_ + "/read.bin";
  {
    std::ofstream s(script);
    s << "import sys\nfrom safetensors.numpy import load_file\n"
         "t = load_file(sys.argv[1])\n"
         "with open(sys.argv[2], 'wb') as f:\n"
         "    for name in sys.argv[3:]:\n"
         "        assert t[name].dtype.str == '<f4', t[name].dtype\n"
         "        f.write(t[name].tobytes())\n"
         "print(len(t))\n";
  }
  std::string cmd = py + " " + script + " " + f32 + " " + out;
  for (const auto& n : names) cmd += " '" + n.second + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ExpectSameBits(ReadFloats(out), params_, "safetensors.numpy.load_file");
}

}  // namespace
}  // namespace zshard
