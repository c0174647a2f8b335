// Data plane bandwidth (issue 4): 4 zshard-server processes hold one group
// of 64 MiB striped over them; this process joins as trainer 0 and, through
// the real DataPlane (Lease + one-sided get; put + Landed), fetches the whole
// group and pushes 64 MiB of gradients (one micro step each), in GB/s, for
// ucx over shared memory (UCX_TLS=shm), ucx over tcp only (UCX_TLS=tcp,
// UCX_NET_DEVICES=lo) and
// inline (bytes in gRPC). Next to each ucx figure: ucx_perftest's tag
// bandwidth for the same message size, run by this invocation with the same
// UCX_TLS (and the user's other UCX settings, not the tcp segment sizes our
// transport picks for itself). Best of --reps repetitions. Before the last
// line: the machine's copy roofline (memcpy of the same bytes on 2 threads,
// in the same run), which bounds a shared-memory fetch. The last line is
// exactly
//   RATIOS ucx_shm_fetch_vs_perftest=X ucx_tcp_fetch_vs_perftest=X
//   ucx_shm_fetch_vs_inline=X inline_fetch_gbps=X
//
// Usage: transport_bench SERVER_BIN [--mib=64] [--reps=8] [--quick]
//                        [--planes=ucx_shm,ucx_tcp,inline]
// (--quick: 4 MiB, 2 repetitions: the ctest smoke run; --planes: only those
// rows, the ratios of the others print as 0).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/core/cluster.h"
#include "client/core/data_plane.h"
#include "common/transport/transport_factory.h"
#include "tests/integration/process.h"

