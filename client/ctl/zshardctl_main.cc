// zshardctl: operator CLI over RPC. See README.md for the commands.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/ctl/plan.h"
#include "client/ctl/tensor_read.h"
#include "common/base/flags.h"
#include "common/base/grpc_status.h"
#include "common/base/rpc_credentials.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors_export.h"
#include "common/model/model_spec.h"
#include "common/model/partition_map.h"
#include "zshard/v1/admin.grpc.pb.h"
#include "zshard/v1/health.grpc.pb.h"
#include "zshard/v1/trainer.grpc.pb.h"

namespace zshard {
namespace {

struct Ctl {
  std::string server;
  absl::Duration timeout;
  bool json = false;  // status: every shard's GetStatus as a JSON array
  std::shared_ptr<const RpcCredentials> credentials;  // TLS, admin token
};

absl::StatusOr<v1::GetStatusResponse> GetStatus(const Ctl& ctl,
                                                const std::string& endpoint) {
  auto stub = v1::AdminService::NewStub(ctl.credentials->Channel(endpoint));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + ctl.timeout));
  v1::GetStatusResponse resp;
  absl::Status st =
      FromGrpcStatus(stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp));
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(endpoint, ": ", st.message()));
  }
  return resp;
}

// Every shard's status: the given server's, plus the shards it lists; the
// ids of listed shards that did not answer go to `unreachable` (each named
// on stderr).
absl::StatusOr<std::vector<v1::GetStatusResponse>> ClusterStatus(
    const Ctl& ctl, std::vector<uint32_t>* unreachable) {
  ZS_ASSIGN_OR_RETURN(v1::GetStatusResponse first, GetStatus(ctl, ctl.server));
  if (first.shard_id() != 0 && !first.coordinator().empty()) {
    // Any shard leads to the coordinator, which lists every shard.
    auto coordinator = GetStatus(ctl, first.coordinator());
    if (coordinator.ok()) first = *std::move(coordinator);
  }
  std::vector<v1::GetStatusResponse> all(first.num_shards());
  std::vector<bool> have(first.num_shards(), false);
  all[first.shard_id()] = first;
  have[first.shard_id()] = true;
  for (const auto& e : first.shards()) {
    if (e.shard_id() >= all.size() || have[e.shard_id()]) continue;
    auto s = GetStatus(ctl, e.endpoint());
    if (!s.ok()) {
      std::fprintf(stderr, "zshardctl: shard %u unreachable: %s\n",
                   e.shard_id(), std::string(s.status().message()).c_str());
      unreachable->push_back(e.shard_id());
      continue;
    }
    all[e.shard_id()] = *s;
    have[e.shard_id()] = true;
  }
  std::vector<v1::GetStatusResponse> out;
  for (size_t s = 0; s < all.size(); ++s) {
    if (have[s]) out.push_back(all[s]);
  }
  if (out.size() < all.size()) {
    std::fprintf(
        stderr, "zshardctl: %zu of %zu shards answered%s\n", out.size(),
        all.size(),
        first.shard_id() != 0 ? " (ask shard 0 to see every shard)" : "");
  }
  return out;
}

// `shards` as one JSON array of GetStatusResponse (proto3 JSON mapping).
absl::Status PrintJson(const std::vector<v1::GetStatusResponse>& shards) {
  std::string out = "[";
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string one;
    const auto st =
        google::protobuf::util::MessageToJsonString(shards[i], &one, options);
    if (!st.ok()) {
      return absl::InternalError(
          absl::StrCat("status as JSON: ", st.ToString()));
    }
    absl::StrAppend(&out, i ? ",\n" : "", one);
  }
  std::printf("%s]\n", out.c_str());
  return absl::OkStatus();
}

