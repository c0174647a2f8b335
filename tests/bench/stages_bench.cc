// ZeRO stages 0-3 with real processes: 4 zshard-server + 2 zshard-train on
// 127.0.0.1, for the reference model and a wide one (>= 50M parameters).
// Per stage: each trainer's peak resident bytes (measured, by kind, and as
// ZeRO's formulas predict), the step time (median after the first step) and
// the bytes fetched and pushed per step. The last line is exactly
//   RATIOS stage3_resident_vs_stage0=X stage2_resident_vs_stage0=X stage3_step_vs_stage0=X
// (the wide model, rank 0). "publish ms" is the servers' publish latency:
// from the last contribution of a group's step landing on a shard to the
// first lease of the version it produced, the median of the shards'
// medians (each server prints its own when it stops).
//
// Usage: stages_bench SERVER_BIN TRAIN_BIN [--steps=N] [--quick]
// (--quick: the reference model only, 2 steps: a smoke run).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"

namespace {

using zshard::testing::Process;

struct Model {
  std::string name;
  int d_model, layers, heads, context, micro_batch;
};

struct Result {
  nlohmann::json stats;
  double publish_ms = 0;
  bool ok = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Stops the servers with SIGTERM and reads the publish latency each printed;
// the median of their medians in ms (0 when none printed one).
double StopServersAndReadLatency(std::vector<std::unique_ptr<Process>>& servers) {
  std::vector<double> medians;
  for (auto& p : servers) p->Signal(SIGTERM);
  for (auto& p : servers) {
    p->Wait(absl::Seconds(20));
    const std::string err = p->Stderr();
    const std::string key = "publish latency median ";
    const size_t at = err.rfind(key);
    if (at != std::string::npos) medians.push_back(std::atof(err.c_str() + at + key.size()) / 1e3);
  }
  return Median(medians);
}

std::string Config(int stage, int micro_batch) {
  return "{\"train_batch_size\": " + std::to_string(2 * micro_batch) +
         ", \"train_micro_batch_size_per_gpu\": " + std::to_string(micro_batch) +
         ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}"
         ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         ", \"reduce_bucket_size\": 5e6, \"stage3_prefetch_bucket_size\": 5e6"
         ", \"stage3_param_persistence_threshold\": 1e5}}";
}

Result RunStage(const std::string& server_bin, const std::string& train_bin,
                const Model& m, int stage, int steps) {
  Result res;
  std::string tmpl = (std::filesystem::temp_directory_path() / "zsstage.XXXXXX").string();
  const std::string dir = mkdtemp(tmpl.data());
  const std::string config = dir + "/ds_config.json";
  std::ofstream(config) << Config(stage, m.micro_batch);
  std::vector<std::unique_ptr<Process>> procs;
  std::string coordinator;
  for (int s = 0; s < 4; ++s) {
    const std::string port_file = dir + "/port" + std::to_string(s);
    std::vector<std::string> argv = {server_bin, "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file,
                                     "--shard_id=" + std::to_string(s), "--num_shards=4",
                                     "--trainers=2", "--config=" + config};
    if (s > 0) argv.push_back("--coordinator=" + coordinator);
    procs.push_back(std::make_unique<Process>(argv, dir + "/server" + std::to_string(s)));
    const int port = zshard::testing::WaitForPortFile(port_file, *procs.back(),
                                                      absl::Seconds(30));
    if (port == 0) {
      std::fprintf(stderr, "stages_bench: server %d did not start\n", s);
      return res;
    }
    if (s == 0) coordinator = "127.0.0.1:" + std::to_string(port);
  }
  std::vector<std::unique_ptr<Process>> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            train_bin, "--coordinator=" + coordinator, "--rank=" + std::to_string(r),
            "--config=" + config, "--steps=" + std::to_string(steps),
            "--d_model=" + std::to_string(m.d_model), "--layers=" + std::to_string(m.layers),
            "--heads=" + std::to_string(m.heads), "--context=" + std::to_string(m.context),
            "--log_every=0", "--rpc_timeout_s=300",
            "--stats_json=" + dir + "/stats" + std::to_string(r) + ".json"},
        dir + "/trainer" + std::to_string(r)));
  }
  bool ok = true;
  for (auto& t : trainers) {
    auto code = t->Wait(absl::Seconds(1200));
    if (!code || *code != 0) {
      std::fprintf(stderr, "stages_bench: a trainer failed:\n%s\n", t->Stderr().c_str());
      ok = false;
    }
  }
  if (ok) {
    std::ifstream in(dir + "/stats0.json");
    res.stats = nlohmann::json::parse(in);
    res.ok = true;
  }
  trainers.clear();
  res.publish_ms = StopServersAndReadLatency(procs);
  procs.clear();
  std::filesystem::remove_all(dir);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: stages_bench SERVER_BIN TRAIN_BIN [--steps=N] [--quick]\n");
    return 2;
  }
  const std::string server_bin = argv[1], train_bin = argv[2];
  int steps = 4;
  bool quick = false;
  for (int i = 3; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) steps = std::max(2, std::atoi(argv[i] + 8));
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  std::vector<Model> models = {{"reference", 160, 4, 4, 64, 8}};
  if (quick) {
    steps = 2;
  } else {
    models.push_back({"wide", 1024, 4, 8, 64, 2});
  }
  std::printf("%-10s %5s %9s %12s %12s %12s %12s %12s %12s %10s %12s %10s\n", "model",
              "stage", "params", "params MB", "grads MB", "optim MB", "buffers MB", "total MB",
              "predicted MB", "step s", "MB/step", "publish ms");
  double resident[2][4] = {}, step_s[2][4] = {};
  for (size_t mi = 0; mi < models.size(); ++mi) {
    for (int stage = 0; stage <= 3; ++stage) {
      Result r = RunStage(server_bin, train_bin, models[mi], stage, steps);
      if (!r.ok) return 1;
      const auto& s = r.stats;
      const double n = static_cast<double>(s["model_param_bytes"].get<uint64_t>()) / 4;
      const double params = s["peak_resident_param_bytes"].get<double>();
      const double grads = s["peak_resident_grad_bytes"].get<double>();
      const double optim = s["resident_optimizer_bytes"].get<double>();
      const double buffers = s["peak_resident_buffer_bytes"].get<double>();
      const double total = params + grads + optim + buffers;
      // ZeRO's per-trainer formulas with fp32 everywhere (K = 8 bytes of
      // AdamW moments per parameter), our window and bucket terms.
      const double bucket = 5e6 * 4, window = 5e6 * 4;
      const double group = 12.0 * models[mi].d_model * models[mi].d_model * 4;
      double predicted = 0;
      switch (stage) {
        case 0: predicted = 4 * n + 4 * n + 8 * n + 4 * n; break;  // + fetched gradient
        case 1: predicted = 4 * n + 4 * n; break;
        case 2: predicted = 4 * n + 2 * (bucket + group); break;
        case 3:
          predicted = window + group + s["persistent_param_bytes"].get<double>() + 2 * group;
          break;
      }
      std::vector<double> times = s["step_times"].get<std::vector<double>>();
      if (times.size() > 1) times.erase(times.begin());  // first touch, warm-up
      const double step = Median(times);
      const double mb_step = s["bytes_per_step"].get<double>() / 1e6;
      resident[mi][stage] = total;
      step_s[mi][stage] = step;
      std::printf(
          "%-10s %5d %9.0f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %10.3f %12.2f %10.3f\n",
          models[mi].name.c_str(), stage, n, params / 1e6, grads / 1e6, optim / 1e6,
          buffers / 1e6, total / 1e6, predicted / 1e6, step, mb_step, r.publish_ms);
      std::fflush(stdout);
    }
  }
  const size_t w = models.size() - 1;
  std::printf("figures for the ratios: model %s, rank 0, %d steps\n", models[w].name.c_str(),
              steps);
  std::printf("RATIOS stage3_resident_vs_stage0=%.3f stage2_resident_vs_stage0=%.3f "
              "stage3_step_vs_stage0=%.3f\n",
              resident[w][3] / resident[w][0], resident[w][2] / resident[w][0],
              step_s[w][3] / step_s[w][0]);
  return 0;
}
