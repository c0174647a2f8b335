// End to end with real processes: 4 zshard-server + 2 zshard-train on
// 127.0.0.1 train a small GPT for 20 steps. The final parameters must equal
// an in-process reference that computes the same per-trainer gradients with
// the same runner, sums them in rank order and applies the same AdamW; the
// loss must fall; each trainer's resident parameters must stay under its
// prefetch window plus one group plus the persistent groups; and a second
// run, with activation checkpointing, must give the same bits.
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/examples/char_dataset.h"
#include "client/examples/gpt_model.h"
#include "client/torch/torch_group_runner.h"
#include "common/config/adamw_step.h"
#include "common/config/loss_scaler.h"
#include "common/config/training_config.h"
#include "common/model/model_spec.h"
#include "common/model/partition_map.h"
#include "gtest/gtest.h"
#include "tests/integration/memory_access.h"
#include "tests/integration/process.h"
#include "tests/integration/reference_state.h"
#include "tests/integration/test_certificates.h"
#include "zshard/kernels/adamw.h"
#include "zshard/kernels/cast.h"
#include "zshard/kernels/cpu_kernels.h"

namespace zshard {
namespace {

using testing::Bf16Access;
using testing::MemoryAccess;
using testing::Process;

constexpr int kShards = 4;
constexpr int kTrainers = 2;
constexpr int kSteps = 20;
constexpr int kMicroBatch = 4;
constexpr int kContext = 16;
constexpr uint64_t kPersistence = 5000;
constexpr uint64_t kBucketElements = 15000;
const char* kData = "/usr/share/common-licenses";

std::string Config() {
  return R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                              "eps": 1e-8, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000}})";
}

GptConfig ModelConfig(int vocab) {
  GptConfig c;
  c.vocab = vocab;
  c.context = kContext;
  c.d_model = 32;
  c.layers = 4;
  c.heads = 2;
  c.seed = 1;
  return c;
}

std::vector<std::string> ModelFlags() {
  return {"--context=16", "--d_model=32", "--layers=4", "--heads=2",
          "--seed=1"};
}

// --stats_json's times per step of the training loop's thread: its CPU is
// part of the process's, and its CPU plus its time waiting for a CPU (where
// the kernel keeps it) fits in the step (a little slack for clocks read one
// after the other).
void ExpectLoopCpuWithinProcessCpu(const nlohmann::json& stats) {
  const nlohmann::json& all = stats["step_cpu_times"];
  const nlohmann::json& loop = stats["step_main_cpu_times"];
  const nlohmann::json& queued = stats["step_main_runqueue_times"];
  const nlohmann::json& wall = stats["step_times"];
  ASSERT_EQ(loop.size(), wall.size());
  ASSERT_EQ(loop.size(), all.size());
  ASSERT_TRUE(queued.empty() || queued.size() == loop.size());
  for (size_t i = 0; i < loop.size(); ++i) {
    EXPECT_GT(loop[i].get<double>(), 0) << "step " << i;
    EXPECT_LE(loop[i].get<double>(), all[i].get<double>() + 1e-3)
        << "step " << i;
    if (queued.empty()) continue;
    EXPECT_GE(queued[i].get<double>(), 0) << "step " << i;
    EXPECT_LE(loop[i].get<double>() + queued[i].get<double>(),
              wall[i].get<double>() + 5e-3)
        << "step " << i;
  }
}

struct RunResult {
  std::vector<float> params;  // all groups, flat
  nlohmann::json stats[kTrainers];
};