// One line per trainer rank (the coordinator's membership: who holds it,
// since which step, when last seen; the leases every shard holds for it),
// then what happened to the membership.
// In-memory snapshots (zshard_fault_tolerance): one line per shard.
void PrintSnapshots(const std::vector<v1::GetStatusResponse>& shards) {
  const auto& s0 = shards.front().snapshots();
  if (s0.interval_steps() == 0) {
    std::printf("snapshots: off (zshard_fault_tolerance)\n");
    return;
  }
  std::printf("snapshots: every %llu steps at the buddy shard; epoch %llu\n",
              static_cast<unsigned long long>(s0.interval_steps()),
              static_cast<unsigned long long>(s0.epoch()));
  for (const auto& s : shards) {
    const auto& n = s.snapshots();
    std::printf(
        "  shard %u: newest held everywhere step %llu, %llu taken, %llu "
        "failed, %llu skipped (the previous one still in flight), %.2f MB "
        "each, holds %.2f MB of its neighbour's, %.3f s copying, %llu "
        "rollbacks\n",
        s.shard_id(), static_cast<unsigned long long>(n.newest_complete_step()),
        static_cast<unsigned long long>(n.taken()),
        static_cast<unsigned long long>(n.failed()),
        static_cast<unsigned long long>(n.skipped()),
        static_cast<double>(n.bytes()) / 1e6,
        static_cast<double>(n.held_bytes()) / 1e6, n.stage_seconds(),
        static_cast<unsigned long long>(n.rollbacks()));
  }
}

void PrintTrainers(const v1::GetStatusResponse& s0,
                   const std::vector<v1::GetStatusResponse>& shards) {
  auto leases = [&](uint32_t rank, uint64_t* active, uint64_t* expired) {
    for (const auto& s : shards) {
      for (const auto& st : s.trainers()) {
        if (st.rank() == rank) {
          *active += st.active_leases();
          *expired += st.expired_leases();
        }
      }
    }
  };
  for (const auto& m : s0.members()) {
    uint64_t active = 0, expired = 0;
    leases(m.rank(), &active, &expired);
    std::printf(
        "trainer %u: %s:%u, %s, last seen %.1f s ago, leases %llu active, "
        "%llu expired%s\n",
        m.rank(), m.host().c_str(), m.pid(),
        m.admitted()
            ? absl::StrCat("training since step ", m.start_step()).c_str()
            : "joined, not admitted yet",
        m.seconds_since_seen(), static_cast<unsigned long long>(active),
        static_cast<unsigned long long>(expired),
        expired > 0 ? " (trainer gone, stalled, or steps longer than "
                      "--lease_timeout_s?)"
                    : "");
  }
  if (s0.members_size() == 0) std::printf("trainers: none holds a rank\n");
  const int n = s0.membership_events_size();
  for (int i = std::max(0, n - 40); i < n; ++i) {
    const auto& e = s0.membership_events(i);
    const char* kind = e.kind() == v1::MembershipEvent::ADMITTED  ? "admitted"
                       : e.kind() == v1::MembershipEvent::DROPPED ? "dropped"
                       : e.kind() == v1::MembershipEvent::LEFT    ? "left"
                       : e.kind() == v1::MembershipEvent::EXPIRED ? "expired"
                       : e.kind() == v1::MembershipEvent::ROLLED_BACK
                           ? "rolled back"
                           : "changed";
    std::printf("membership: step %llu: trainer %u %s %s%s%s\n",
                static_cast<unsigned long long>(e.step()), e.rank(),
                e.identity().c_str(), kind, e.reason().empty() ? "" : ": ",
                e.reason().c_str());
  }
}

// One line per shard: what its training state takes.
void PrintMemory(const std::vector<v1::GetStatusResponse>& shards) {
  for (const auto& s : shards) {
    const auto& m = s.memory();
    if (m.total_bytes() == 0) continue;
    const double per_param = s.slice_elements()
                                 ? static_cast<double>(m.total_bytes()) /
                                       static_cast<double>(s.slice_elements())
                                 : 0.0;
    std::printf(
        "memory: shard %u: %.2f MB (%.1f B per parameter): state %.2f, "
        "published %.2f, landing %.2f (%u slots, %u at most in use), "
        "accumulators %.2f\n",
        s.shard_id(), static_cast<double>(m.total_bytes()) / 1e6, per_param,
        static_cast<double>(m.state_bytes()) / 1e6,
        static_cast<double>(m.published_bytes()) / 1e6,
        static_cast<double>(m.landing_bytes()) / 1e6, m.landing_slots(),
        m.landing_slots_peak(),
        static_cast<double>(m.accumulator_bytes()) / 1e6);
  }
}

