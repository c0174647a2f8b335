// zshard-train: the reference trainer. Trains a GPT-style character-level
// transformer through the shard servers, layer by layer. See README.md.
#include <strings.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/core/rejoin.h"
#include "client/core/trainer_client.h"
#include "client/examples/char_dataset.h"
#include "client/examples/gpt_model.h"
#include "client/examples/local_groups.h"
#include "client/torch/blas_core.h"
#include "client/torch/compute_threads.h"
#include "client/torch/torch_group_runner.h"
#include "common/base/cluster_identity.h"
#include "common/base/flags.h"
#include "common/base/malloc_mode.h"
#include "common/base/mutex_mode.h"
#include "common/base/rpc_credentials.h"
#include "common/base/status_macros.h"
#include "common/base/thread_times.h"
#include "common/config/loss_scaler.h"
#include "common/config/training_config.h"
#include "common/transport/transport_factory.h"

namespace zshard {
namespace {

struct TrainerFlags {
  TrainerClientOptions client;
  TrainingConfig config;
  GptConfig gpt;
  std::vector<std::string> data;
  int64_t steps = 0;
  int64_t micro_batch = 0;
  int64_t threads = 1;
  std::string blas_core;  // --blas_core
  int64_t log_every = 1;
  std::string dump_params;
  std::string stats_json;
  // Fault injection (tests): steps at which rank `inject_rank` makes one
  // gradient value +Inf, as an fp16 overflow would.
  std::vector<int64_t> inject_steps;
  int64_t inject_rank = 0;
  // > 0: train alone as rank --rank of this many trainers, without servers
  // (the compute floor).
  int64_t local_world = 0;
  // --rejoin_timeout_s (0: no rejoin).
  absl::Duration rejoin_timeout = absl::Seconds(60);
};

absl::StatusOr<TrainerFlags> ParseFlags(const Flags& f) {
  TrainerFlags t;
  t.client.cluster.coordinator = f.GetString("coordinator");
  ZS_ASSIGN_OR_RETURN(t.local_world, f.GetInt("local_world", 0, 65536));
  if (t.client.cluster.coordinator.empty() && t.local_world == 0) {
    return absl::InvalidArgumentError(
        "flag --coordinator: required (host:port of shard 0) unless "
        "--local_world is given");
  }
  if (!t.client.cluster.coordinator.empty() && t.local_world > 0) {
    return absl::InvalidArgumentError(
        "flag --local_world: trains without servers; do not give "
        "--coordinator with it");
  }
  ZS_ASSIGN_OR_RETURN(int64_t rank, f.GetInt("rank", -1, 65535));
  if (t.local_world > 0 && (rank < 0 || rank >= t.local_world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --rank: with --local_world=", t.local_world,
                     " expected 0..", t.local_world - 1, ", got ", rank));
  }
  t.client.cluster.requested_rank = static_cast<int>(rank);
  ZS_ASSIGN_OR_RETURN(t.steps, f.GetInt("steps", 0, 100000000));
  ZS_ASSIGN_OR_RETURN(t.micro_batch, f.GetInt("micro_batch", 0, 1 << 20));
  ZS_ASSIGN_OR_RETURN(t.threads, f.GetInt("threads", 1, 1024));
  t.blas_core = f.GetString("blas_core");
  if (t.blas_core.empty()) {
    return absl::InvalidArgumentError(
        "flag --blas_core: expected auto, keep or an OpenBLAS core name");
  }
  ZS_ASSIGN_OR_RETURN(t.log_every, f.GetInt("log_every", 0, 100000000));
  const bool log_every_given = f.IsSet("log_every");
  ZS_ASSIGN_OR_RETURN(t.gpt.context, f.GetInt("context", 1, 1 << 16));
  ZS_ASSIGN_OR_RETURN(t.gpt.d_model, f.GetInt("d_model", 1, 1 << 16));
  ZS_ASSIGN_OR_RETURN(t.gpt.layers, f.GetInt("layers", 1, 1024));
  ZS_ASSIGN_OR_RETURN(t.gpt.heads, f.GetInt("heads", 1, 1024));
  ZS_ASSIGN_OR_RETURN(int64_t seed, f.GetInt("seed", 0, INT64_MAX));
  t.gpt.seed = static_cast<uint64_t>(seed);
  ZS_ASSIGN_OR_RETURN(int64_t timeout_s, f.GetInt("rpc_timeout_s", 1, 86400));
  t.client.cache.rpc_timeout = absl::Seconds(timeout_s);
  t.client.push.rpc_timeout = absl::Seconds(timeout_s);
  ZS_ASSIGN_OR_RETURN(int64_t connect_s,
                      f.GetInt("connect_timeout_s", 1, 86400));
  t.client.cluster.connect_timeout = absl::Seconds(connect_s);
  ZS_ASSIGN_OR_RETURN(int64_t rejoin_s, f.GetInt("rejoin_timeout_s", 0, 86400));
  t.rejoin_timeout = absl::Seconds(rejoin_s);
  t.client.cluster.transport = f.GetString("transport");
  if (!t.client.cluster.transport.empty() &&
      t.client.cluster.transport != "ucx" &&
      t.client.cluster.transport != "inline") {
    return absl::InvalidArgumentError(
        "flag --transport: expected ucx or inline, got '" +
        t.client.cluster.transport + "'");
  }
  t.client.register_timeout = absl::Seconds(connect_s);
  ZS_ASSIGN_OR_RETURN(
      t.client.cluster.credentials,
      RpcCredentials::Load(RpcClientSecurityFromFlags("auth_token_file", f)));
  t.config = DefaultTrainingConfig();
  if (!f.GetString("config").empty()) {
    auto loaded = LoadTrainingConfig(f.GetString("config"));
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --config: ", loaded.status().message()));
    }
    t.config = *loaded;
  }
  if (!log_every_given && t.config.steps_per_print_given) {
    t.log_every = static_cast<int64_t>(t.config.steps_per_print);
  }
  ZS_ASSIGN_OR_RETURN(int64_t prefetch,
                      f.GetInt("prefetch_bytes", -1, INT64_MAX));
  ApplyTrainingConfig(t.config, prefetch, &t.client);
  t.data = absl::StrSplit(f.GetString("data"), ',', absl::SkipEmpty());
  if (t.data.empty())
    return absl::InvalidArgumentError("flag --data: no paths given");
  for (absl::string_view v : absl::StrSplit(
           f.GetString("inject_nonfinite_steps"), ',', absl::SkipEmpty())) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(v, &step) || step < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --inject_nonfinite_steps: expected step numbers, got '", v,
          "'"));
    }
    t.inject_steps.push_back(step);
  }
  ZS_ASSIGN_OR_RETURN(t.inject_rank,
                      f.GetInt("inject_nonfinite_rank", 0, 65535));
  t.dump_params = f.GetString("dump_params");
  t.stats_json = f.GetString("stats_json");
  return t;
}

double Mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

// CPU seconds this process used so far, all its threads together.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

// This trainer's resume state at the start of `step`, saved in checkpoints:
// the data position (the batches are a function of the step, so the step is
// the position) and the loss scaler.
std::string TrainerState(uint64_t step, const LossScaler& scaler) {
  return absl::StrCat("zshard-train/1 step=", step, " ", scaler.Save());
}

// After a restore, puts the loss scaler where it was at the checkpoint: the
// state saved at the start of the step before it, plus that step's outcome.
absl::Status ResumeFromCheckpoint(const TrainerClient& client,
                                  LossScaler* scaler) {
  const Cluster::Resume& r = client.resume();
  if (!r.restored) return absl::OkStatus();
  if (r.trainer_state.empty()) {
    std::printf(
        "rank %u: resuming at step %llu (restored checkpoint holds no trainer "
        "state)\n",
        client.rank(), static_cast<unsigned long long>(r.step));
    return absl::OkStatus();
  }
  const std::string prefix = "zshard-train/1 step=";
  const std::string& s = r.trainer_state;
  const size_t space = s.find(' ', prefix.size());
  uint64_t step = 0;
  if (s.compare(0, prefix.size(), prefix) != 0 || space == std::string::npos ||
      !absl::SimpleAtoi(s.substr(prefix.size(), space - prefix.size()),
                        &step)) {
    return absl::FailedPreconditionError("restored trainer state '" + s +
                                         "' was not written by zshard-train");
  }
  if (step + 1 != r.step) {
    return absl::FailedPreconditionError(
        absl::StrCat("restored trainer state is from step ", step,
                     " but the checkpoint is at step ", r.step));
  }
  ZS_RETURN_IF_ERROR(scaler->Load(s.substr(space + 1)));
  scaler->Update(r.last_step_skipped);
  std::printf(
      "rank %u: resuming at step %llu from a checkpoint (data position %llu, "
      "loss scale %g)\n",
      client.rank(), static_cast<unsigned long long>(r.step),
      static_cast<unsigned long long>(r.step), scaler->scale());
  return absl::OkStatus();
}

// Fetches every group at the client's current version and writes the flat
// values (`elem_bytes` each: fp32 or bf16), group after group, to `path`.
absl::Status DumpParams(TrainerClient& client, const std::string& path,
                        size_t elem_bytes) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  if (!out) return absl::UnavailableError("cannot write " + tmp);
  for (size_t g = 0; g < client.map().num_groups(); ++g) {
    ZS_ASSIGN_OR_RETURN(const void* p, client.Acquire(g));
    out.write(
        static_cast<const char*>(p),
        static_cast<std::streamsize>(client.map().group_numel(g) * elem_bytes));
    ZS_RETURN_IF_ERROR(client.Release(g));
  }
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError("cannot write " + path);
  }
  return absl::OkStatus();
}

// What a run recorded, step by step, for the summary and --stats_json.
struct RunRecord {
  int64_t first_step = 0;
  double first_loss = 0, last_loss = 0, total_seconds = 0;
  double end_step_seconds = 0;  // in EndStep: waiting for acknowledgements
  nlohmann::json skipped_steps = nlohmann::json::array();
  nlohmann::json scales = nlohmann::json::array();
  nlohmann::json norms = nlohmann::json::array();
  nlohmann::json step_times = nlohmann::json::array();
  nlohmann::json losses = nlohmann::json::array();  // each step's
  // CPU seconds of each step, every thread of the process (compute,
  // transfers, RPCs).
  nlohmann::json step_cpu_times = nlohmann::json::array();
  // Each step of the training loop's thread alone, which runs the model's
  // forward and backward (with --threads=1 all of the computation; torch's
  // and OpenBLAS's own threads are not counted): its CPU seconds
  // (step_cpu_times less these is what the data plane's, gRPC's and the
  // other threads cost) and its seconds runnable but waiting for a CPU
  // (empty where the kernel keeps no scheduler statistics). The step's
  // time less both is what the thread slept: waiting for parameters, for
  // acknowledgements, for the other ranks.
  nlohmann::json step_main_cpu_times = nlohmann::json::array();
  nlohmann::json step_main_runqueue_times = nlohmann::json::array();
  // gRPC calls to the shards in each step, and over the steps by method.
  nlohmann::json step_rpcs = nlohmann::json::array();
  std::map<std::string, uint64_t> rpcs;
  // Control calls over the data plane's transport instead, by method.
  std::map<std::string, uint64_t> transport_calls;
  // Each thread name's totals when the first training step began
  // (--stats_json's thread_totals: what the threads used since).
  std::map<std::string, NamedThreadTotals> threads_at_start;
};