// Starts the cluster in `dir`, trains, and collects the results.
void RunCluster(const std::string& dir, RunResult* result,
                const std::string& config_text = Config(), int steps = kSteps,
                const std::vector<std::string>& extra_flags = {},
                const std::vector<std::string>& server_flags = {},
                const std::function<void(const std::string& coordinator)>&
                    while_serving = {}) {
  const std::string config = dir + "/ds_config.json";
  std::ofstream(config) << config_text;
  std::vector<std::unique_ptr<Process>> servers;
  std::string coordinator;
  for (int s = 0; s < kShards; ++s) {
    const std::string port_file = dir + "/port" + std::to_string(s);
    std::vector<std::string> argv = {ZSHARD_SERVER_BIN,
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file,
                                     "--shard_id=" + std::to_string(s),
                                     "--num_shards=" + std::to_string(kShards),
                                     "--trainers=" + std::to_string(kTrainers),
                                     "--config=" + config};
    if (s > 0) argv.push_back("--coordinator=" + coordinator);
    for (const auto& f : server_flags) argv.push_back(f);
    servers.push_back(
        std::make_unique<Process>(argv, dir + "/server" + std::to_string(s)));
    const int port =
        testing::WaitForPortFile(port_file, *servers.back(), absl::Seconds(30));
    ASSERT_GT(port, 0) << servers.back()->Stderr();
    if (s == 0) coordinator = "127.0.0.1:" + std::to_string(port);
  }
  std::vector<std::unique_ptr<Process>> trainers;
  for (int r = 0; r < kTrainers; ++r) {
    std::vector<std::string> argv = {
        ZSHARD_TRAIN_BIN,
        "--coordinator=" + coordinator,
        "--rank=" + std::to_string(r),
        "--config=" + config,
        "--steps=" + std::to_string(steps),
        std::string("--data=") + kData,
        "--threads=1",
        // The in-process reference computes with the kernels OpenBLAS
        // chose in this process; the trainers keep them too.
        "--blas_core=keep",
        "--log_every=0",
        "--stats_json=" + dir + "/stats" + std::to_string(r) + ".json",
        "--dump_params=" + dir + "/params.bin"};
    for (const auto& f : ModelFlags()) argv.push_back(f);
    for (const auto& f : extra_flags) argv.push_back(f);
    trainers.push_back(
        std::make_unique<Process>(argv, dir + "/trainer" + std::to_string(r)));
  }
  for (int r = 0; r < kTrainers; ++r) {
    auto code = trainers[r]->Wait(absl::Seconds(300));
    ASSERT_TRUE(code.has_value()) << "trainer " << r << " did not finish";
    ASSERT_EQ(*code, 0) << "trainer " << r << ":\n" << trainers[r]->Stderr();
    std::ifstream in(dir + "/stats" + std::to_string(r) + ".json");
    result->stats[r] = nlohmann::json::parse(in);
    // --threads=1 governs every compute pool, OpenBLAS's included.
    EXPECT_EQ(result->stats[r]["torch_threads"], 1);
    if (result->stats[r]["openblas_threads"] != -1) {
      EXPECT_EQ(result->stats[r]["openblas_threads"], 1);
    }
    ExpectLoopCpuWithinProcessCpu(result->stats[r]);
  }
  std::ifstream dump(dir + "/params.bin", std::ios::binary);
  ASSERT_TRUE(dump.good());
  dump.seekg(0, std::ios::end);
  result->params.resize(static_cast<size_t>(dump.tellg()) / sizeof(float));
  dump.seekg(0);
  dump.read(
      reinterpret_cast<char*>(result->params.data()),
      static_cast<std::streamsize>(result->params.size() * sizeof(float)));
  // The servers are still up: the caller looks at them.
  if (while_serving) while_serving(coordinator);
}

std::string MakeTempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "zse2e.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

