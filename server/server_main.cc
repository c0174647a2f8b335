// zshard-server: one shard owner. See README.md for the flags.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/cluster_identity.h"
#include "common/base/flags.h"
#include "common/base/malloc_mode.h"
#include "common/base/mutex_mode.h"
#include "common/base/status_macros.h"
#include "common/config/training_config.h"
#include "common/transport/transport_factory.h"
#include "server/checkpoint/shard_restore.h"
#include "server/shard_server.h"

namespace zshard {
namespace {

// Slurm's and Kubernetes' way of saying which task this is.
std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out) return absl::UnavailableError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError("cannot rename " + tmp + " to " + path);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardServerOptions> OptionsFromFlags(const Flags& flags) {
  ShardServerOptions o;
  o.listen_address = flags.GetString("listen");
  const size_t colon = o.listen_address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        "flag --listen: expected host:port, got '" + o.listen_address + "'");
  }
  const std::string port = o.listen_address.substr(colon + 1);
  int64_t port_number = -1;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError("flag --listen: port '" + port +
                                      "' is not a number in 0-65535");
  }
  o.advertise_host = flags.GetString("advertise_host");
  o.coordinator = flags.GetString("coordinator");
  auto& store = o.service.store;
  ZS_ASSIGN_OR_RETURN(int64_t shards, flags.GetInt("num_shards", 1, 4096));
  ZS_RETURN_IF_ERROR(CheckSlurmTaskCount(shards, ProcessEnv()));
  ZS_ASSIGN_OR_RETURN(int64_t shard, flags.GetInt("shard_id", 0, shards - 1));
  ZS_ASSIGN_OR_RETURN(bool from_hostname,
                      flags.GetBool("shard_id_from_hostname"));
  if (from_hostname) {
    ZS_ASSIGN_OR_RETURN(std::string host, LocalHostname());
    absl::StatusOr<uint32_t> ordinal = OrdinalFromHostname(host);
    if (!ordinal.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --shard_id_from_hostname: ", ordinal.status().message()));
    }
    if (*ordinal >= shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --shard_id_from_hostname: hostname '", host, "' gives shard ",
          *ordinal, ", but --num_shards is ", shards));
    }
    shard = *ordinal;
  }
  // Shard 0 is the coordinator: a --coordinator given to every shard alike
  // (one command line for a StatefulSet or a Slurm step) is ignored there.
  if (shard == 0) o.coordinator.clear();
  ZS_ASSIGN_OR_RETURN(int64_t trainers, flags.GetInt("trainers", 1, 65536));
  ZS_ASSIGN_OR_RETURN(int64_t alignment, flags.GetInt("alignment", 1, 1 << 20));
  ZS_ASSIGN_OR_RETURN(int64_t wait_s, flags.GetInt("wait_timeout_s", 1, 86400));
  ZS_ASSIGN_OR_RETURN(int64_t opt_threads,
                      flags.GetInt("optimizer_threads", 1, 256));
  store.kernels.threads = static_cast<int>(opt_threads);
  store.num_shards = static_cast<uint32_t>(shards);
  store.shard_id = static_cast<uint32_t>(shard);
  // --nnodes=MIN:MAX as torchrun has it: ranks up to --max_trainers exist,
  // the first step waits for --trainers, steps wait while fewer than
  // --min_trainers hold a rank.
  int64_t max_trainers = trainers;
  if (!flags.GetString("max_trainers").empty()) {
    ZS_ASSIGN_OR_RETURN(max_trainers, flags.GetInt("max_trainers", 1, 65536));
  }
  ZS_ASSIGN_OR_RETURN(int64_t min_trainers,
                      flags.GetInt("min_trainers", 1, 65536));
  if (!(min_trainers <= trainers && trainers <= max_trainers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flags --min_trainers=", min_trainers,
                     " --trainers=", trainers, " --max_trainers=", max_trainers,
                     ": expected min_trainers <= trainers <= max_trainers"));
  }
  store.world_size = static_cast<uint32_t>(max_trainers);
  store.initial_trainers = static_cast<uint32_t>(trainers);
  store.min_trainers = static_cast<uint32_t>(min_trainers);
  store.alignment = static_cast<uint64_t>(alignment);
  if (shard > 0 && o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "flag --coordinator: required for --shard_id > 0");
  }
  TrainingConfig config = DefaultTrainingConfig();
  if (!flags.GetString("config").empty()) {
    auto loaded = LoadTrainingConfig(flags.GetString("config"));
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --config: ", loaded.status().message()));
    }
    config = *loaded;
  }
  // The batch arithmetic of the config is for the trainers a run starts with.
  ZS_RETURN_IF_ERROR(ResolveBatchSize(&config, store.initial_trainers));
  for (const std::string& key : config.ignored_keys) {
    std::cerr << "zshard-server: config key '" << key
              << "' is accepted but ignored\n";
  }
  for (const std::string& note : config.notes) {
    std::cerr << "zshard-server: config: " << note << "\n";
  }
  store.accumulation_steps = config.gradient_accumulation_steps;
  store.adamw = config.adamw;
  store.persistence_threshold = config.stage3_param_persistence_threshold;
  store.scheduler = config.scheduler;
  store.step_barrier = config.NeedsStepBarrier();
  store.sum_only = config.zero_stage == 0;
  store.publish_bf16 = config.bf16_enabled;
  if (config.quantization.weights)
    store.quantized_parameters = config.ParameterWire();
  if (config.quantization.gradients)
    store.quantized_gradients = config.GradientWire();
  store.gradient_clipping = config.gradient_clipping;
  o.service.config_hash = config.hash;
  o.service.config_canonical = config.canonical;
  store.checkpoint.root = flags.GetString("checkpoint_dir");
  store.checkpoint.full_every = config.checkpoint.full_every;
  store.checkpoint.chunk_elements = config.checkpoint.chunk_elements;
  store.checkpoint.zstd_level = config.checkpoint.zstd_level;
  store.checkpoint_interval = config.checkpoint.interval_steps;
  o.checkpoint_keep_bases = config.checkpoint.keep_bases;
  ZS_ASSIGN_OR_RETURN(
      int64_t delay_ms,
      flags.GetInt("testing_checkpoint_chunk_delay_ms", 0, 60000));
  store.checkpoint.testing_chunk_delay = absl::Milliseconds(delay_ms);
  o.restore = flags.GetString("restore");
  store.snapshot_interval = config.fault_tolerance.snapshot_interval_steps;
  if (flags.GetString("replace") == "auto") {
    if (store.snapshot_interval == 0) {
      return absl::InvalidArgumentError(
          "flag --replace=auto: zshard_fault_tolerance.snapshot_interval_steps "
          "is 0 in --config, so no shard holds a snapshot to replace it from");
    }
    o.replace_auto = true;
    o.peer = flags.GetString("peer");
    if (store.shard_id == 0 && store.num_shards > 1 && o.peer.empty()) {
      return absl::InvalidArgumentError(
          "flag --replace=auto on shard 0 needs --peer=HOST:PORT, a shard of "
          "the cluster to ask whether it is training (and to learn the "
          "cluster from when it is)");
    }
  } else if (!flags.GetString("replace").empty()) {
    ZS_ASSIGN_OR_RETURN(int64_t k, flags.GetInt("replace", 0, 65535));
    if (static_cast<uint32_t>(k) != store.shard_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --replace=", k, " names another shard than --shard_id=",
          store.shard_id, " (a replacement serves the shard it replaces)"));
    }
    if (!o.restore.empty()) {
      return absl::InvalidArgumentError(
          "flags --replace and --restore: a replacement takes its state from "
          "the buddy shard's memory, not from disk; give one");
    }
    if (store.snapshot_interval == 0) {
      return absl::InvalidArgumentError(
          "flag --replace: zshard_fault_tolerance.snapshot_interval_steps is "
          "0 in --config, so no shard holds a snapshot to replace it from");
    }
    o.replace = true;
    o.peer = flags.GetString("peer");
    if (k == 0 && o.peer.empty()) {
      return absl::InvalidArgumentError(
          "flag --replace=0 needs --peer=HOST:PORT, a live shard of the "
          "cluster (the replacement learns the cluster from it and takes "
          "over as the coordinator)");
    }
  }
  if (!flags.GetString("peer").empty() && o.peer.empty() && !o.replace_auto) {
    return absl::InvalidArgumentError(
        "flag --peer: only with --replace=0 or --replace=auto (a replacement "
        "of shard 0)");
  }
  o.transport = flags.GetString("transport");
  if (o.transport != "ucx" && o.transport != "inline") {
    return absl::InvalidArgumentError(
        "flag --transport: expected ucx or inline, got '" + o.transport + "'");
  }
  ZS_ASSIGN_OR_RETURN(int64_t lease_s,
                      flags.GetInt("lease_timeout_s", 1, 86400));
  store.lease_timeout = absl::Seconds(lease_s);
  ZS_ASSIGN_OR_RETURN(int64_t landing_slots,
                      flags.GetInt("landing_slots", 1, 4096));
  store.landing_slots = static_cast<uint32_t>(landing_slots);
  if (!o.restore.empty() && store.checkpoint.root.empty()) {
    return absl::InvalidArgumentError("flag --restore: needs --checkpoint_dir");
  }
  if (o.restore == "auto") {  // a pod or job restarted: resume if it can
    o.restore = CheckNoCheckpoints(store.checkpoint.root).ok() ? "" : "latest";
  }
  if (store.checkpoint.root.empty() && config.checkpoint.interval_steps > 0) {
    return absl::InvalidArgumentError(
        "zshard_checkpoint.interval_steps is set but --checkpoint_dir is not");
  }
  if (!store.checkpoint.root.empty() && store.sum_only) {
    return absl::InvalidArgumentError(
        "flag --checkpoint_dir: checkpoints need ZeRO stage 1-3 (at stage 0 "
        "the trainers "
        "hold the optimizer state)");
  }
  o.service.wait_timeout = absl::Seconds(wait_s);
  store.decision_timeout = absl::Seconds(wait_s);
  ZS_ASSIGN_OR_RETURN(double trainer_timeout_s,
                      flags.GetDouble("trainer_timeout_s"));
  if (!(trainer_timeout_s >= 0.5 && trainer_timeout_s <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --trainer_timeout_s: ", trainer_timeout_s,
                     " out of range [0.5, 3600]"));
  }
  if (trainer_timeout_s >= static_cast<double>(wait_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --trainer_timeout_s: ", trainer_timeout_s,
        " must be below --wait_timeout_s ", wait_s,
        " (a trainer waiting on a silent one must see it dropped before its "
        "own calls time out)"));
  }
  o.trainer_timeout = absl::Seconds(trainer_timeout_s);
  store.quarantine = o.trainer_timeout;
  o.security.tls_cert = flags.GetString("tls_cert");
  o.security.tls_key = flags.GetString("tls_key");
  o.security.tls_ca = flags.GetString("tls_ca");
  o.security.auth_token_file = flags.GetString("auth_token_file");
  o.security.admin_token_file = flags.GetString("admin_token_file");
  o.metrics_listen = flags.GetString("metrics_listen");
  ZS_ASSIGN_OR_RETURN(int64_t stop_s, flags.GetInt("stop_timeout_s", 0, 3600));
  o.stop_timeout = absl::Seconds(stop_s);
  return o;
}