namespace {

using zshard::testing::Process;
namespace fs = std::filesystem;

struct Figures {
  bool ok = false;
  double fetch_gbps = 0, push_gbps = 0, perftest_gbps = 0;
  std::string lanes;
};

// The UCX_TCP_* segment sizes as the user left them (our transport sets
// defaults for itself in this process's environment; perftest runs with the
// user's).
std::vector<std::pair<std::string, std::string>> g_user_tcp_env;

void RestoreUserTcpEnv() {
  for (const auto& [name, value] : g_user_tcp_env) {
    if (value.empty()) {
      unsetenv(name.c_str());
    } else {
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
}

// ucx_perftest tag bandwidth (GB/s) for `bytes` messages with UCX_TLS as set.
double Perftest(const std::string& dir, size_t bytes, int port) {
  RestoreUserTcpEnv();
  Process server({"/usr/bin/ucx_perftest", "-p", std::to_string(port)},
                 dir + "/perftest-server");
  absl::SleepFor(absl::Milliseconds(300));
  Process client(
      {"/usr/bin/ucx_perftest", "127.0.0.1", "-p", std::to_string(port), "-t",
       "tag_bw", "-s", std::to_string(bytes), "-n", "20", "-w", "3"},
      dir + "/perftest-client");
  auto code = client.Wait(absl::Seconds(120));
  server.Kill();
  if (!code || *code != 0) {
    std::fprintf(stderr, "transport_bench: ucx_perftest failed:\n%s\n",
                 client.Stderr().c_str());
    return 0;
  }
  // "Final:  20  0.060 14452.994 14452.994  4428.15  4428.15  69  69":
  // the overall bandwidth is the 6th number, in MB/s (2^20 bytes).
  static const std::regex final_line(
      R"(Final:\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+([0-9.]+))");
  std::smatch m;
  const std::string out = client.Stdout();
  if (!std::regex_search(out, m, final_line)) return 0;
  return std::stod(m[1]) * (1 << 20) / 1e9;
}

Figures Run(const std::string& server_bin, const std::string& plane,
            const std::string& tls, size_t mib, int reps) {
  Figures f;
  const std::string dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "zstbench.XXXXXX").string();
    return std::string(mkdtemp(tmpl.data()));
  }();
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  // tcp on one machine: the loopback device only (UCX would also stripe over
  // the VM's eth0, which makes both our figures and perftest's bimodal).
  if (tls == "tcp") {
    setenv("UCX_NET_DEVICES", "lo", 1);
  } else {
    unsetenv("UCX_NET_DEVICES");
  }
  const int kShards = 4;
  const std::string config = dir + "/config.json";
  std::ofstream(config) << "{\"train_batch_size\": " << reps
                        << ", \"train_micro_batch_size_per_gpu\": 1, "
                           "\"gradient_accumulation_steps\": "
                        << reps << "}";
  std::vector<std::unique_ptr<Process>> servers;
  std::string coordinator;
  for (int s = 0; s < kShards; ++s) {
    const std::string port_file = dir + "/port" + std::to_string(s);
    std::vector<std::string> argv = {server_bin,
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file,
                                     "--shard_id=" + std::to_string(s),
                                     "--num_shards=" + std::to_string(kShards),
                                     "--trainers=1",
                                     "--config=" + config,
                                     "--transport=" + plane};
    if (s > 0) argv.push_back("--coordinator=" + coordinator);
    servers.push_back(
        std::make_unique<Process>(argv, dir + "/server" + std::to_string(s)));
    const int port = zshard::testing::WaitForPortFile(
        port_file, *servers.back(), absl::Seconds(60));
    if (port == 0) {
      std::fprintf(stderr, "transport_bench: server %d:\n%s\n", s,
                   servers.back()->Stderr().c_str());
      return f;
    }
    if (s == 0) coordinator = "127.0.0.1:" + std::to_string(port);
  }
  zshard::ClusterOptions co;
  co.coordinator = coordinator;
  co.requested_rank = 0;
  co.connect_timeout = absl::Seconds(60);
  auto cluster = zshard::Cluster::Connect(co);
  if (!cluster.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n",
                 std::string(cluster.status().message()).c_str());
    return f;
  }
  const uint64_t n = (mib << 20) / sizeof(float);
  zshard::v1::ModelSpec spec;
  spec.set_name("bench");
  auto* g = spec.add_groups();
  g->set_name("big");
  auto* t = g->add_tensors();
  t->set_name("big.weight");
  t->add_shape(static_cast<int64_t>(n));
  t->set_dtype(zshard::v1::FLOAT32);
  t->set_trainable(true);
  auto map = (*cluster)->RegisterOrVerify(
      spec,
      [n](size_t, float* out) {
        for (uint64_t i = 0; i < n; ++i)
          out[i] = static_cast<float>(i % 1000) * 1e-3f;
        return absl::OkStatus();
      },
      absl::Seconds(120));
  if (!map.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n",
                 std::string(map.status().message()).c_str());
    return f;
  }
  auto plane_or = zshard::DataPlane::Create(cluster->get());
  if (!plane_or.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n",
                 std::string(plane_or.status().message()).c_str());
    return f;
  }
  zshard::DataPlane& dp = **plane_or;
  f.lanes = dp.Lanes();
  std::vector<float> buf(n, 0.0f), grad(n, 1e-3f);
  // One thread per shard, as the parameter cache's pool runs them; the
  // clock runs from their start signal to the last one's end (not thread
  // creation).
  auto all_shards = [&](auto&& op) {
    std::vector<absl::Status> st(kShards);
    std::vector<absl::Time> end(kShards);
    std::vector<std::thread> threads;
    absl::Notification go;
    for (int s = 0; s < kShards; ++s) {
      threads.emplace_back([&, s] {
        go.WaitForNotification();
        st[s] = op(static_cast<uint32_t>(s), map->slice(0, s));
        end[s] = absl::Now();
      });
    }
    const absl::Time start = absl::Now();
    go.Notify();
    for (auto& th : threads) th.join();
    const double secs = absl::ToDoubleSeconds(
        *std::max_element(end.begin(), end.end()) - start);
    for (const auto& x : st) {
      if (!x.ok()) {
        std::fprintf(stderr, "transport_bench: %s\n",
                     std::string(x.message()).c_str());
        return 0.0;
      }
    }
    return static_cast<double>(n * sizeof(float)) / secs / 1e9;
  };
  const absl::Time deadline_pad = absl::Now() + absl::Minutes(10);
  for (int r = 0; r < reps + 1; ++r) {  // the first one warms up (first touch)
    const double gbps = all_shards([&](uint32_t s, const zshard::Slice& sl) {
      return dp.Fetch(s, 0, 0, zshard::WireFormat::Fp32(), buf.data() + sl.begin,
                      sl.size() * sizeof(float), deadline_pad);
    });
    (void)dp.ReleaseAll(deadline_pad);
    if (r > 0) f.fetch_gbps = std::max(f.fetch_gbps, gbps);
  }
  // Pushes: step 0 touches every landing slot once (and ends with the
  // update); step 1's pushes are measured, best of the micro steps (the
  // last one also waits for the shards' AdamW).
  for (uint64_t step : {0, 1}) {
    for (int micro = 0; micro < reps; ++micro) {
      const double gbps = all_shards([&](uint32_t s, const zshard::Slice& sl) {
        return dp.Push(s, 0, step, static_cast<uint32_t>(micro),
                       zshard::WireFormat::Fp32(),
                       grad.data() + sl.begin, sl.size() * sizeof(float), "",
                       deadline_pad);
      });
      if (gbps == 0) return f;
      if (step == 1) f.push_gbps = std::max(f.push_gbps, gbps);
    }
    if (step == 0) {
      // Step 1 starts once every shard updated: fetching version 1 waits for
      // it.
      all_shards([&](uint32_t s, const zshard::Slice& sl) {
        return dp.Fetch(s, 0, 1, zshard::WireFormat::Fp32(), buf.data() + sl.begin,
                        sl.size() * sizeof(float), deadline_pad);
      });
      (void)dp.ReleaseAll(deadline_pad);
    }
  }
  plane_or->reset();
  cluster->reset();
  servers.clear();
  if (plane == "ucx")
    f.perftest_gbps = Perftest(dir, (mib << 20), 13000 + (getpid() % 2000));
  fs::remove_all(dir);
  f.ok = f.fetch_gbps > 0 && f.push_gbps > 0;
  return f;
}

