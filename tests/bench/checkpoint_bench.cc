// Checkpoint costs (issue 6), two parts:
//
// 1. The reference model (d=160, 4 layers) with real processes: 4
//    zshard-server + 2 zshard-train, a checkpoint every 5 steps (a base every
//    4). Per checkpoint: bytes, the training stall (the copy at the step
//    boundary, slowest shard) and the background write; the median step
//    time; then a restore of the newest checkpoint by 4 fresh servers.
// 2. A synthetic model of >= 1 GiB of state (fp32 master, m, v) over 4
//    in-process shard stores (real ShardStore, AdamW, writer, coordinator):
//    after --warmup optimizer steps a full base, then a delta one step later, for
//    (a) dense training, (b) fine-tuning with half the groups frozen,
//    (c) an embedding table where 5% of the rows get gradients (no weight
//    decay, as for sparse embeddings); then a restore (read back) of the
//    newest checkpoint.
//
// The last line is exactly
//   RATIOS stall_vs_step=X frozen_delta_vs_full=X sparse_delta_vs_full=X dense_delta_vs_full=X
// (the reference model for the stall, the synthetic one for the deltas).
//
// Usage: checkpoint_bench SERVER_BIN TRAIN_BIN [--quick] [--synthetic_mib=N] [--warmup=N]
// (--quick: a few steps and a 24 MiB synthetic state: the ctest smoke run;
// --warmup: optimizer steps before the base, default 10).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "server/checkpoint/checkpoint_coordinator.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "server/shard_store.h"
#include "tests/integration/process.h"

namespace {

using zshard::testing::Process;
namespace fs = std::filesystem;

std::string TempDir(const char* name) {
  std::string tmpl = (fs::temp_directory_path() / (std::string(name) + ".XXXXXX")).string();
  return mkdtemp(tmpl.data());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---------------------------------------------------------------- part 1

struct WriteLog {
  bool base = false;
  uint64_t bytes = 0;
  double stall = 0, write = 0;
};

// Parses the writers' "checkpoint step N (base|delta): B bytes, ..., stall S
// s, write W s" lines: per step, bytes summed and the slowest shard's times.
std::map<uint64_t, WriteLog> ParseWrites(const std::vector<std::string>& logs) {
  static const std::regex line(
      R"(checkpoint step (\d+) \((base|delta)\): (\d+) bytes, \d+ of \d+ chunks, stall ([0-9.]+) s, write ([0-9.]+) s)");
  std::map<uint64_t, WriteLog> out;
  for (const std::string& log : logs) {
    for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
      WriteLog& w = out[std::stoull((*it)[1])];
      w.base = (*it)[2] == "base";
      w.bytes += std::stoull((*it)[3]);
      w.stall = std::max(w.stall, std::stod((*it)[4]));
      w.write = std::max(w.write, std::stod((*it)[5]));
    }
  }
  return out;
}

struct Part1 {
  bool ok = false;
  double step_s = 0, stall_s = 0, restore_s = 0;
};

Part1 ReferenceModel(const std::string& server_bin, const std::string& train_bin, int steps) {
  Part1 res;
  const std::string dir = TempDir("zsckbench");
  const std::string config = dir + "/ds_config.json";
  std::ofstream(config)
      << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e6,
                            "stage3_param_persistence_threshold": 1e5},
      "zshard_checkpoint": {"interval_steps": 5, "full_every": 4, "keep_bases": 2}})";
  auto start_servers = [&](const std::string& tag, const std::vector<std::string>& extra,
                           std::vector<std::unique_ptr<Process>>* procs) {
    std::string coordinator;
    for (int s = 0; s < 4; ++s) {
      const std::string port_file = dir + "/port" + tag + std::to_string(s);
      std::vector<std::string> argv = {server_bin, "--listen=127.0.0.1:0",
                                       "--port_file=" + port_file,
                                       "--shard_id=" + std::to_string(s), "--num_shards=4",
                                       "--trainers=2", "--config=" + config,
                                       "--checkpoint_dir=" + dir + "/ckpt"};
      if (s > 0) argv.push_back("--coordinator=" + coordinator);
      for (const auto& e : extra) argv.push_back(e);
      procs->push_back(std::make_unique<Process>(argv, dir + "/server" + tag + std::to_string(s)));
      const int port = zshard::testing::WaitForPortFile(port_file, *procs->back(),
                                                        absl::Seconds(120));
      if (port == 0) {
        std::fprintf(stderr, "checkpoint_bench: server %d did not start:\n%s\n", s,
                     procs->back()->Stderr().c_str());
        return std::string();
      }
      if (s == 0) coordinator = "127.0.0.1:" + std::to_string(port);
    }
    return coordinator;
  };
  std::vector<std::unique_ptr<Process>> servers;
  const std::string coordinator = start_servers("a", {}, &servers);
  if (coordinator.empty()) return res;
  std::vector<std::unique_ptr<Process>> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(std::make_unique<Process>(
        std::vector<std::string>{train_bin, "--coordinator=" + coordinator,
                                 "--rank=" + std::to_string(r), "--config=" + config,
                                 "--steps=" + std::to_string(steps), "--d_model=160",
                                 "--layers=4", "--heads=4", "--context=64", "--log_every=0",
                                 "--stats_json=" + dir + "/stats" + std::to_string(r) + ".json"},
        dir + "/trainer" + std::to_string(r)));
  }
  for (auto& t : trainers) {
    auto code = t->Wait(absl::Seconds(1200));
    if (!code || *code != 0) {
      std::fprintf(stderr, "checkpoint_bench: a trainer failed:\n%s\n", t->Stderr().c_str());
      return res;
    }
  }
  // The last write finishes in the background.
  const std::string last = dir + "/ckpt/step-" + std::string(8 - std::to_string(steps).size(), '0') +
                           std::to_string(steps) + "/MANIFEST.json";
  for (int i = 0; i < 3000 && !fs::exists(last); ++i) absl::SleepFor(absl::Milliseconds(10));
  std::vector<std::string> logs;
  for (auto& s : servers) logs.push_back(s->Stderr());
  servers.clear();
  std::ifstream in(dir + "/stats0.json");
  nlohmann::json stats = nlohmann::json::parse(in);
  std::vector<double> times = stats["step_times"].get<std::vector<double>>();
  if (times.size() > 1) times.erase(times.begin());
  res.step_s = Median(times);
  const auto writes = ParseWrites(logs);
  std::printf("part 1: reference model (1.28M parameters, 15.3 MB of state), 4 shards, "
              "2 trainers, %d steps\n",
              steps);
  std::printf("%-6s %-6s %12s %12s %12s\n", "step", "kind", "bytes", "stall s", "write s");
  std::vector<double> stalls;
  for (const auto& [step, w] : writes) {
    std::printf("%-6llu %-6s %12llu %12.6f %12.3f\n", static_cast<unsigned long long>(step),
                w.base ? "base" : "delta", static_cast<unsigned long long>(w.bytes), w.stall,
                w.write);
    stalls.push_back(w.stall);
  }
  res.stall_s = Median(stalls);
  // Restore of the newest checkpoint by 4 fresh servers.
  std::vector<std::unique_ptr<Process>> restored;
  if (start_servers("b", {"--restore=latest"}, &restored).empty()) return res;
  static const std::regex took(R"(restored step \d+ .* in ([0-9.e-]+) s\))");
  std::smatch m;
  for (auto& s : restored) {
    const std::string err = s->Stderr();
    if (std::regex_search(err, m, took)) res.restore_s = std::max(res.restore_s, std::stod(m[1]));
  }
  std::printf("median step %.4f s; median stall per checkpoint %.6f s (slowest shard); "
              "restore %.4f s (slowest shard)\n",
              res.step_s, res.stall_s, res.restore_s);
  restored.clear();
  fs::remove_all(dir);
  res.ok = !writes.empty();
  return res;
}