TEST(TrainE2ETest, FourServersTwoTrainersMatchReferenceAndRepeatBitwise) {
  torch::set_num_threads(1);
  const std::string dir1 = MakeTempDir(), dir2 = MakeTempDir();
  RunResult run1, run2;
  RunCluster(dir1, &run1);
  if (HasFatalFailure()) return;

  // The in-process reference.
  auto data = CharDataset::Load({kData});
  ASSERT_TRUE(data.ok()) << data.status();
  auto model = GptModel::Create(ModelConfig(data->vocab_size()));
  ASSERT_TRUE(model.ok());
  const v1::ModelSpec& spec = (*model)->spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  ASSERT_GE(groups, 4u);
  auto config = ParseTrainingConfig(Config());
  ASSERT_TRUE(config.ok());
  auto state = testing::InitialReferenceState(**model, kTrainers);
  ASSERT_TRUE(state.ok()) << state.status();
  auto& [params, m, v, sum, grads] = *state;
  TorchGroupRunner runner(model->get());
  torch::Tensor input = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  torch::Tensor target = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kTrainers; ++r) {
      data->Batch(1, step, 0, r, kTrainers, kMicroBatch, kContext,
                  input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      MemoryAccess access(&params, &grads[r]);
      ASSERT_TRUE(runner.TrainMicroStep(access, input, target, 0).ok());
    }
    for (size_t g = 0; g < groups; ++g) {
      sum[g] = grads[0][g];
      for (int r = 1; r < kTrainers; ++r) {
        for (size_t i = 0; i < sum[g].size(); ++i) sum[g][i] += grads[r][g][i];
      }
      const kernels::AdamWStep hp = AdamWStepFor(
          config->adamw, config->scheduler, step, 1.0f / kTrainers);
      ASSERT_TRUE(kernels::ReferenceAdamW(params[g].data(), sum[g].data(),
                                          m[g].data(), v[g].data(),
                                          params[g].size(), hp)
                      .ok());
    }
  }
  std::vector<float> expected;
  for (const auto& p : params)
    expected.insert(expected.end(), p.begin(), p.end());
  ASSERT_EQ(run1.params.size(), expected.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(expected[i]));
    max_diff = std::max(max_diff, std::fabs(expected[i] - run1.params[i]));
  }
  EXPECT_LE(max_diff, 1e-6f * max_abs) << "max |param| " << max_abs;
  std::printf(
      "final parameters vs reference: max abs diff %g (max |param| %g)\n",
      max_diff, max_abs);

  // Loss falls; residency stays under window + one group + persistent groups.
  uint64_t largest = 0, persistent = 0;
  for (const auto& g : spec.groups()) {
    const uint64_t bytes = GroupNumel(g) * sizeof(float);
    largest = std::max(largest, bytes);
    if (GroupNumel(g) < kPersistence) persistent += bytes;
  }
  const uint64_t window = kBucketElements * sizeof(float);
  uint64_t model_bytes = 0;
  for (const auto& g : spec.groups())
    model_bytes += GroupNumel(g) * sizeof(float);
  for (int r = 0; r < kTrainers; ++r) {
    const auto& s = run1.stats[r];
    EXPECT_LT(s["last_loss"].get<double>(), s["first_loss"].get<double>() - 0.3)
        << "rank " << r;
    const uint64_t peak = s["peak_resident_param_bytes"].get<uint64_t>();
    EXPECT_LE(peak, window + largest + persistent) << "rank " << r;
    EXPECT_LT(peak, model_bytes) << "rank " << r;
    EXPECT_EQ(s["prefetch_window_bytes"].get<uint64_t>(), window);
    std::printf(
        "rank %d: loss %.4f -> %.4f, peak resident %llu bytes "
        "(window %llu + group %llu + persistent %llu; model %llu)\n",
        r, s["first_loss"].get<double>(), s["last_loss"].get<double>(),
        static_cast<unsigned long long>(peak),
        static_cast<unsigned long long>(window),
        static_cast<unsigned long long>(largest),
        static_cast<unsigned long long>(persistent),
        static_cast<unsigned long long>(model_bytes));
  }

  // The same run again, with activation checkpointing (recompute in
  // backward instead of kept activations): the same bits.
  std::string recompute_config = Config();
  recompute_config.insert(1, R"("activation_checkpointing": {},)");
  RunCluster(dir2, &run2, recompute_config);
  if (HasFatalFailure()) return;
  EXPECT_EQ(run1.stats[0]["activation_checkpointing"], false);
  EXPECT_EQ(run2.stats[0]["activation_checkpointing"], true);
  ASSERT_EQ(run1.params.size(), run2.params.size());
  EXPECT_EQ(std::memcmp(run1.params.data(), run2.params.data(),
                        run1.params.size() * sizeof(float)),
            0);
  std::filesystem::remove_all(dir1);
  std::filesystem::remove_all(dir2);
}

// fp16 loss scaling and clipping with real processes: rank 1 injects +Inf at
// steps 3 and 4; every shard skips both, the scale halves only after the
// second (hysteresis 2); clipping is active. The final parameters equal an
// in-process reference that follows the same rules shard slice by shard
// slice: unscale, partial norms in shard order, skip or clip, AdamW.
// TLS requiring client certificates, trainer and admin tokens, and the inline
// data plane (whose bytes then ride the TLS channels): the same bits as the
// plaintext run.
TEST(TrainE2ETest, TlsAndTokensGiveTheSameBits) {
  const std::string plain_dir = MakeTempDir(), tls_dir = MakeTempDir();
  testing::TestCertificates certs;
  ASSERT_TRUE(testing::MakeTestCertificates(tls_dir, &certs));
  RunResult plain, secured;
  RunCluster(plain_dir, &plain);
  if (HasFatalFailure()) return;
  RunCluster(
      tls_dir, &secured, Config(), kSteps,
      {"--tls_ca=" + certs.ca, "--tls_cert=" + certs.client_cert,
       "--tls_key=" + certs.client_key,
       "--auth_token_file=" + certs.trainer_token},
      {"--tls_cert=" + certs.server_cert, "--tls_key=" + certs.server_key,
       "--tls_ca=" + certs.ca, "--auth_token_file=" + certs.trainer_token,
       "--admin_token_file=" + certs.admin_token, "--transport=inline"});
  if (HasFatalFailure()) return;
  EXPECT_EQ(secured.stats[0]["transport"], "inline");
  ASSERT_EQ(plain.params.size(), secured.params.size());
  EXPECT_EQ(std::memcmp(plain.params.data(), secured.params.data(),
                        plain.params.size() * sizeof(float)),
            0);
  std::filesystem::remove_all(plain_dir);
  std::filesystem::remove_all(tls_dir);
}