// Prints the cluster's status; UNAVAILABLE naming the shards that did not
// answer (what answered is printed first).
absl::Status Status(const Ctl& ctl) {
  std::vector<uint32_t> unreachable;
  ZS_ASSIGN_OR_RETURN(auto shards, ClusterStatus(ctl, &unreachable));
  const absl::Status missing =
      unreachable.empty()
          ? absl::OkStatus()
          : absl::UnavailableError(absl::StrCat(
                "shard", unreachable.size() > 1 ? "s " : " ",
                absl::StrJoin(unreachable, ", "), " did not answer"));
  if (ctl.json) {
    ZS_RETURN_IF_ERROR(PrintJson(shards));
    return missing;
  }
  const auto& s0 = shards.front();
  std::printf(
      "zshard: %u shards, %u trainers, %u accumulation steps, model %s\n",
      s0.num_shards(), s0.world_size(), s0.gradient_accumulation_steps(),
      s0.registered()
          ? absl::StrCat("registered (spec ", absl::Hex(s0.spec_hash()), ")")
                .c_str()
          : "not registered");
  std::printf("%-5s %-22s %-9s %12s %12s %12s  %s\n", "shard", "endpoint",
              "version", "elements", "fetched MB", "pushed MB", "waiting for");
  for (const auto& s : shards) {
    std::vector<std::string> waits;
    for (const auto& g : s.groups()) {
      if (g.waiting_for_ranks_size() == 0) continue;
      waits.push_back(absl::StrCat("group ", g.group(), " (", g.name(), ") v",
                                   g.version(), ": ranks ",
                                   absl::StrJoin(g.waiting_for_ranks(), ",")));
    }
    const std::string version =
        s.min_version() == s.max_version()
            ? absl::StrCat(s.min_version())
            : absl::StrCat(s.min_version(), "..", s.max_version());
    std::printf("%-5u %-22s %-9s %12llu %12.2f %12.2f  %s\n", s.shard_id(),
                s.endpoint().c_str(), version.c_str(),
                static_cast<unsigned long long>(s.slice_elements()),
                static_cast<double>(s.bytes_fetched()) / 1e6,
                static_cast<double>(s.bytes_pushed()) / 1e6,
                waits.empty() ? "-" : absl::StrJoin(waits, "; ").c_str());
  }
  if (s0.checkpoint().enabled()) {
    const auto& c = s0.checkpoint();
    std::printf(
        "checkpoints: %s%s\n",
        c.has_complete()
            ? absl::StrCat("last complete at step ", c.last_complete_step())
                  .c_str()
            : "none complete yet in this run",
        c.restored()
            ? absl::StrCat("; restored from step ", c.restored_step()).c_str()
            : "");
    for (const auto& s : shards) {
      const auto& w = s.checkpoint();
      if (w.writes_completed() == 0 && w.last_error().empty()) continue;
      std::printf(
          "  shard %u: %llu written, last step %llu: %.2f MB, stall %.4f s, "
          "write %.3f s%s%s\n",
          s.shard_id(), static_cast<unsigned long long>(w.writes_completed()),
          static_cast<unsigned long long>(w.last_written_step()),
          static_cast<double>(w.last_bytes_written()) / 1e6,
          w.last_stall_seconds(), w.last_write_seconds(),
          w.last_error().empty() ? "" : "; last error: ",
          w.last_error().c_str());
    }
  }
  PrintSnapshots(shards);
  PrintMemory(shards);
  std::printf("data plane: %s\n", s0.transport().c_str());
  PrintTrainers(s0, shards);
  return missing;
}