// ---------------------------------------------------------------- part 2

struct Scenario {
  std::string name;
  zshard::v1::ModelSpec spec;
  double weight_decay = 0.01;
  // Fraction of embedding rows (of group 0, rows of `row` elements) that
  // get gradients; 1: every element.
  double row_fraction = 1;
  uint64_t row = 0;
};

zshard::v1::ModelSpec SyntheticSpec(uint64_t elements, int groups, int frozen_groups) {
  zshard::v1::ModelSpec spec;
  spec.set_name("synthetic");
  for (int g = 0; g < groups; ++g) {
    auto* gs = spec.add_groups();
    gs->set_name("layer" + std::to_string(g));
    auto* t = gs->add_tensors();
    t->set_name("layer" + std::to_string(g) + ".weight");
    t->add_shape(static_cast<int64_t>(elements / groups / 1024));
    t->add_shape(1024);
    t->set_dtype(zshard::v1::FLOAT32);
    t->set_trainable(g >= frozen_groups);
  }
  return spec;
}

// Cheap deterministic values: xorshift to floats in about [-scale, scale].
struct Rng {
  uint64_t s;
  float Next(float scale) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return scale * (static_cast<float>(static_cast<int32_t>(s >> 32)) * (1.0f / 2147483648.0f));
  }
};

struct Part2Row {
  std::string scenario;
  uint64_t full_bytes = 0, delta_bytes = 0;
  double full_s = 0, delta_s = 0, stall_s = 0, restore_s = 0;
  uint64_t state_bytes = 0;
};