// memcpy bandwidth (GB/s) of `bytes` between two touched buffers split over
// `threads` threads, best of `reps` + 1.
double CopyRoofline(size_t bytes, int threads, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {
    const absl::Time start = absl::Now();
    std::vector<std::thread> workers;
    const size_t per = bytes / threads;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t n = t + 1 == threads ? bytes - per * t : per;
        std::memcpy(dst.data() + per * t, src.data() + per * t, n);
      });
    }
    for (auto& w : workers) w.join();
    best = std::max(best, static_cast<double>(bytes) /
                              absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  zshard::SetTransportProcessDefaults();
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: transport_bench SERVER_BIN [--mib=64] [--reps=8] [--quick] "
        "[--planes=ucx_shm,ucx_tcp,inline]\n");
    return 2;
  }
  size_t mib = 64;
  int reps = 8;
  std::string planes = "ucx_shm,ucx_tcp,inline";
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], "--planes=", 9) == 0) planes = argv[i] + 9;
    if (std::strncmp(argv[i], "--mib=", 6) == 0) mib = std::stoul(argv[i] + 6);
    if (std::strncmp(argv[i], "--reps=", 7) == 0)
      reps = std::max(1, std::atoi(argv[i] + 7));
    if (std::strcmp(argv[i], "--quick") == 0) {
      mib = 4;
      reps = 2;
    }
  }
  for (const char* name : {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}) {
    const char* v = std::getenv(name);
    g_user_tcp_env.emplace_back(name, v ? v : "");
  }
  const bool ucx = zshard::DefaultTransportName() == "ucx";
  struct Case {
    const char* name;
    const char* plane;
    const char* tls;
  };
  std::vector<Case> cases;
  const std::vector<std::string> wanted = absl::StrSplit(planes, ',');
  auto want = [&](const char* name) {
    return std::find(wanted.begin(), wanted.end(), name) != wanted.end();
  };
  if (ucx && want("ucx_shm")) cases.push_back({"ucx_shm", "ucx", "shm"});
  if (ucx && want("ucx_tcp")) cases.push_back({"ucx_tcp", "ucx", "tcp"});
  if (want("inline")) cases.push_back({"inline", "inline", ""});
  std::printf(
      "%zu MiB group over 4 shards, trainer 0 fetches it whole and pushes 1 "
      "micro step; "
      "best of %d\n",
      mib, reps);
  std::printf("%-8s %-6s %11s %11s %15s %9s  %s\n", "plane", "UCX_TLS",
              "fetch GB/s", "push GB/s", "perftest GB/s", "fetch/pt", "lanes");
  std::map<std::string, Figures> got;
  const double roofline_before = CopyRoofline(mib << 20, 2, reps);
  for (const Case& c : cases) {
    Figures f = Run(argv[1], c.plane, c.tls, mib, reps);
    if (!f.ok) return 1;
    got[c.name] = f;
    std::printf("%-8s %-6s %11.3f %11.3f %15.3f %9.3f  %s\n", c.name, c.tls,
                f.fetch_gbps, f.push_gbps, f.perftest_gbps,
                f.perftest_gbps > 0 ? f.fetch_gbps / f.perftest_gbps : 0.0,
                f.lanes.c_str());
    std::fflush(stdout);
  }
  // What one copy of the same bytes costs on this machine: a fetch over
  // shared memory copies every byte once, so this bounds it (measured before
  // and after the planes, the better of the two: the machine is noisy).
  const double roofline =
      std::max(roofline_before, CopyRoofline(mib << 20, 2, reps));
  std::printf(
      "copy roofline: memcpy of %zu MiB on 2 threads %.3f GB/s; ucx_shm fetch "
      "%.3f of it, "
      "inline fetch %.3f of it\n",
      mib, roofline,
      got.count("ucx_shm") ? got["ucx_shm"].fetch_gbps / roofline : 0.0,
      got.count("inline") ? got["inline"].fetch_gbps / roofline : 0.0);
  const Figures& in = got["inline"];
  const Figures shm = got.count("ucx_shm") ? got["ucx_shm"] : Figures{};
  const Figures tcp = got.count("ucx_tcp") ? got["ucx_tcp"] : Figures{};
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf(
      "RATIOS ucx_shm_fetch_vs_perftest=%.3f ucx_tcp_fetch_vs_perftest=%.3f "
      "ucx_shm_fetch_vs_inline=%.3f inline_fetch_gbps=%.3f\n",
      ratio(shm.fetch_gbps, shm.perftest_gbps),
      ratio(tcp.fetch_gbps, tcp.perftest_gbps),
      ratio(shm.fetch_gbps, in.fetch_gbps), in.fetch_gbps);
  return 0;
}