// zshard-ctl on the servers the 4x2 run trained: `tensor` reads the trained
// values (the ones rank 0 dumped) back from the shards, a range of them and
// their statistics; a version no longer held and an unknown tensor are
// refused naming why; `top` redraws the status.
TEST(TrainE2ETest, ZshardctlTensorReadsTheTrainedValues) {
  const std::string dir = MakeTempDir();
  RunResult run;
  std::string out_all, out_range, old_err, bad_err, top_out;
  int old_code = -1, bad_code = -1, top_code = -1;
  auto ctl = [&](std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), ZSHARDCTL_BIN);
    Process p(args, dir + "/ctl");
    auto code = p.Wait(absl::Seconds(60));
    *out = p.Stdout() + p.Stderr();
    return code.value_or(-1);
  };
  // The first tensor of group 1 (the first block).
  auto data = CharDataset::Load({kData});
  ASSERT_TRUE(data.ok());
  auto model = GptModel::Create(ModelConfig(data->vocab_size()));
  ASSERT_TRUE(model.ok());
  const v1::ModelSpec& spec = (*model)->spec();
  const v1::TensorSpec& tensor = spec.groups(1).tensors(0);
  uint64_t offset = GroupNumel(spec.groups(0));  // in the dump
  const uint64_t numel = TensorNumel(tensor);
  RunCluster(
      dir, &run, Config(), kSteps, {}, {}, [&](const std::string& coordinator) {
        const std::string server = "--server=" + coordinator;
        EXPECT_EQ(ctl({"tensor", tensor.name(), server, "--values"}, &out_all),
                  0)
            << out_all;
        EXPECT_EQ(
            ctl({"tensor", tensor.name(), server, "--values", "--range=3:10"},
                &out_range),
            0)
            << out_range;
        old_code = ctl({"tensor", tensor.name(), server, "--step=2"}, &old_err);
        bad_code = ctl({"tensor", "no.such.tensor", server}, &bad_err);
        top_code =
            ctl({"top", server, "--iterations=2", "--interval_s=1"}, &top_out);
      });
  if (HasFatalFailure()) return;
  // The values printed (after the two header lines), in order.
  auto values = [](const std::string& text) {
    std::vector<float> v;
    std::istringstream in(text);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      if (++n <= 2) continue;
      std::istringstream words(line);
      float x;
      while (words >> x) v.push_back(x);
    }
    return v;
  };
  const std::vector<float> all = values(out_all);
  ASSERT_EQ(all.size(), numel) << out_all;
  EXPECT_EQ(std::memcmp(all.data(), run.params.data() + offset, numel * 4), 0);
  EXPECT_NE(out_all.find(absl::StrCat("version ", kSteps)), std::string::npos)
      << out_all;
  EXPECT_NE(out_all.find("nan 0 inf 0"), std::string::npos) << out_all;
  const std::vector<float> part = values(out_range);
  ASSERT_EQ(part.size(), 7u) << out_range;
  EXPECT_EQ(std::memcmp(part.data(), run.params.data() + offset + 3, 7 * 4), 0);
  EXPECT_EQ(old_code, 1);
  EXPECT_NE(old_err.find("no longer"), std::string::npos) << old_err;
  EXPECT_EQ(bad_code, 1);
  EXPECT_NE(bad_err.find("NOT_FOUND"), std::string::npos) << bad_err;
  EXPECT_EQ(top_code, 0) << top_out;
  size_t headers = 0;
  for (size_t at = top_out.find("zshardctl top:"); at != std::string::npos;
       at = top_out.find("zshardctl top:", at + 1)) {
    ++headers;
  }
  EXPECT_EQ(headers, 2u) << top_out;
  std::filesystem::remove_all(dir);
}