// The training loop begins: records each thread name's totals in `rec`
// and, with --stats_json, creates <stats_json>.started, from which a bench
// measures the other processes (the servers) over the same steps.
void MarkLoopStart(const TrainerFlags& t, RunRecord* rec) {
  rec->threads_at_start = ThreadTotalsByName();
  if (!t.stats_json.empty()) std::ofstream(t.stats_json + ".started") << "";
}

// Each live thread name's CPU seconds and context switches since
// rec.threads_at_start (a name's threads that ended meanwhile are not
// counted, nor is what they used).
nlohmann::json ThreadTotalsSinceStart(const RunRecord& rec) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, now] : ThreadTotalsByName()) {
    NamedThreadTotals was;
    if (auto it = rec.threads_at_start.find(name);
        it != rec.threads_at_start.end()) {
      was = it->second;
    }
    auto since = [](auto a, auto b) { return a > b ? a - b : decltype(a){}; };
    out[name] = {{"threads", now.threads},
                 {"cpu_seconds", since(now.cpu_seconds, was.cpu_seconds)},
                 {"voluntary_switches",
                  since(now.voluntary_switches, was.voluntary_switches)},
                 {"involuntary_switches",
                  since(now.involuntary_switches, was.involuntary_switches)}};
  }
  return out;
}

// Adds the training loop's thread's CPU and run-queue time from `start` to
// `now` (both taken on this thread, within the step's wall-clock interval:
// time queued after the step's end would otherwise count in it) to `rec`
// as one step's.
void RecordMainThread(const ThreadTimes& start, const ThreadTimes& now,
                      RunRecord* rec) {
  rec->step_main_cpu_times.push_back(now.cpu_seconds - start.cpu_seconds);
  if (now.has_runqueue) {
    rec->step_main_runqueue_times.push_back(now.runqueue_seconds -
                                            start.runqueue_seconds);
  }
}

// Calls per method in `after` less those in `before`.
std::map<std::string, uint64_t> RpcsSince(
    const std::map<std::string, uint64_t>& before,
    const std::map<std::string, uint64_t>& after) {
  std::map<std::string, uint64_t> d;
  for (const auto& [method, n] : after) {
    auto it = before.find(method);
    const uint64_t was = it == before.end() ? 0 : it->second;
    if (n > was) d[method] = n - was;
  }
  return d;
}