// zshard-server's flags, with their defaults and help.
void DefineFlags(Flags* flags) {
  flags->Define("listen", "127.0.0.1:0",
                "host:port to bind (port 0: any free)");
  flags->Define("port_file", "", "write the bound port to this file");
  flags->Define("shard_id", EnvOr("SLURM_PROCID", "0"),
                "this shard's id (default $SLURM_PROCID or 0)");
  flags->Define("num_shards", EnvOr("SLURM_NTASKS", "1"),
                "number of shards (default $SLURM_NTASKS or 1)");
  flags->Define("shard_id_from_hostname", "false",
                "take the shard id from the hostname's ordinal (NAME-N, a "
                "StatefulSet pod's); overrides --shard_id");
  flags->Define("coordinator", "",
                "host:port of shard 0 (needed by the others; ignored on "
                "shard 0)");
  flags->Define("advertise_host", "",
                "host announced to trainers (default: --listen's host)");
  flags->Define("trainers", "1",
                "number of trainers (data-parallel ranks) the first step "
                "waits for");
  flags->Define("min_trainers", "1",
                "steps wait while fewer trainers than this hold a rank");
  flags->Define("max_trainers", "",
                "trainer ranks that exist (default --trainers): more "
                "trainers may join a running cluster up to this many");
  flags->Define("trainer_timeout_s", "10",
                "a trainer with no heartbeat for this long is dropped (steps "
                "go on without it; its rank is free for a new trainer)");
  flags->Define("config", "", "DeepSpeed-style ds_config.json");
  flags->Define("alignment", "64", "slice alignment in elements");
  flags->Define("wait_timeout_s", "120",
                "longest any RPC waits for a version or a peer");
  flags->Define("optimizer_threads", "1",
                "threads each optimizer update is split over");
  flags->Define("transport", DefaultTransportName(),
                "data plane for parameters and gradients: ucx (default when "
                "built) or inline "
                "(bytes in gRPC)");
  flags->Define("lease_timeout_s", "30",
                "a trainer's lease on published values ends after this long "
                "unless released");
  flags->Define("landing_slots", "8",
                "gradient landing slots shared by all groups, each the size "
                "of the largest contribution (memory does not grow with "
                "trainers)");
  flags->Define(
      "checkpoint_dir", "",
      "checkpoint directory, shared by all shards (empty: checkpoints off)");
  flags->Define("restore", "",
                "before serving, load a checkpoint: 'latest', a step number, "
                "or 'auto' (latest when --checkpoint_dir holds a complete "
                "one, else start fresh)");
  flags->Define("replace", "",
                "K: this process replaces shard K (= --shard_id) that died: "
                "it takes K's state from the buddy shard's in-memory "
                "snapshot and every other shard rolls back to that step; "
                "K = 0 also takes over as the coordinator (with --peer); "
                "'auto': replace this shard when the cluster is training, "
                "else start as configured (a restarted pod or job)");
  flags->Define("peer", "",
                "with --replace=0 or =auto on shard 0: host:port of a live "
                "shard to learn the cluster from");
  flags->Define("tls_cert", "",
                "PEM certificate chain: serve TLS on the gRPC port (with "
                "--tls_key)");
  flags->Define("tls_key", "", "PEM private key of --tls_cert");
  flags->Define("tls_ca", "",
                "PEM CA bundle: require client certificates it signed; also "
                "what peers' certificates are checked against (without it, "
                "peers must present --tls_cert itself)");
  flags->Define("auth_token_file", "",
                "file holding the trainer token: trainer calls need it (or "
                "the admin token); needs --admin_token_file");
  flags->Define("admin_token_file", "",
                "file holding the admin token: status, checkpoint and "
                "shard-to-shard calls need it; health stays open");
  flags->Define("metrics_listen", "",
                "IPv4:port of the HTTP telemetry port: /metrics (Prometheus) "
                "on every shard, the status page on shard 0; empty: off");
  flags->Define("metrics_port_file", "",
                "write the bound telemetry port to this file");
  flags->Define("stop_timeout_s", "20",
                "on SIGTERM/SIGINT, keep serving at most this long until the "
                "checkpoint being written is complete");
  flags->Define("testing_checkpoint_chunk_delay_ms", "0",
                "testing: pause after each checkpoint chunk written");
  flags->Define("help", "false", "print the flags and exit");
}