// A trainer whose config differs from the servers' is refused naming the
// keys that differ.
TEST(TrainE2ETest, AConfigThatDiffersIsNamedKeyByKey) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/servers.json") << Config();
  std::string other = Config();
  other.replace(other.find("\"lr\": 1e-2"), 10, "\"lr\": 1e-3");
  other.replace(other.find("\"stage\": 3"), 10, "\"stage\": 2");
  std::ofstream(dir + "/trainer.json") << other;
  Process server({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0",
                  "--port_file=" + dir + "/port", "--trainers=2",
                  "--config=" + dir + "/servers.json"},
                 dir + "/server");
  const int port =
      testing::WaitForPortFile(dir + "/port", server, absl::Seconds(30));
  ASSERT_GT(port, 0) << server.Stderr();
  std::vector<std::string> argv = {
      ZSHARD_TRAIN_BIN,
      "--coordinator=127.0.0.1:" + std::to_string(port),
      "--config=" + dir + "/trainer.json",
      "--rank=0",
      "--steps=1",
      "--log_every=0",
      std::string("--data=") + kData};
  for (const auto& f : ModelFlags()) argv.push_back(f);
  Process trainer(argv, dir + "/trainer");
  auto code = trainer.Wait(absl::Seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  const std::string err = trainer.Stderr();
  EXPECT_NE(err.find("optimizer.lr: servers 0.01, this trainer 0.001"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("zero_optimization.stage: servers 3, this trainer 2"),
            std::string::npos)
      << err;
  std::filesystem::remove_all(dir);
}

TEST(TrainE2ETest, Fp16OverflowSkipsEverywhereAndClippingMatchesReference) {
  torch::set_num_threads(1);
  const int steps = 8;
  const std::string config =
      R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                              "eps": 1e-8, "weight_decay": 0.01}},
    "fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 2,
             "loss_scale_window": 1000},
    "gradient_clipping": 0.05,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000}})";
  const std::string dir = MakeTempDir();
  RunResult run;
  RunCluster(dir, &run, config, steps,
             {"--inject_nonfinite_steps=3,4", "--inject_nonfinite_rank=1"});
  if (HasFatalFailure()) return;
  for (int r = 0; r < kTrainers; ++r) {
    EXPECT_EQ(run.stats[r]["skipped_steps"], nlohmann::json::array({3, 4}))
        << r;
    const auto& scales = run.stats[r]["loss_scales"];
    EXPECT_EQ(scales[3].get<double>(), 256.0);  // first overflow: hysteresis
    EXPECT_EQ(scales[4].get<double>(), 256.0);
    EXPECT_EQ(scales[5].get<double>(), 128.0);  // second: halved
  }

  auto parsed = ParseTrainingConfig(config);
  ASSERT_TRUE(parsed.ok());
  auto data = CharDataset::Load({kData});
  ASSERT_TRUE(data.ok());
  auto model = GptModel::Create(ModelConfig(data->vocab_size()));
  ASSERT_TRUE(model.ok());
  const v1::ModelSpec& spec = (*model)->spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  auto map = PartitionMap::Create(spec, kShards, 64, kPersistence);
  ASSERT_TRUE(map.ok());
  auto kernels = kernels::CpuKernels::Create({});
  ASSERT_TRUE(kernels.ok());
  auto state = testing::InitialReferenceState(**model, kTrainers);
  ASSERT_TRUE(state.ok()) << state.status();
  auto& [params, m, v, sum, grads] = *state;
  TorchGroupRunner runner(model->get());
  bool inject = false;
  runner.set_gradient_hook([&inject](size_t g, float* grad, size_t) {
    if (inject && g == 0) grad[0] = INFINITY;
  });
  LossScaler scaler(parsed->fp16);
  uint64_t applied = 0;
  torch::Tensor input = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  torch::Tensor target = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  for (int step = 0; step < steps; ++step) {
    const double scale = scaler.scale();
    bool overflow = false;
    for (int r = 0; r < kTrainers; ++r) {
      data->Batch(1, step, 0, r, kTrainers, kMicroBatch, kContext,
                  input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      inject = r == 1 && (step == 3 || step == 4);
      MemoryAccess access(&params, &grads[r]);
      auto res = runner.TrainMicroStep(access, input, target, 0,
                                       static_cast<float>(scale));
      ASSERT_TRUE(res.ok());
      overflow |= res->overflow;
    }
    // Per shard, group by group: sum in rank order, unscale in place,
    // partial sum of squares; then the shards' partials in shard order.
    const float unscale = static_cast<float>(1.0 / (scale * kTrainers));
    double total = 0;
    bool non_finite = false;
    for (size_t g = 0; g < groups; ++g) {
      sum[g] = grads[0][g];
      for (size_t i = 0; i < sum[g].size(); ++i) sum[g][i] += grads[1][g][i];
    }
    for (uint32_t s = 0; s < kShards; ++s) {
      double partial = 0;
      for (size_t g = 0; g < groups; ++g) {
        const Slice& sl = map->slice(g, s);
        if (sl.size() == 0) continue;
        auto r =
            (*kernels)->GradCheck(sum[g].data() + sl.begin, sl.size(), unscale);
        ASSERT_TRUE(r.ok());
        partial += r->sum_squares;
        non_finite |= r->non_finite;
      }
      total += partial;
    }
    const bool skipped = overflow || non_finite;
    EXPECT_EQ(skipped, step == 3 || step == 4) << step;
    scaler.Update(skipped);
    if (skipped) continue;
    const double norm = std::sqrt(total);
    EXPECT_NEAR(run.stats[0]["grad_norms"][step].get<double>(), norm,
                1e-12 * norm);
    float coef = 1.0f;
    const double c = parsed->gradient_clipping / (norm + 1e-6);
    if (c < 1.0) coef = static_cast<float>(c);
    EXPECT_LT(coef, 1.0f) << "clipping should be active at step " << step;
    for (size_t g = 0; g < groups; ++g) {
      const kernels::AdamWStep hp =
          AdamWStepFor(parsed->adamw, parsed->scheduler, applied, coef);
      // Slice by slice, as each shard does (AdamW is element-wise).
      for (uint32_t s = 0; s < kShards; ++s) {
        const Slice& sl = map->slice(g, s);
        ASSERT_TRUE(kernels::ReferenceAdamW(
                        params[g].data() + sl.begin, sum[g].data() + sl.begin,
                        m[g].data() + sl.begin, v[g].data() + sl.begin,
                        sl.size(), hp)
                        .ok());
      }
    }
    ++applied;
  }
  std::vector<float> expected;
  for (const auto& p : params)
    expected.insert(expected.end(), p.begin(), p.end());
  ASSERT_EQ(run.params.size(), expected.size());
  EXPECT_EQ(
      std::memcmp(run.params.data(), expected.data(), expected.size() * 4), 0);
  std::filesystem::remove_all(dir);
}