// Checks the servers' settings against this trainer's and prints the run's
// header. Fills t->micro_batch from the config when the flag left it 0.
absl::Status CheckAndAnnounce(const TrainerClient& client,
                              const GptModel& model, const CharDataset& data,
                              TrainerFlags* t) {
  const uint32_t rank = client.rank(), world = client.world_size();
  const uint32_t accum = client.accumulation_steps();
  ZS_RETURN_IF_ERROR(ResolveBatchSize(&t->config, world));
  if (t->micro_batch == 0) {
    t->micro_batch =
        static_cast<int64_t>(t->config.train_micro_batch_size_per_gpu);
  }
  if (accum != t->config.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(
        absl::StrCat("the servers use ", accum,
                     " accumulation steps, this trainer's config ",
                     t->config.gradient_accumulation_steps));
  }
  ZS_RETURN_IF_ERROR(data.CheckShares(world, static_cast<int>(t->gpt.context)));
  for (const std::string& key : t->config.ignored_keys) {
    if (rank == 0)
      std::cerr << "zshard-train: config key '" << key
                << "' is accepted but ignored\n";
  }
  for (const std::string& note : t->config.notes) {
    if (rank == 0) std::cerr << "zshard-train: config: " << note << "\n";
  }
  std::printf(
      "rank %u/%u: model %s, %llu parameters in %zu groups, %u shards, "
      "micro batch %lld x %u accumulation, prefetch window %.1f MB, "
      "activations %s\n",
      rank, world, model.spec().name().c_str(),
      static_cast<unsigned long long>(model.num_parameters()),
      client.map().num_groups(), client.map().num_shards(),
      static_cast<long long>(t->micro_batch), accum,
      Mb(t->client.cache.prefetch_bytes),
      t->config.activation_checkpointing ? "recomputed in backward" : "kept");
  std::printf("rank %u: data plane %s%s%s\n", rank, client.transport().c_str(),
              client.transport_lanes().empty() ? "" : " over ",
              client.transport_lanes().c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// Prints what one step did (skips, unscaled overflows) and records it.
void RecordStep(uint32_t rank, int64_t step, double loss, double scale,
                bool overflow, const StepResult& done, const LossScaler& scaler,
                double secs, RunRecord* rec) {
  rec->scales.push_back(scale);
  rec->norms.push_back(std::isnan(done.grad_norm)
                           ? nlohmann::json()
                           : nlohmann::json(done.grad_norm));
  if (done.skipped) {
    rec->skipped_steps.push_back(step);
    std::printf(
        "rank %u step %lld skipped (Inf/NaN in the gradients); loss scale %g "
        "-> %g\n",
        rank, static_cast<long long>(step), scale, scaler.scale());
  } else if (overflow) {
    std::printf(
        "rank %u step %lld: Inf/NaN in the gradients were applied "
        "(no fp16 loss scaling configured)\n",
        rank, static_cast<long long>(step));
  }
  rec->total_seconds += secs;
  rec->step_times.push_back(secs);
  rec->losses.push_back(loss);
  if (step == rec->first_step) rec->first_loss = loss;
  rec->last_loss = loss;
}

// Trains from the cluster's step to t.steps, printing every t.log_every.
// Sets *inject_now while a micro-step of --inject_nonfinite_steps computes.
absl::Status TrainLoop(const TrainerFlags& t, TrainerClient& client,
                       const CharDataset& data, TorchGroupRunner& runner,
                       LossScaler& scaler, bool* inject_now, RunRecord* run) {
  const uint32_t rank = client.rank(), world = client.world_size();
  const uint32_t accum = client.accumulation_steps();
  const int64_t b = t.micro_batch, ctx = t.gpt.context;
  torch::Tensor input = torch::empty({b, ctx}, torch::kInt64);
  torch::Tensor target = torch::empty({b, ctx}, torch::kInt64);
  RunRecord& rec = *run;
  uint64_t prev_fetched = 0, prev_pushed = 0;
  const bool first_part = rec.step_times.empty();
  if (first_part) {
    rec.first_step = static_cast<int64_t>(client.step());
    MarkLoopStart(t, &rec);
  }
  const int64_t part_first = static_cast<int64_t>(client.step());
  for (int64_t step = part_first; step < t.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    const ThreadTimes main_start = CurrentThreadTimes();
    const std::map<std::string, uint64_t> rpcs_start = client.rpc_counts();
    const std::map<std::string, uint64_t> calls_start =
        client.transport_call_counts();
    double loss = 0;
    bool overflow = false;
    const double scale = scaler.scale();
    client.SetTrainerState(TrainerState(client.step(), scaler));
    for (uint32_t micro = 0; micro < accum; ++micro) {
      data.Batch(t.gpt.seed, client.step(), micro, rank, world,
                 static_cast<int>(b), static_cast<int>(ctx),
                 input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      *inject_now = micro == 0 && std::count(t.inject_steps.begin(),
                                             t.inject_steps.end(), step) > 0;
      ZS_ASSIGN_OR_RETURN(MicroStepResult r,
                          runner.TrainMicroStep(client, input, target, micro,
                                                static_cast<float>(scale)));
      loss += r.loss / accum;
      overflow |= r.overflow;
    }
    const auto end_start = std::chrono::steady_clock::now();
    ZS_ASSIGN_OR_RETURN(StepResult done, client.EndStep(overflow, scale));
    rec.end_step_seconds += std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - end_start)
                                .count();
    scaler.Update(done.skipped);
    const ThreadTimes main_end = CurrentThreadTimes();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    RecordStep(rank, step, loss, scale, overflow, done, scaler, secs, &rec);
    rec.step_cpu_times.push_back(ProcessCpuSeconds() - cpu_start);
    RecordMainThread(main_start, main_end, &rec);
    client.ReportStep(loss, static_cast<uint64_t>(b) * accum, secs);
    uint64_t step_rpcs = 0;
    for (const auto& [method, n] : RpcsSince(rpcs_start, client.rpc_counts())) {
      rec.rpcs[method] += n;
      step_rpcs += n;
    }
    rec.step_rpcs.push_back(step_rpcs);
    for (const auto& [method, n] :
         RpcsSince(calls_start, client.transport_call_counts())) {
      rec.transport_calls[method] += n;
    }
    const auto s = client.stats();
    if (t.log_every > 0 &&
        ((step - part_first) % t.log_every == 0 || step + 1 == t.steps)) {
      std::printf(
          "rank %u step %lld loss %.4f tokens/s %.0f fetched %.2f MB "
          "pushed %.2f MB resident %.2f MB\n",
          rank, static_cast<long long>(step), loss,
          static_cast<double>(b * ctx * accum) / secs,
          Mb(s.params.bytes_fetched - prev_fetched),
          Mb(s.grads.bytes_pushed - prev_pushed), Mb(s.params.resident_bytes));
      std::fflush(stdout);
    }
    prev_fetched = s.params.bytes_fetched;
    prev_pushed = s.grads.bytes_pushed;
  }
  return absl::OkStatus();
}

// After a failure mid-run (`why`): joins the cluster again as the same
// process and rank (RejoinCluster) once the old client's traffic stopped,
// and returns the new client when the cluster rolled back; `flags` keeps a
// coordinator that moved. Otherwise `why`, with what the rejoin found.
absl::StatusOr<std::unique_ptr<TrainerClient>> Rejoin(
    TrainerFlags* flags, const GptModel& model,
    std::unique_ptr<TrainerClient> old, const absl::Status& why) {
  // Dropped by the coordinator (stopped or cut off past the timeout): this
  // process does not come back.
  if (absl::Status m = old->membership(); absl::IsFailedPrecondition(m)) {
    return m;
  }
  std::printf(
      "rank %u: %s; joining again (up to %.0f s for a shard replacement)\n",
      old->rank(), std::string(why.message()).c_str(),
      absl::ToDoubleSeconds(flags->rejoin_timeout));
  std::fflush(stdout);
  // Nothing of the old client may land after the new one is admitted.
  old->StopTraffic();
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<TrainerClient> fresh,
      RejoinCluster(
          *old, why, &flags->client, model.spec(),
          [&model](size_t g, float* out) { return model.Init(g, out); },
          flags->rejoin_timeout,
          [](const std::string& line) {
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
          }));
  old->Detach();
  return fresh;
}

// The run's last lines: totals and resident peaks by kind.
void PrintSummary(const TrainerFlags& t, const TrainerClient& client,
                  const GptModel& model, const RunRecord& rec) {
  const uint32_t rank = client.rank();
  const int64_t tokens_per_step =
      t.micro_batch * t.gpt.context * client.accumulation_steps();
  const auto s = client.stats();
  const int64_t trained = std::max<int64_t>(0, t.steps - rec.first_step);
  std::printf(
      "rank %u done: steps %lld..%lld, loss %.4f -> %.4f, %.0f tokens/s, "
      "fetched %.2f MB, pushed %.2f MB, peak resident params %.2f MB "
      "(stage-3 bound %.2f MB, model %.2f MB)\n",
      rank, static_cast<long long>(rec.first_step),
      static_cast<long long>(t.steps), rec.first_loss, rec.last_loss,
      rec.total_seconds > 0
          ? static_cast<double>(tokens_per_step * trained) / rec.total_seconds
          : 0.0,
      Mb(s.params.bytes_fetched), Mb(s.grads.bytes_pushed), Mb(s.param_bytes),
      Mb(s.resident_bound), Mb(model.num_parameters() * sizeof(float)));
  std::printf(
      "rank %u resident peaks by kind (stage %u): params %.2f MB, grads %.2f "
      "MB, "
      "optimizer state %.2f MB, buffers %.2f MB\n",
      rank, t.config.zero_stage, Mb(s.param_bytes), Mb(s.grad_bytes),
      Mb(s.optimizer_bytes), Mb(s.buffer_bytes));
  if (!rec.step_rpcs.empty()) {
    const double steps = static_cast<double>(rec.step_rpcs.size());
    uint64_t total = 0;
    std::string by_method;
    for (const auto& [method, n] : rec.rpcs) {
      total += n;
      absl::StrAppend(&by_method, by_method.empty() ? "" : ", ", method, " ",
                      absl::StrFormat("%.1f", static_cast<double>(n) / steps));
    }
    std::printf(
        "rank %u control RPCs per step: %.1f (%s) for %zu groups x %u "
        "shards\n",
        rank, static_cast<double>(total) / steps, by_method.c_str(),
        client.map().num_groups(), client.map().num_shards());
    std::string calls;
    for (const auto& [method, n] : rec.transport_calls) {
      absl::StrAppend(&calls, calls.empty() ? "" : ", ", method, " ",
                      absl::StrFormat("%.1f", static_cast<double>(n) / steps));
    }
    std::printf("rank %u control calls over the transport per step: %s\n",
                rank, calls.empty() ? "none" : calls.c_str());
  }
  // Shard 0 answers the last reports within their deadline.
  const StepReporter::Counts reports = client.report_counts(absl::Seconds(6));
  std::printf(
      "rank %u step reports: %llu accepted, %llu refused or timed out, %llu "
      "dropped (shard 0 was 8 behind)\n",
      rank, static_cast<unsigned long long>(reports.sent),
      static_cast<unsigned long long>(reports.failed),
      static_cast<unsigned long long>(reports.dropped));
}

// Set (to the core OpenBLAS ran before, or "" when there was none) in the
// environment of a process --blas_core started again.
constexpr char kBlasCoreReplaced[] = "ZSHARD_TRAIN_BLAS_CORE_REPLACED";

// --blas_core: returns OK to go on with the core OpenBLAS runs now; starts
// this process again (never returns) with $OPENBLAS_CORETYPE set when
// another core is wanted (once: the second start goes on with what it got,
// or refuses a named core OpenBLAS did not take); INVALID_ARGUMENT naming the
// flag for a core this CPU or process cannot run; UNAVAILABLE when a named
// core needs a new start that fails (auto then warns and goes on).
// Process-wide: call from main before any computation.
absl::Status ChooseBlasCore(const std::string& want, char** argv) {
  if (want == "keep") return absl::OkStatus();
  const std::string running = OpenBlasCore();
  const std::string cpu = CpuBlasCore();
  const bool restarted = getenv(kBlasCoreReplaced) != nullptr;
  std::string target;
  if (want == "auto") {
    if (restarted) return absl::OkStatus();
    target = AutoBlasCore(running, getenv("OPENBLAS_CORETYPE"), cpu);
  } else {
    if (running.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --blas_core: '", want,
                       "' needs OpenBLAS, which this process does not use"));
    }
    if (strcasecmp(running.c_str(), want.c_str()) == 0) return absl::OkStatus();
    if (BlasCoreTier(want) > BlasCoreTier(cpu)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --blas_core: this CPU cannot run ", want,
                       "'s kernels (the widest it runs: ", cpu, ")"));
    }
    if (restarted) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --blas_core: OpenBLAS has no core '", want,
                       "' (it runs ", running, ")"));
    }
    target = want;
  }
  if (target.empty()) return absl::OkStatus();
  std::cerr << "zshard-train: OpenBLAS runs its " << running
            << " kernels; starting again with OPENBLAS_CORETYPE=" << target
            << (want == "auto" ? " (the widest this CPU runs; "
                                 "--blas_core=keep leaves them)"
                               : "")
            << "\n";
  setenv("OPENBLAS_CORETYPE", target.c_str(), 1);
  setenv(kBlasCoreReplaced, running.c_str(), 1);
  // This binary's own path, not /proc/self/exe: the process's name (ps,
  // pgrep) comes from the file executed.
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len > 0) {
    self[len] = '\0';
    execv(self, argv);
  }
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kBlasCoreReplaced);
  const std::string why =
      absl::StrCat("flag --blas_core: cannot start again with "
                   "OPENBLAS_CORETYPE=", target, ": ", strerror(err));
  if (want != "auto") return absl::UnavailableError(why);
  // auto: the run goes on with the kernels it has.
  std::cerr << "zshard-train: " << why << "; going on with " << running
            << "\n";
  return absl::OkStatus();
}