Part2Row RunScenario(const Scenario& sc, uint64_t warmup) {
  Part2Row row;
  row.scenario = sc.name;
  const std::string dir = TempDir("zsckpt_syn");
  constexpr uint32_t kShards = 4;
  zshard::CheckpointCoordinatorOptions co;
  co.root = dir;
  co.keep_bases = 1;
  co.cluster.num_shards = kShards;
  co.cluster.world_size = 1;
  co.cluster.accumulation_steps = 1;
  co.cluster.alignment = 64;
  zshard::CheckpointCoordinator coordinator(co);
  std::vector<std::unique_ptr<zshard::ShardStore>> stores;
  auto map = *zshard::PartitionMap::Create(sc.spec, kShards, 64, 0);
  for (uint32_t s = 0; s < kShards; ++s) {
    zshard::ShardStoreOptions o;
    o.shard_id = s;
    o.num_shards = kShards;
    o.persistence_threshold = 0;
    o.adamw.lr = 1e-4;
    o.adamw.weight_decay = sc.weight_decay;
    o.checkpoint.root = dir;
    o.checkpoint.full_every = 1000;
    o.checkpoint_interval = 0;  // scheduled below, after the warm-up
    auto store = zshard::ShardStore::Create(o);
    if (!store.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(store.status().message()).c_str());
      return row;
    }
    zshard::ShardStore* raw = store->get();
    const zshard::v1::ModelSpec spec = sc.spec;
    raw->SetCheckpointCommit([&coordinator, s, spec](const zshard::ShardManifest& m, uint32_t crc) {
      zshard::ShardCommit c;
      c.step = m.step;
      c.shard_id = s;
      c.base_step = m.base_step;
      c.manifest_crc = crc;
      c.bytes_written = m.bytes_written;
      return coordinator.Commit(c, spec);
    });
    Rng rng{0x9e3779b97f4a7c15ull + s};
    std::vector<zshard::ValueChunk> init;
    for (size_t g = 0; g < map.num_groups(); ++g) {
      const zshard::Slice& sl = map.slice(g, s);
      if (sl.size() == 0) continue;
      zshard::ValueChunk c;
      c.group = static_cast<uint32_t>(g);
      c.offset = sl.begin;
      c.values.resize(sl.size());
      for (float& x : c.values) x = rng.Next(0.05f);
      init.push_back(std::move(c));
    }
    if (auto r = raw->Register(sc.spec, init); !r.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(r.status().message()).c_str());
      return row;
    }
    stores.push_back(std::move(*store));
  }
  row.state_bytes = map.total_numel() * 12;
  // Rows of group 0 that get gradients (fixed, like the tokens a fine-tuning
  // set uses).
  std::vector<char> hot;
  if (sc.row_fraction < 1) {
    Rng pick{42};
    hot.resize(map.group_numel(0) / sc.row);
    for (char& h : hot) h = (pick.Next(0.5f) + 0.5f) < sc.row_fraction;
  }
  Rng grad_rng{7};
  std::vector<float> grad;
  // Step: every shard's slice of every group gets a gradient; each store's
  // update engine applies it and stages the checkpoint of the new version.
  auto step = [&](uint64_t version, double* stall) {
    absl::Duration staged;
    for (uint32_t s = 0; s < kShards; ++s) {
      for (size_t g = 0; g < map.num_groups(); ++g) {
        const zshard::Slice& sl = map.slice(g, s);
        if (sl.size() == 0) continue;
        grad.resize(sl.size());
        for (uint64_t i = 0; i < sl.size(); ++i) {
          const float v = grad_rng.Next(1e-3f);
          grad[i] = (g == 0 && !hot.empty() && !hot[(sl.begin + i) / sc.row]) ? 0.0f : v;
        }
        (void)staged;
        absl::Status st = stores[s]->AcceptGradient(static_cast<uint32_t>(g), version, 0, 0,
                                                    sl.begin, grad.data(), grad.size());
        if (!st.ok()) std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(st.message()).c_str());
      }
    }
    for (auto& s : stores) {
      (void)s->Drain(absl::Now() + absl::Seconds(600));
      (void)s->checkpoint_writer()->WaitIdle(absl::Now() + absl::Seconds(600));
      *stall = std::max(*stall, s->checkpoint_writer()->last_stats().stall_seconds);
    }
  };
  auto bytes_and_time = [&](uint64_t version, uint64_t* bytes, double* secs) {
    auto g = coordinator.WaitComplete(version, absl::Now() + absl::Seconds(600));
    *bytes = g.ok() ? g->bytes_written : 0;
    double w = 0;
    for (auto& s : stores) w = std::max(w, s->checkpoint_writer()->last_stats().write_seconds);
    *secs = w;
  };
  // Warm the optimizer up first (a chain in a long run starts from moments
  // that have seen many steps, not from the first one).
  double stall = 0;
  for (uint64_t v = 0; v < warmup; ++v) step(v, &stall);
  for (auto& s : stores) {
    for (uint64_t v : {warmup + 1, warmup + 2}) {
      absl::Status st = s->ScheduleCheckpoint(v);
      if (!st.ok()) std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(st.message()).c_str());
    }
  }
  stall = 0;
  step(warmup, &stall);  // the base
  bytes_and_time(warmup + 1, &row.full_bytes, &row.full_s);
  double delta_stall = 0;
  step(warmup + 1, &delta_stall);  // a delta after one more step
  bytes_and_time(warmup + 2, &row.delta_bytes, &row.delta_s);
  row.stall_s = delta_stall;
  stores.clear();
  // Restore: read every array of every group back (as 4 new shards would).
  const absl::Time start = absl::Now();
  auto reader = zshard::CheckpointReader::Open(dir, warmup + 2);
  if (reader.ok()) {
    std::vector<float> buf;
    for (size_t g = 0; g < map.num_groups(); ++g) {
      for (uint32_t s = 0; s < kShards; ++s) {
        const zshard::Slice& sl = map.slice(g, s);
        buf.resize(sl.size());
        for (int a = 0; a < 3; ++a) {
          (void)(*reader)->Read(static_cast<uint32_t>(g), static_cast<zshard::StateArray>(a),
                                sl.begin, sl.end, buf.data());
        }
      }
    }
  }
  row.restore_s = absl::ToDoubleSeconds(absl::Now() - start);
  fs::remove_all(dir);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: checkpoint_bench SERVER_BIN TRAIN_BIN [--quick] [--synthetic_mib=N]\n");
    return 2;
  }
  bool quick = false;
  uint64_t mib = 1100, warmup = 10;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strncmp(argv[i], "--synthetic_mib=", 16) == 0) mib = std::stoull(argv[i] + 16);
    if (std::strncmp(argv[i], "--warmup=", 9) == 0) warmup = std::stoull(argv[i] + 9);
  }
  if (quick) {
    mib = 24;
    warmup = 2;
  }
  Part1 p1 = ReferenceModel(argv[1], argv[2], quick ? 10 : 30);
  if (!p1.ok) return 1;

  const uint64_t elements = (mib << 20) / 12 / (8 * 1024) * (8 * 1024);  // 8 groups of rows of 1024
  std::vector<Scenario> scenarios;
  scenarios.push_back({"dense", SyntheticSpec(elements, 8, 0), 0.01, 1, 0});
  scenarios.push_back({"frozen half", SyntheticSpec(elements, 8, 4), 0.01, 1, 0});
  {
    Scenario s{"sparse embedding", {}, 0.0, 0.05, 256};
    s.spec.set_name("embedding");
    auto* t = s.spec.add_groups();
    t->set_name("embedding");
    auto* e = t->add_tensors();
    e->set_name("embedding.weight");
    e->add_shape(static_cast<int64_t>(elements / 256));
    e->add_shape(256);
    e->set_dtype(zshard::v1::FLOAT32);
    e->set_trainable(true);
    scenarios.push_back(s);
  }
  std::printf("part 2: synthetic state over 4 shards (fp32 master + m + v), 1 MiB chunks, "
              "AdamW lr 1e-4, i.i.d. gradients; base after %llu warm-up steps, delta one step "
              "later\n",
              static_cast<unsigned long long>(warmup));
  std::printf("%-17s %10s %12s %9s %12s %9s %8s %10s %10s\n", "scenario", "state MB", "full bytes",
              "full s", "delta bytes", "delta s", "delta/full", "stall s", "restore s");
  std::map<std::string, double> ratio;
  for (const Scenario& sc : scenarios) {
    Part2Row r = RunScenario(sc, warmup);
    if (r.full_bytes == 0) return 1;
    ratio[sc.name] = static_cast<double>(r.delta_bytes) / static_cast<double>(r.full_bytes);
    std::printf("%-17s %10.1f %12llu %9.3f %12llu %9.3f %8.3f %10.4f %10.3f\n", r.scenario.c_str(),
                static_cast<double>(r.state_bytes) / 1e6,
                static_cast<unsigned long long>(r.full_bytes), r.full_s,
                static_cast<unsigned long long>(r.delta_bytes), r.delta_s, ratio[sc.name],
                r.stall_s, r.restore_s);
    std::fflush(stdout);
  }
  std::printf("RATIOS stall_vs_step=%.4f frozen_delta_vs_full=%.3f sparse_delta_vs_full=%.3f "
              "dense_delta_vs_full=%.3f\n",
              p1.stall_s / p1.step_s, ratio["frozen half"], ratio["sparse embedding"],
              ratio["dense"]);
  return 0;
}