// Gradient accumulation with real processes: 2 trainers x 2 micro-steps of 2
// sequences equal one step over the combined batch of 8, reduced in
// (micro-step, rank) order: the same bits as the in-process reference.
TEST(TrainE2ETest, AccumulationMatchesReferenceBitwise) {
  torch::set_num_threads(1);
  const int steps = 6, accum = 2, micro = 2;
  const std::string config =
      R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02,
                                                 "warmup_num_steps": 4,
                                                 "warmup_type": "linear"}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000, "overlap_comm": false}})";
  const std::string dir = MakeTempDir();
  RunResult run;
  RunCluster(dir, &run, config, steps);
  if (HasFatalFailure()) return;
  auto parsed = ParseTrainingConfig(config);
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->overlap_comm);
  auto data = CharDataset::Load({kData});
  auto model = GptModel::Create(ModelConfig(data->vocab_size()));
  ASSERT_TRUE(model.ok());
  const v1::ModelSpec& spec = (*model)->spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  auto state = testing::InitialReferenceState(**model, kTrainers * accum);
  ASSERT_TRUE(state.ok()) << state.status();
  auto& [params, m, v, sum, grads] = *state;
  TorchGroupRunner runner(model->get());
  torch::Tensor input = torch::empty({micro, kContext}, torch::kInt64);
  torch::Tensor target = torch::empty({micro, kContext}, torch::kInt64);
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < kTrainers; ++r) {
      for (int a = 0; a < accum; ++a) {
        data->Batch(1, step, a, r, kTrainers, micro, kContext,
                    input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
        MemoryAccess access(&params, &grads[a * kTrainers + r]);
        ASSERT_TRUE(runner.TrainMicroStep(access, input, target, a).ok());
      }
    }
    for (size_t g = 0; g < groups; ++g) {
      sum[g] = grads[0][g];
      for (int c = 1; c < kTrainers * accum; ++c) {
        for (size_t i = 0; i < sum[g].size(); ++i) sum[g][i] += grads[c][g][i];
      }
      const kernels::AdamWStep hp = AdamWStepFor(
          parsed->adamw, parsed->scheduler, step, 1.0f / (kTrainers * accum));
      ASSERT_TRUE(kernels::ReferenceAdamW(params[g].data(), sum[g].data(),
                                          m[g].data(), v[g].data(),
                                          params[g].size(), hp)
                      .ok());
    }
  }
  std::vector<float> expected;
  for (const auto& p : params)
    expected.insert(expected.end(), p.begin(), p.end());
  ASSERT_EQ(run.params.size(), expected.size());
  EXPECT_EQ(
      std::memcmp(run.params.data(), expected.data(), expected.size() * 4), 0);
  std::filesystem::remove_all(dir);
}