// Adds what every --stats_json holds (the activation policy, what the
// compute pools were set to, -1: no OpenBLAS in this process; each thread
// name's CPU and context switches during `rec`'s loop) to `j` and writes it
// to --stats_json.
absl::Status WriteJson(const TrainerFlags& t, const RunRecord& rec,
                       nlohmann::json j) {
  j["activation_checkpointing"] = t.config.activation_checkpointing;
  j["torch_threads"] = torch::get_num_threads();
  j["openblas_threads"] = OpenBlasThreads();
  j["blas_core"] = OpenBlasCore();
  j["blas_core_cpu"] = CpuBlasCore();
  const char* replaced = getenv(kBlasCoreReplaced);
  j["blas_core_replaced"] = replaced ? replaced : "";
  // Where the process's CPU went during the training loop, by thread name
  // (the data plane's pools are still alive here).
  j["thread_totals"] = ThreadTotalsSinceStart(rec);
  std::ofstream out(t.stats_json);
  out << j.dump(2) << "\n";
  if (!out) return absl::UnavailableError("cannot write " + t.stats_json);
  return absl::OkStatus();
}

// --stats_json: the run's figures for tests and benches.
absl::Status WriteStatsJson(const TrainerFlags& t, const TrainerClient& client,
                            const GptModel& model, const RunRecord& rec) {
  const auto s = client.stats();
  const int64_t trained = std::max<int64_t>(0, t.steps - rec.first_step);
  nlohmann::json j;
  j["rank"] = client.rank();
  j["transport"] = client.transport();
  j["steps"] = t.steps;
  j["first_loss"] = rec.first_loss;
  j["last_loss"] = rec.last_loss;
  j["bytes_fetched"] = s.params.bytes_fetched;
  j["bytes_from_host"] = s.params.bytes_from_host;
  j["host_misses"] = s.params.host_misses;
  j["bytes_pushed"] = s.grads.bytes_pushed;
  j["stage"] = t.config.zero_stage;
  j["peak_resident_param_bytes"] = s.param_bytes;
  j["peak_resident_grad_bytes"] = s.grad_bytes;
  j["resident_optimizer_bytes"] = s.optimizer_bytes;
  j["peak_resident_buffer_bytes"] = s.buffer_bytes;
  j["step_seconds"] =
      trained > 0 ? rec.total_seconds / static_cast<double>(trained) : 0.0;
  j["bytes_per_step"] =
      trained > 0
          ? static_cast<double>(s.params.bytes_fetched + s.grads.bytes_pushed) /
                static_cast<double>(trained)
          : 0.0;
  j["resident_bound_bytes"] = s.resident_bound;
  j["persistent_param_bytes"] = s.params.persistent_bytes;
  j["prefetch_window_bytes"] = t.client.cache.prefetch_bytes;
  j["model_param_bytes"] = model.num_parameters() * sizeof(float);
  j["groups"] = client.map().num_groups();
  j["prefetch_hits"] = s.params.prefetch_hits;
  j["group_fetches"] = s.params.group_fetches;
  j["skipped_steps"] = rec.skipped_steps;
  j["loss_scales"] = rec.scales;
  j["grad_norms"] = rec.norms;
  j["step_times"] = rec.step_times;
  j["losses"] = rec.losses;
  j["step_cpu_times"] = rec.step_cpu_times;
  j["step_main_cpu_times"] = rec.step_main_cpu_times;
  j["step_main_runqueue_times"] = rec.step_main_runqueue_times;
  // gRPC calls to the shards per step, and per method over the steps.
  j["step_rpcs"] = rec.step_rpcs;
  j["rpcs"] = rec.rpcs;
  j["transport_calls"] = rec.transport_calls;
  j["shards"] = client.map().num_shards();
  // Where a step waits: for parameters in Acquire, for the pushes' and the
  // step's acknowledgements in EndStep (seconds, whole run).
  j["acquire_wait_seconds"] = s.params.acquire_wait_seconds;
  j["end_step_seconds"] = rec.end_step_seconds;
  return WriteJson(t, rec, std::move(j));
}