// The publish-latency figure each server prints when it stops.
void PrintPublishLatency(uint32_t shard_id,
                         const PublishLatency::Summary& latency) {
  if (latency.count > 0) {
    std::cerr << "zshard-server: shard " << shard_id
              << ": publish latency median "
              << absl::ToDoubleMicroseconds(latency.median) << " us, p90 "
              << absl::ToDoubleMicroseconds(latency.p90) << " us over "
              << latency.count << " versions\n";
  }
}

int Main(int argc, char** argv) {
  // Block the stop signals in every thread (first: gRPC starts threads as
  // soon as any credentials exist); one thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  SetTransportProcessDefaults();  // before any thread or transport
  DisableMutexDeadlockDetection();
  KeepFreedMemoryForReuse();
  EnableGrpcProcessDefaults();
  Flags flags;
  DefineFlags(&flags);
  absl::Status st = flags.Parse(argc, argv);
  if (st.ok() && !flags.positional().empty()) {
    st = absl::InvalidArgumentError("unexpected argument '" +
                                    flags.positional()[0] + "'");
  }
  if (!st.ok()) {
    std::cerr << "zshard-server: " << st.message() << "\n";
    return 2;
  }
  if (flags.IsSet("help")) {
    std::cout << "usage: zshard-server [flags]\n" << flags.Usage();
    return 0;
  }
  auto options = OptionsFromFlags(flags);
  if (!options.ok()) {
    std::cerr << "zshard-server: " << options.status().message() << "\n";
    return 2;
  }

  auto server = ShardServer::Start(*options);
  if (!server.ok()) {
    std::cerr << "zshard-server: " << server.status().message() << "\n";
    return 1;
  }
  if (!flags.GetString("port_file").empty()) {
    st = WritePortFile(flags.GetString("port_file"), (*server)->port());
    if (!st.ok()) {
      std::cerr << "zshard-server: " << st.message() << "\n";
      return 1;
    }
  }
  if (!flags.GetString("metrics_port_file").empty()) {
    st = WritePortFile(flags.GetString("metrics_port_file"),
                       (*server)->metrics_port());
    if (!st.ok()) {
      std::cerr << "zshard-server: " << st.message() << "\n";
      return 1;
    }
  }
  std::cerr << "zshard-server: shard " << options->service.store.shard_id << "/"
            << options->service.store.num_shards << " serving on "
            << (*server)->endpoint()
            << (options->security.tls_cert.empty() ? "" : " (TLS)") << "\n";
  if (!options->security.admin_token_file.empty() &&
      options->security.tls_cert.empty()) {
    std::cerr << "zshard-server: warning: tokens are checked but travel in "
                 "clear text without TLS (--tls_cert, --tls_key)\n";
  }
  std::thread stopper([&server, stop] {
    int sig = 0;
    sigwait(&stop, &sig);
    (*server)->Stop();
  });
  (*server)->Wait();
  const absl::Status fenced = (*server)->fenced();
  if (!fenced.ok()) kill(getpid(), SIGTERM);  // ends the stopper's sigwait
  stopper.join();
  if (!fenced.ok()) {
    std::cerr << "zshard-server: exiting: " << fenced.message() << "\n";
    return 1;
  }
  PrintPublishLatency(options->service.store.shard_id,
                      (*server)->service().store().PublishLatencySummary());
  return 0;
}

}  // namespace
}  // namespace zshard

int main(int argc, char** argv) { return zshard::Main(argc, argv); }