// bf16 on the wire and in compute: trainers fetch the servers' bf16 copy,
// compute in bf16 and push bf16 gradients; the servers keep fp32 masters and
// write the bf16 copy in the AdamW pass. The final bf16 copy equals an
// in-process reference doing the same, bit for bit; half the bytes move.
TEST(TrainE2ETest, Bf16MatchesReferenceBitwise) {
  torch::set_num_threads(1);
  const int steps = 10;
  const std::string config =
      R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95]}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 5000,
                          "stage3_prefetch_bucket_size": 15000}})";
  const std::string dir = MakeTempDir();
  RunResult run;
  RunCluster(dir, &run, config, steps);
  if (HasFatalFailure()) return;
  auto parsed = ParseTrainingConfig(config);
  ASSERT_TRUE(parsed.ok());
  auto data = CharDataset::Load({kData});
  auto model = GptModel::Create(ModelConfig(data->vocab_size()));
  ASSERT_TRUE(model.ok());
  const v1::ModelSpec& spec = (*model)->spec();
  const size_t groups = static_cast<size_t>(spec.groups_size());
  std::vector<std::vector<float>> master(groups), m(groups), v(groups),
      sum(groups);
  std::vector<std::vector<uint16_t>> copy(groups), grads[kTrainers];
  uint64_t model_elems = 0;
  for (size_t g = 0; g < groups; ++g) {
    const size_t n = GroupNumel(spec.groups(static_cast<int>(g)));
    model_elems += n;
    master[g].resize(n);
    ASSERT_TRUE((*model)->Init(g, master[g].data()).ok());
    copy[g].resize(n);
    ASSERT_TRUE(
        kernels::ReferenceFp32ToBf16(master[g].data(), copy[g].data(), n).ok());
    m[g].assign(n, 0);
    v[g].assign(n, 0);
    sum[g].resize(n);
    for (auto& gr : grads) gr.emplace_back(n, 0);
  }
  TorchGroupRunner runner(model->get(), RunnerOptions{/*bf16=*/true});
  torch::Tensor input = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  torch::Tensor target = torch::empty({kMicroBatch, kContext}, torch::kInt64);
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < kTrainers; ++r) {
      data->Batch(1, step, 0, r, kTrainers, kMicroBatch, kContext,
                  input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      Bf16Access access(&copy, &grads[r]);
      ASSERT_TRUE(runner.TrainMicroStep(access, input, target, 0).ok());
    }
    for (size_t g = 0; g < groups; ++g) {
      for (size_t i = 0; i < sum[g].size(); ++i) {
        sum[g][i] = kernels::Bf16BitsToFp32(grads[0][g][i]);
        sum[g][i] += kernels::Bf16BitsToFp32(grads[1][g][i]);
      }
      kernels::AdamWStep hp = AdamWStepFor(parsed->adamw, parsed->scheduler,
                                           step, 1.0f / kTrainers);
      hp.half_type = kernels::HalfType::kBf16;
      ASSERT_TRUE(kernels::ReferenceAdamW(master[g].data(), sum[g].data(),
                                          m[g].data(), v[g].data(),
                                          master[g].size(), hp, copy[g].data())
                      .ok());
    }
  }
  std::vector<uint16_t> expected;
  for (const auto& c : copy)
    expected.insert(expected.end(), c.begin(), c.end());
  // The dump holds the bf16 copy: half as many floats' worth of bytes.
  ASSERT_EQ(run.params.size() * 2, expected.size());
  EXPECT_EQ(
      std::memcmp(run.params.data(), expected.data(), expected.size() * 2), 0);
  for (int r = 0; r < kTrainers; ++r) {
    const auto& s = run.stats[r];
    EXPECT_LT(s["last_loss"].get<double>(),
              s["first_loss"].get<double>() - 0.3);
    // Two fetches of every group per step (forward, backward) in bf16 at
    // most: at most 2 bytes per element each way.
    EXPECT_LE(s["bytes_fetched"].get<uint64_t>(),
              (steps + 1) * 2 * model_elems * 2);
  }
  std::filesystem::remove_all(dir);
}