// --local_world's loop: t.steps steps of rank `rank` of `world` on `local`.
absl::StatusOr<RunRecord> LocalTrainLoop(const TrainerFlags& t,
                                         const CharDataset& data,
                                         TorchGroupRunner& runner,
                                         LocalGroups& local, uint32_t rank,
                                         uint32_t world) {
  const int64_t b = t.micro_batch, ctx = t.gpt.context;
  const uint32_t accum = t.config.gradient_accumulation_steps;
  torch::Tensor input = torch::empty({b, ctx}, torch::kInt64);
  torch::Tensor target = torch::empty({b, ctx}, torch::kInt64);
  RunRecord rec;
  MarkLoopStart(t, &rec);
  for (int64_t step = 0; step < t.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    const ThreadTimes main_start = CurrentThreadTimes();
    double loss = 0;
    for (uint32_t micro = 0; micro < accum; ++micro) {
      data.Batch(t.gpt.seed, static_cast<uint64_t>(step), micro, rank, world,
                 static_cast<int>(b), static_cast<int>(ctx),
                 input.data_ptr<int64_t>(), target.data_ptr<int64_t>());
      ZS_ASSIGN_OR_RETURN(MicroStepResult r,
                          runner.TrainMicroStep(local, input, target, micro));
      loss += r.loss / accum;
    }
    ZS_RETURN_IF_ERROR(local.Step());
    const ThreadTimes main_end = CurrentThreadTimes();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    rec.step_times.push_back(secs);
    rec.step_cpu_times.push_back(ProcessCpuSeconds() - cpu_start);
    RecordMainThread(main_start, main_end, &rec);
    rec.losses.push_back(loss);
    rec.total_seconds += secs;
    if (step == 0) rec.first_loss = loss;
    rec.last_loss = loss;
  }
  return rec;
}