absl::Status Tensors(const Ctl& ctl) {
  auto stub = v1::ShardService::NewStub(ctl.credentials->Channel(ctl.server));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + ctl.timeout));
  v1::GetLayoutResponse layout;
  ZS_RETURN_IF_ERROR(
      FromGrpcStatus(stub->GetLayout(&ctx, v1::GetLayoutRequest(), &layout)));
  if (!layout.registered()) {
    return absl::FailedPreconditionError("no model is registered yet");
  }
  ZS_ASSIGN_OR_RETURN(
      PartitionMap map,
      PartitionMap::Create(layout.spec(), layout.layout().num_shards(),
                           layout.layout().alignment(),
                           layout.layout().persistence_threshold()));
  std::printf(
      "model %s: %zu groups, %llu parameters, %u shards, alignment %llu\n",
      layout.spec().name().c_str(), map.num_groups(),
      static_cast<unsigned long long>(map.total_numel()), map.num_shards(),
      static_cast<unsigned long long>(map.alignment()));
  for (size_t g = 0; g < map.num_groups(); ++g) {
    const auto& group = layout.spec().groups(static_cast<int>(g));
    std::vector<std::string> slices;
    for (uint32_t s = 0; s < map.num_shards(); ++s) {
      slices.push_back(absl::StrCat(map.slice(g, s).size()));
    }
    std::printf("group %zu %s: %llu elements%s, per shard [%s]\n", g,
                group.name().c_str(),
                static_cast<unsigned long long>(map.group_numel(g)),
                map.persistent(g) ? " (persistent)" : "",
                absl::StrJoin(slices, ", ").c_str());
    for (const auto& t : group.tensors()) {
      std::printf("  %-24s [%s] %s%s\n", t.name().c_str(),
                  absl::StrJoin(t.shape(), ", ").c_str(),
                  v1::DType_Name(t.dtype()).c_str(),
                  t.trainable() ? "" : " frozen");
    }
  }
  return absl::OkStatus();
}

// grpc.health.v1.Health/Check for the whole server (empty service name).
// OK only when SERVING; UNAVAILABLE otherwise (unreachable within the
// deadline, not serving, no health service), naming why.
absl::Status Health(const Ctl& ctl) {
  auto stub =
      grpc::health::v1::Health::NewStub(ctl.credentials->Channel(ctl.server));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + ctl.timeout));
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status result =
      stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!result.ok()) {
    return absl::UnavailableError(absl::StrCat(
        ctl.server, ": health check failed: ", result.error_message()));
  }
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(
        absl::StrCat(ctl.server, ": health says ",
                     grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                         resp.status())));
  }
  std::printf("%s: SERVING\n", ctl.server.c_str());
  return absl::OkStatus();
}