// ZeRO++'s quantized transfers with real processes: 200 steps with int8 and
// with fp8 weights and gradients (default blocks of 128) end within 2% of the plain
// run's loss (the mean of the last 20 steps of both ranks), moving at most
// 0.27 of its bytes each way.
TEST(TrainE2ETest, QuantizedTransfersKeepTheLossAndMoveAQuarterOfTheBytes) {
  const int steps = 200;
  auto config = [](const std::string& quantization) {
    std::string c = Config();
    c.insert(c.rfind('}'), quantization.empty() ? "" : ", " + quantization);
    return c;
  };
  auto late_loss = [steps](const RunResult& run) {
    double sum = 0;
    int n = 0;
    for (int r = 0; r < kTrainers; ++r) {
      const auto& losses = run.stats[r]["losses"];
      EXPECT_EQ(losses.size(), static_cast<size_t>(steps));
      for (size_t i = losses.size() - std::min<size_t>(20, losses.size());
           i < losses.size(); ++i, ++n) {
        sum += losses[i].get<double>();
      }
    }
    return n > 0 ? sum / n : 0.0;
  };
  auto bytes = [](const RunResult& run, const char* key) {
    uint64_t b = 0;
    for (int r = 0; r < kTrainers; ++r) b += run.stats[r][key].get<uint64_t>();
    return static_cast<double>(b);
  };
  const std::string plain_dir = MakeTempDir();
  RunResult plain;
  RunCluster(plain_dir, &plain, config(""), steps);
  if (HasFatalFailure()) return;
  const double plain_loss = late_loss(plain);
  for (const char* format : {"int8", "fp8"}) {
    const std::string dir = MakeTempDir();
    RunResult run;
    // The zero_optimization block gains the two switches.
    std::string c = config(absl::StrCat(
        R"("zshard_quantization": {"format": ")", format, R"("})"));
    const std::string zero = R"("stage": 3,)";
    c.insert(c.find(zero) + zero.size(),
             R"( "zero_quantized_weights": true,
                 "zero_quantized_gradients": true,)");
    RunCluster(dir, &run, c, steps);
    if (HasFatalFailure()) return;
    const double loss = late_loss(run);
    const double fetched = bytes(run, "bytes_fetched") /
                           bytes(plain, "bytes_fetched");
    const double pushed =
        bytes(run, "bytes_pushed") / bytes(plain, "bytes_pushed");
    std::printf("%s: loss of the last 20 steps %.4f (plain %.4f, %+.2f%%), "
                "bytes fetched %.3f and pushed %.3f of plain\n",
                format, loss, plain_loss,
                100 * (loss - plain_loss) / plain_loss, fetched, pushed);
    EXPECT_LE(std::abs(loss - plain_loss), 0.02 * plain_loss) << format;
    EXPECT_LE(fetched, 0.27) << format;
    EXPECT_LE(pushed, 0.27) << format;
    EXPECT_GT(pushed, 0.2) << format;
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(plain_dir);
}

// --local_world: the compute floor trains alone, with no server, the same
// model and batches; its loss falls; bad combinations exit 2 naming the
// flag.
TEST(TrainE2ETest, LocalModeTrainsWithoutServers) {
  const std::string dir = MakeTempDir();
  std::vector<std::string> argv = {ZSHARD_TRAIN_BIN,
                                   "--local_world=2",
                                   "--rank=1",
                                   "--steps=20",
                                   std::string("--data=") + kData,
                                   "--micro_batch=4",
                                   "--threads=1",
                                   "--stats_json=" + dir + "/stats.json"};
  for (const auto& f : ModelFlags()) argv.push_back(f);
  Process local(argv, dir + "/local");
  auto code = local.Wait(absl::Seconds(120));
  ASSERT_TRUE(code.has_value());
  ASSERT_EQ(*code, 0) << local.Stderr();
  std::ifstream in(dir + "/stats.json");
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["mode"], "local");
  EXPECT_EQ(s["rank"], 1);
  EXPECT_EQ(s["step_times"].size(), 20u);
  ExpectLoopCpuWithinProcessCpu(s);
  EXPECT_EQ(s["torch_threads"], 1);
  EXPECT_LT(s["last_loss"].get<double>(), s["first_loss"].get<double>() - 0.3);
  // --blas_core=auto (the default): a generic core OpenBLAS fell back to
  // (it did not know this CPU's model) gave way to the widest this CPU runs.
  const std::string core = s["blas_core"];
  const std::string cpu_core = s["blas_core_cpu"];
  if (!s["blas_core_replaced"].get<std::string>().empty()) {
    EXPECT_EQ(core, cpu_core);
    EXPECT_NE(s["blas_core_replaced"], core);
  }
  if (!core.empty() && cpu_core != "Prescott" &&
      getenv("OPENBLAS_CORETYPE") == nullptr) {
    // A named core (AVX: every CPU with more than SSE runs it) is taken.
    Process named({ZSHARD_TRAIN_BIN, "--local_world=2", "--rank=0",
                   "--steps=1", "--blas_core=Sandybridge",
                   std::string("--data=") + kData, "--micro_batch=4",
                   "--stats_json=" + dir + "/named.json"},
                  dir + "/named");
    ASSERT_EQ(named.Wait(absl::Seconds(120)), 0) << named.Stderr();
    std::ifstream named_in(dir + "/named.json");
    EXPECT_EQ(nlohmann::json::parse(named_in)["blas_core"], "Sandybridge");
    // One OpenBLAS does not have is refused, naming the flag.
    Process unknown({ZSHARD_TRAIN_BIN, "--local_world=2", "--rank=0",
                     "--steps=1", "--blas_core=NoSuchCore",
                     std::string("--data=") + kData},
                    dir + "/unknown");
    EXPECT_EQ(unknown.Wait(absl::Seconds(60)), 2);
    EXPECT_NE(unknown.Stderr().find("flag --blas_core"), std::string::npos)
        << unknown.Stderr();
  }

  Process bad_rank({ZSHARD_TRAIN_BIN, "--local_world=2", "--rank=2"},
                   dir + "/bad_rank");
  EXPECT_EQ(bad_rank.Wait(absl::Seconds(30)), 2);
  EXPECT_NE(bad_rank.Stderr().find("flag --rank"), std::string::npos);
  Process both({ZSHARD_TRAIN_BIN, "--local_world=2", "--rank=0",
                "--coordinator=127.0.0.1:1"},
               dir + "/both");
  EXPECT_EQ(both.Wait(absl::Seconds(30)), 2);
  EXPECT_NE(both.Stderr().find("flag --local_world"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zshard