// --local_world: the same model, batches, threads and activation policy as
// a cluster run, trained in this process (LocalGroups) with no
// communication; writes the same step figures to --stats_json.
absl::Status RunLocal(TrainerFlags t) {
  ZS_ASSIGN_OR_RETURN(CharDataset data, CharDataset::Load(t.data));
  t.gpt.vocab = data.vocab_size();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model, GptModel::Create(t.gpt));
  const auto world = static_cast<uint32_t>(t.local_world);
  const auto rank = static_cast<uint32_t>(t.client.cluster.requested_rank);
  ZS_RETURN_IF_ERROR(ResolveBatchSize(&t.config, world));
  if (t.micro_batch == 0) {
    t.micro_batch =
        static_cast<int64_t>(t.config.train_micro_batch_size_per_gpu);
  }
  ZS_RETURN_IF_ERROR(data.CheckShares(world, static_cast<int>(t.gpt.context)));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<LocalGroups> local,
                      LocalGroups::Create(*model, t.config));
  RunnerOptions runner_options;
  runner_options.recompute = t.config.activation_checkpointing;
  TorchGroupRunner runner(model.get(), runner_options);
  ZS_ASSIGN_OR_RETURN(RunRecord rec,
                      LocalTrainLoop(t, data, runner, *local, rank, world));
  std::printf(
      "rank %u/%u local (no servers): %lld steps, loss %.4f -> %.4f, "
      "%.1f ms per step, activations %s\n",
      rank, world, static_cast<long long>(t.steps), rec.first_loss,
      rec.last_loss,
      t.steps > 0 ? 1e3 * rec.total_seconds / static_cast<double>(t.steps) : 0,
      runner_options.recompute ? "recomputed in backward" : "kept");
  if (t.stats_json.empty()) return absl::OkStatus();
  nlohmann::json j;
  j["rank"] = rank;
  j["mode"] = "local";
  j["steps"] = t.steps;
  j["first_loss"] = rec.first_loss;
  j["last_loss"] = rec.last_loss;
  j["step_times"] = rec.step_times;
  j["losses"] = rec.losses;
  j["step_cpu_times"] = rec.step_cpu_times;
  j["step_main_cpu_times"] = rec.step_main_cpu_times;
  j["step_main_runqueue_times"] = rec.step_main_runqueue_times;
  return WriteJson(t, rec, std::move(j));
}