// zshardctl tensor NAME: statistics of one tensor's current values
// (tensor_read.h), and the values with --values.
absl::Status Tensor(const Ctl& ctl, const Flags& f, const std::string& name) {
  TensorReadOptions o;
  o.server = ctl.server;
  o.name = name;
  o.timeout = ctl.timeout;
  o.credentials = ctl.credentials;
  if (!f.GetString("range").empty()) {
    ZS_RETURN_IF_ERROR(ParseRange(f.GetString("range"), &o.begin, &o.end));
  }
  const std::string step = f.GetString("step");
  if (step != "latest") {
    ZS_ASSIGN_OR_RETURN(int64_t n, f.GetInt("step", 1, INT64_MAX));
    o.step = static_cast<uint64_t>(n);
  }
  const std::string dtype = f.GetString("dtype");
  if (dtype != "fp32" && dtype != "bf16") {
    return absl::InvalidArgumentError("--dtype: expected fp32 or bf16, got '" +
                                      dtype + "'");
  }
  o.bf16 = dtype == "bf16";
  ZS_ASSIGN_OR_RETURN(bool print_values, f.GetBool("values"));
  ZS_ASSIGN_OR_RETURN(TensorValues t, ReadTensor(o));
  std::printf(
      "tensor %s (group %u, version %llu, %s): shape [%s], elements [%llu, "
      "%llu)\n",
      t.name.c_str(), t.group, static_cast<unsigned long long>(t.version),
      dtype.c_str(), absl::StrJoin(t.shape, ", ").c_str(),
      static_cast<unsigned long long>(t.begin),
      static_cast<unsigned long long>(t.end));
  std::printf("  min %.9g max %.9g mean %.9g norm %.9g nan %llu inf %llu\n",
              t.min, t.max, t.mean, t.norm,
              static_cast<unsigned long long>(t.nan),
              static_cast<unsigned long long>(t.inf));
  if (print_values) {
    for (size_t i = 0; i < t.values.size(); ++i) {
      std::printf("%s%.9g", i % 8 == 0 ? (i ? "\n  " : "  ") : " ",
                  static_cast<double>(t.values[i]));
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// zshardctl top: the status, redrawn every --interval_s until interrupted
// (or --iterations times). An unreachable shard is shown, not fatal.
absl::Status Top(const Ctl& ctl, const Flags& f) {
  ZS_ASSIGN_OR_RETURN(int64_t interval, f.GetInt("interval_s", 1, 3600));
  ZS_ASSIGN_OR_RETURN(int64_t iterations, f.GetInt("iterations", 0, INT64_MAX));
  for (int64_t i = 0; iterations == 0 || i < iterations; ++i) {
    if (i > 0) absl::SleepFor(absl::Seconds(interval));
    std::printf("\033[H\033[2J");  // home, clear
    const std::string now =
        absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone());
    std::printf("zshardctl top: %s every %llds (Ctrl-C to stop), %s\n",
                ctl.server.c_str(), static_cast<long long>(interval),
                now.c_str());
    absl::Status st = Status(ctl);
    if (!st.ok()) {
      std::printf("%s: %s\n", absl::StatusCodeToString(st.code()).c_str(),
                  std::string(st.message()).c_str());
    }
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Checkpoint(const Ctl& ctl) {
  auto stub = v1::AdminService::NewStub(ctl.credentials->Channel(ctl.server));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + ctl.timeout));
  v1::RequestCheckpointResponse resp;
  ZS_RETURN_IF_ERROR(FromGrpcStatus(
      stub->RequestCheckpoint(&ctx, v1::RequestCheckpointRequest(), &resp)));
  std::printf("checkpoint at step %llu complete (%s, %llu bytes written): %s\n",
              static_cast<unsigned long long>(resp.step()),
              resp.base() ? "base" : "delta",
              static_cast<unsigned long long>(resp.bytes_written()),
              resp.directory().c_str());
  return absl::OkStatus();
}

// `zshardctl plan`: client/ctl/plan.h's figures for the flags given.
absl::Status Plan(const Flags& f) {
  PlanInput in;
  if (f.GetString("config").empty()) {
    in.config = DefaultTrainingConfig();
  } else {
    ZS_ASSIGN_OR_RETURN(in.config, LoadTrainingConfig(f.GetString("config")));
  }
  auto count = [&f](const char* name, uint64_t lo,
                    uint64_t hi) -> absl::StatusOr<uint64_t> {
    ZS_ASSIGN_OR_RETURN(int64_t v, f.GetInt(name, static_cast<int64_t>(lo),
                                            static_cast<int64_t>(hi)));
    return static_cast<uint64_t>(v);
  };
  if (!f.IsSet("params")) {
    return absl::InvalidArgumentError(
        "plan: --params (the model's parameter count) is required");
  }
  if (!f.IsSet("link_gbps")) {
    return absl::InvalidArgumentError(
        "plan: --link_gbps (each host's link, Gbit/s) is required");
  }
  ZS_ASSIGN_OR_RETURN(in.params, count("params", 1, uint64_t{1} << 48));
  ZS_ASSIGN_OR_RETURN(uint64_t groups, count("groups", 1, 1 << 20));
  ZS_ASSIGN_OR_RETURN(uint64_t trainers, count("trainers", 1, 1 << 20));
  ZS_ASSIGN_OR_RETURN(uint64_t shards, count("shards", 1, 1 << 16));
  ZS_ASSIGN_OR_RETURN(uint64_t tph, count("trainers_per_host", 1, 1 << 20));
  ZS_ASSIGN_OR_RETURN(uint64_t sph, count("shards_per_host", 1, 1 << 16));
  ZS_ASSIGN_OR_RETURN(uint64_t slots, count("landing_slots", 2, 1 << 16));
  in.groups = static_cast<uint32_t>(groups);
  in.trainers = static_cast<uint32_t>(trainers);
  in.shards = static_cast<uint32_t>(shards);
  in.trainers_per_host = static_cast<uint32_t>(tph);
  in.shards_per_host = static_cast<uint32_t>(sph);
  in.landing_slots = static_cast<uint32_t>(slots);
  ZS_ASSIGN_OR_RETURN(in.link_gbps, f.GetDouble("link_gbps"));
  ZS_ASSIGN_OR_RETURN(in.compute_ms, f.GetDouble("compute_ms"));
  ZS_ASSIGN_OR_RETURN(bool json, f.GetBool("json"));
  ZS_ASSIGN_OR_RETURN(std::vector<StagePlan> plans, PlanStages(in));
  std::cout << (json ? PlansJson(plans) : FormatPlans(in, plans));
  return absl::OkStatus();
}

absl::Status Export(const Flags& f) {
  SafetensorsExportOptions o;
  o.checkpoint_dir = f.GetString("checkpoint_dir");
  o.out_path = f.GetString("out");
  if (o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "flag --checkpoint_dir: required for export");
  }
  if (o.out_path.empty())
    return absl::InvalidArgumentError("flag --out: required for export");
  if (f.GetString("format") != "safetensors") {
    return absl::InvalidArgumentError(
        "flag --format: only 'safetensors' is supported, got '" +
        f.GetString("format") + "'");
  }
  const std::string dtype = f.GetString("dtype");
  if (dtype != "fp32" && dtype != "bf16") {
    return absl::InvalidArgumentError(
        "flag --dtype: expected fp32 or bf16, got '" + dtype + "'");
  }
  o.bf16 = dtype == "bf16";
  const std::string step = f.GetString("step");
  if (step != "latest") {
    ZS_ASSIGN_OR_RETURN(int64_t s, f.GetInt("step", 0, INT64_MAX));
    o.step = static_cast<uint64_t>(s);
  }
  ZS_ASSIGN_OR_RETURN(SafetensorsExportResult r, ExportSafetensors(o));
  std::printf("exported step %llu: %llu tensors, %llu bytes (%s) to %s\n",
              static_cast<unsigned long long>(r.step),
              static_cast<unsigned long long>(r.tensors),
              static_cast<unsigned long long>(r.bytes), dtype.c_str(),
              o.out_path.c_str());
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags f;
  f.Define("server", "",
           "host:port of a shard (shard 0 sees the whole cluster)");
  f.Define("timeout_s", "10", "deadline of each RPC");
  f.Define("json", "false",
           "status: print every shard's status as a JSON array instead");
  f.Define("checkpoint_dir", "", "export: the checkpoint directory");
  f.Define("step", "latest",
           "export: step to export, or 'latest' (newest intact)");
  f.Define("format", "safetensors", "export: output format (safetensors)");
  f.Define("dtype", "fp32", "export: fp32 or bf16");
  f.Define("out", "", "export: output file");
  DefineRpcClientSecurityFlags("admin_token_file", "admin", &f);
  f.Define("range", "",
           "tensor: element range A:B of the tensor's flat values (default: "
           "all)");
  f.Define("values", "false", "tensor: also print the values");
  f.Define("interval_s", "2", "top: seconds between refreshes");
  f.Define("iterations", "0",
           "top: refreshes before exiting (0: until Ctrl-C)");
  f.Define("config", "", "plan: the ds_config.json (default: {})");
  f.Define("params", "0", "plan: the model's parameters (elements)");
  f.Define("groups", "1",
           "plan: its fetch groups (blocks + embedding + head), taken as "
           "equal");
  f.Define("trainers", "1", "plan: trainer processes");
  f.Define("shards", "1", "plan: shard servers");
  f.Define("trainers_per_host", "1", "plan: trainers sharing a host's link");
  f.Define("shards_per_host", "1", "plan: shards sharing a host's link");
  f.Define("link_gbps", "0", "plan: each host's link rate, Gbit/s each way");
  f.Define("compute_ms", "0",
           "plan: the step's computation alone (a --local_world run's), "
           "added to the communication for a step time");
  f.Define("landing_slots", "8", "plan: the servers' --landing_slots");
  f.Define("help", "false", "print usage and exit");
  absl::Status st = f.Parse(argc, argv);
  const std::string usage =
      "usage: zshardctl <status|top|tensors|tensor NAME|checkpoint|health> "
      "--server=HOST:PORT "
      "[--timeout_s=N] [--json]\n"
      "                 [--tls_ca=PEM [--tls_cert=PEM --tls_key=PEM]] "
      "[--admin_token_file=FILE]\n"
      "       zshardctl export --checkpoint_dir=DIR --out=FILE "
      "[--step=latest|N]\n"
      "                        [--format=safetensors] [--dtype=fp32|bf16]\n"
      "       zshardctl plan --params=N --link_gbps=X [--config=ds.json] "
      "[--groups=G]\n"
      "                      [--trainers=T] [--shards=S] "
      "[--trainers_per_host=N] [--shards_per_host=N]\n"
      "                      [--compute_ms=MS] [--landing_slots=N] [--json]\n"
      "  status      every shard's version, slice, traffic, checkpoints, and "
      "what a step waits for\n"
      "  top         status, redrawn every --interval_s\n"
      "  tensors     the registered model's groups, tensors and per-shard "
      "slices\n"
      "  tensor NAME [--range=A:B] [--step=N] [--dtype=fp32|bf16] [--values]\n"
      "              statistics (and values) of one tensor, read from the "
      "shards\n"
      "  checkpoint  take a checkpoint at the next step boundary and wait for "
      "it\n"
      "  health      exit 0 when the server's grpc.health.v1 says SERVING, "
      "1 otherwise\n"
      "  export      write a checkpoint's consolidated weights as one "
      "safetensors file\n"
      "  plan        per ZeRO stage: memory per trainer and per server, "
      "bytes and seconds of\n"
      "              communication per step (no server needed)\n";
  if (st.ok() && f.IsSet("help")) {
    std::cout << usage << f.Usage();
    return 0;
  }
  const size_t want_args =
      !f.positional().empty() && f.positional()[0] == "tensor" ? 2 : 1;
  if (st.ok() && f.positional().size() != want_args) {
    st = absl::InvalidArgumentError(
        want_args == 2
            ? "tensor: expected one tensor name (zshardctl tensors lists them)"
            : "expected one command (status, top, tensors, tensor, "
              "checkpoint, health, export or plan)");
  }
  // The commands that need no server.
  if (st.ok() &&
      (f.positional()[0] == "plan" || f.positional()[0] == "export")) {
    st = f.positional()[0] == "plan" ? Plan(f) : Export(f);
    if (!st.ok()) {
      std::cerr << "zshardctl: " << absl::StatusCodeToString(st.code()) << ": "
                << st.message() << "\n";
      return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return 0;
  }
  if (st.ok() && f.GetString("server").empty()) {
    st = absl::InvalidArgumentError("flag --server: required (host:port)");
  }
  auto timeout = f.GetInt("timeout_s", 1, 3600);
  if (st.ok() && !timeout.ok()) st = timeout.status();
  auto json = f.GetBool("json");
  if (st.ok() && !json.ok()) st = json.status();
  auto credentials =
      RpcCredentials::Load(RpcClientSecurityFromFlags("admin_token_file", f));
  if (st.ok() && !credentials.ok()) st = credentials.status();
  if (!st.ok()) {
    std::cerr << "zshardctl: " << st.message() << "\n" << usage;
    return 2;
  }
  Ctl ctl{f.GetString("server"), absl::Seconds(*timeout), *json, *credentials};
  const std::string& cmd = f.positional()[0];
  if (cmd == "status") {
    st = Status(ctl);
  } else if (cmd == "tensors") {
    st = Tensors(ctl);
  } else if (cmd == "tensor") {
    st = Tensor(ctl, f, f.positional()[1]);
  } else if (cmd == "top") {
    st = Top(ctl, f);
  } else if (cmd == "checkpoint") {
    st = Checkpoint(ctl);
  } else if (cmd == "health") {
    st = Health(ctl);
  } else {
    std::cerr << "zshardctl: unknown command '" << cmd << "'\n" << usage;
    return 2;
  }
  if (!st.ok()) {
    std::cerr << "zshardctl: " << absl::StatusCodeToString(st.code()) << ": "
              << st.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace zshard

int main(int argc, char** argv) { return zshard::Main(argc, argv); }