absl::Status Run(TrainerFlags t) {
  ZS_ASSIGN_OR_RETURN(CharDataset data, CharDataset::Load(t.data));
  t.gpt.vocab = data.vocab_size();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model, GptModel::Create(t.gpt));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<TrainerClient> client,
                      TrainerClient::Connect(t.client, model->spec(),
                                             [&model](size_t g, float* out) {
                                               return model->Init(g, out);
                                             }));
  ZS_RETURN_IF_ERROR(CheckAndAnnounce(*client, *model, data, &t));
  RunnerOptions runner_options;
  runner_options.bf16 = t.config.bf16_enabled;
  runner_options.recompute = t.config.activation_checkpointing;
  TorchGroupRunner runner(model.get(), runner_options);
  bool inject_now = false;
  if (!t.inject_steps.empty() && client->rank() == t.inject_rank) {
    runner.set_gradient_hook([&inject_now](size_t g, float* grad, size_t) {
      if (inject_now && g == 0)
        grad[0] = std::numeric_limits<float>::infinity();
    });
  }
  LossScaler scaler(t.config.fp16);
  ZS_RETURN_IF_ERROR(ResumeFromCheckpoint(*client, &scaler));
  RunRecord rec;
  for (;;) {
    absl::Status st =
        TrainLoop(t, *client, data, runner, scaler, &inject_now, &rec);
    if (st.ok()) break;
    if (t.rejoin_timeout <= absl::ZeroDuration()) {
      // Threads still waiting on a silent shard are freed now, not at their
      // deadlines.
      client->StopTraffic();
      return st;
    }
    ZS_ASSIGN_OR_RETURN(client, Rejoin(&t, *model, std::move(client), st));
    ZS_RETURN_IF_ERROR(ResumeFromCheckpoint(*client, &scaler));
  }
  if (!t.dump_params.empty() && client->rank() == 0) {
    ZS_RETURN_IF_ERROR(
        DumpParams(*client, t.dump_params, t.config.bf16_enabled ? 2 : 4));
  }
  PrintSummary(t, *client, *model, rec);
  if (!t.stats_json.empty())
    ZS_RETURN_IF_ERROR(WriteStatsJson(t, *client, *model, rec));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  SetTransportProcessDefaults();  // before any thread or transport
  DisableMutexDeadlockDetection();
  KeepFreedMemoryForReuse();
  Flags f;
  f.Define("coordinator", "", "host:port of shard 0 (required)");
  f.Define("rank", DefaultTrainerRank(ProcessEnv()),
           "this trainer's rank (default $JOB_COMPLETION_INDEX, else "
           "$SLURM_PROCID in a Slurm step, else -1: the coordinator assigns "
           "one)");
  f.Define("steps", "50", "train until the model has had this many steps");
  f.Define("config", "",
           "DeepSpeed-style ds_config.json (same file as the servers)");
  f.Define("data", "/usr/share/common-licenses",
           "comma-separated text files or directories to train on");
  f.Define("micro_batch", "0",
           "sequences per micro-step (0: train_micro_batch_size_per_gpu)");
  f.Define("context", "64", "sequence length");
  f.Define("d_model", "160", "model width");
  f.Define("layers", "4", "transformer blocks");
  f.Define("heads", "4", "attention heads");
  f.Define("seed", "1", "seed of the initial values and the batches");
  f.Define("threads", "1",
           "compute threads: libtorch's intra-op pool and OpenBLAS's");
  f.Define("blas_core", "auto",
           "OpenBLAS's kernels: auto (replace its generic SSE core, chosen "
           "on a CPU model it does not know, by the widest this CPU runs), "
           "keep, or a core name (SkylakeX, Haswell, ...); set by starting "
           "again with OPENBLAS_CORETYPE");
  f.Define("prefetch_bytes", "-1",
           "prefetch window in bytes (-1: 4 x stage3_prefetch_bucket_size)");
  f.Define("rpc_timeout_s", "30", "deadline of every fetch and push");
  f.Define("connect_timeout_s", "60", "how long to wait for the servers");
  f.Define("rejoin_timeout_s", "60",
           "after a failure mid-run, how long to wait for the cluster to "
           "roll back (a shard replaced with zshard-server --replace) and "
           "join it again at the rolled-back step (0: exit at the first "
           "failure)");
  f.Define("transport", "",
           "data plane: ucx or inline; empty: whatever the servers run "
           "(negotiated at join)");
  DefineRpcClientSecurityFlags("auth_token_file", "trainer", &f);
  f.Define("log_every", "1",
           "print a line every N steps (0: only the summary; default: the "
           "config's steps_per_print if given, else 1)");
  f.Define(
      "dump_params", "",
      "rank 0 writes the final parameters here (fp32; bf16 with bf16 enabled)");
  f.Define("stats_json", "", "write this trainer's figures here as JSON");
  f.Define("inject_nonfinite_steps", "",
           "testing: comma-separated steps at which one gradient value becomes "
           "+Inf");
  f.Define("inject_nonfinite_rank", "0", "testing: the rank that injects them");
  f.Define("local_world", "0",
           "N > 0: train alone as rank --rank of N trainers, with no servers "
           "and no communication (the compute floor of tests/bench/"
           "step_bench); 0: train through the servers");
  f.Define("help", "false", "print the flags and exit");
  absl::Status st = f.Parse(argc, argv);
  if (st.ok() && !f.positional().empty()) {
    st = absl::InvalidArgumentError("unexpected argument '" +
                                    f.positional()[0] + "'");
  }
  if (!st.ok()) {
    std::cerr << "zshard-train: " << st.message() << "\n";
    return 2;
  }
  if (f.IsSet("help")) {
    std::cout << "usage: zshard-train --coordinator=HOST:PORT [flags]\n"
              << "       zshard-train --local_world=N --rank=R [flags]\n"
              << f.Usage();
    return 0;
  }
  auto flags = ParseFlags(f);
  if (!flags.ok()) {
    std::cerr << "zshard-train: " << flags.status().message() << "\n";
    return 2;
  }
  // Process-wide: OpenBLAS's kernels (this may start the process again),
  // then every compute pool (libtorch's, OpenBLAS's) to --threads.
  if (absl::Status blas = ChooseBlasCore(flags->blas_core, argv); !blas.ok()) {
    std::cerr << "zshard-train: " << blas.message() << "\n";
    return absl::IsInvalidArgument(blas) ? 2 : 1;
  }
  SetComputeThreads(static_cast<int>(flags->threads));
  st = flags->local_world > 0 ? RunLocal(*flags) : Run(*flags);
  if (!st.ok()) {
    std::cerr << "zshard-train: " << absl::StatusCodeToString(st.code()) << ": "
              << st.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace zshard

int main(int argc, char** argv) { return zshard::Main(argc, argv); }
