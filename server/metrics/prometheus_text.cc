#include "server/metrics/prometheus_text.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zshard {
namespace {

std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Writes families: HELP and TYPE once, then samples.
class Writer {
 public:
  explicit Writer(uint32_t shard) : shard_(absl::StrCat(shard)) {}

  void Family(const std::string& name, const std::string& type,
              const std::string& help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  }
  // `labels`: pairs of name and value after the shard label.
  void Sample(
      const std::string& name, double value,
      const std::vector<std::pair<std::string, std::string>>& labels = {}) {
    absl::StrAppend(&out_, name, "{shard=\"", shard_, "\"");
    for (const auto& [k, v] : labels) {
      absl::StrAppend(&out_, ",", k, "=\"", Escape(v), "\"");
    }
    absl::StrAppend(&out_, "} ", Number(value), "\n");
  }
  void One(const std::string& name, const std::string& type,
           const std::string& help, double value) {
    Family(name, type, help);
    Sample(name, value);
  }
  std::string Take() { return std::move(out_); }

 private:
  const std::string shard_;
  std::string out_;
};

void Progress(const v1::GetStatusResponse& s, Writer& w) {
  const v1::ShardTimings& t = s.timings();
  w.One("zshard_steps_total", "counter",
        "Steps this shard has applied (its groups' lowest version).",
        static_cast<double>(s.min_version()));
  w.Family("zshard_step_seconds", "summary",
           "Step period on this shard: time between successive versions of "
           "its first group.");
  w.Sample("zshard_step_seconds_sum", t.step_seconds_sum());
  w.Sample("zshard_step_seconds_count", static_cast<double>(t.steps_timed()));
  w.One("zshard_last_step_seconds", "gauge", "The last step period.",
        t.last_step_seconds());
  w.Family("zshard_group_version", "gauge",
           "Published version of each group this shard owns a slice of.");
  for (const auto& g : s.groups()) {
    if (g.slice_end() == g.slice_begin()) continue;
    w.Sample("zshard_group_version", static_cast<double>(g.version()),
             {{"group", absl::StrCat(g.group())}, {"name", g.name()}});
  }
  w.Family("zshard_contributions_received", "gauge",
           "Gradient contributions received for each group's step in "
           "progress.");
  for (const auto& g : s.groups()) {
    if (g.slice_end() == g.slice_begin()) continue;
    w.Sample("zshard_contributions_received",
             static_cast<double>(g.contributions_received()),
             {{"group", absl::StrCat(g.group())}});
  }
  w.Family("zshard_contributions_waiting", "gauge",
           "Trainer ranks each group's step in progress still waits for.");
  for (const auto& g : s.groups()) {
    if (g.slice_end() == g.slice_begin()) continue;
    w.Sample("zshard_contributions_waiting",
             static_cast<double>(g.waiting_for_ranks_size()),
             {{"group", absl::StrCat(g.group())}});
  }
}

void Trainers(const v1::GetStatusResponse& s, Writer& w) {
  w.One("zshard_trainers", "gauge", "Trainers that joined this shard.",
        s.trainers_size());
  w.Family("zshard_trainer_last_seen_timestamp_seconds", "gauge",
           "When this shard last heard from each trainer (Unix time).");
  for (const auto& t : s.trainers()) {
    w.Sample(
        "zshard_trainer_last_seen_timestamp_seconds",
        static_cast<double>(t.last_seen_unix_ms()) / 1000,
        {{"rank", absl::StrCat(t.rank())}, {"trainer_id", t.trainer_id()}});
  }
  w.Family("zshard_trainer_fetched_bytes_total", "counter",
           "Parameter bytes each trainer fetched from this shard.");
  for (const auto& t : s.trainers()) {
    w.Sample("zshard_trainer_fetched_bytes_total",
             static_cast<double>(t.bytes_fetched()),
             {{"rank", absl::StrCat(t.rank())}});
  }
  w.Family("zshard_trainer_pushed_bytes_total", "counter",
           "Gradient bytes each trainer pushed to this shard.");
  for (const auto& t : s.trainers()) {
    w.Sample("zshard_trainer_pushed_bytes_total",
             static_cast<double>(t.bytes_pushed()),
             {{"rank", absl::StrCat(t.rank())}});
  }
  w.Family("zshard_leases", "gauge",
           "Data plane leases per trainer: active, and ended by their "
           "deadline (expired).");
  for (const auto& t : s.trainers()) {
    const std::string rank = absl::StrCat(t.rank());
    w.Sample("zshard_leases", static_cast<double>(t.active_leases()),
             {{"rank", rank}, {"state", "active"}});
    w.Sample("zshard_leases", static_cast<double>(t.expired_leases()),
             {{"rank", rank}, {"state", "expired"}});
  }
  w.One("zshard_fetched_bytes_total", "counter",
        "Parameter bytes all trainers fetched from this shard.",
        static_cast<double>(s.bytes_fetched()));
  w.One("zshard_pushed_bytes_total", "counter",
        "Gradient bytes all trainers pushed to this shard.",
        static_cast<double>(s.bytes_pushed()));
}

void Checkpoints(const v1::CheckpointStatus& c, Writer& w) {
  w.One("zshard_checkpoint_writes_total", "counter",
        "Checkpoint writes this shard finished.",
        static_cast<double>(c.writes_completed()));
  w.One("zshard_checkpoint_last_step", "gauge",
        "Step of this shard's last checkpoint write.",
        static_cast<double>(c.last_written_step()));
  w.One("zshard_checkpoint_last_written_bytes", "gauge",
        "Bytes of this shard's last checkpoint write.",
        static_cast<double>(c.last_bytes_written()));
  w.One("zshard_checkpoint_last_stall_seconds", "gauge",
        "How long the last checkpoint held the training path.",
        c.last_stall_seconds());
  w.One("zshard_checkpoint_last_duration_seconds", "gauge",
        "How long the last checkpoint write took.", c.last_write_seconds());
  w.Family("zshard_checkpoint_last_error", "gauge",
           "1 with the message when the last checkpoint write failed, else "
           "0.");
  if (c.last_error().empty()) {
    w.Sample("zshard_checkpoint_last_error", 0);
  } else {
    w.Sample("zshard_checkpoint_last_error", 1, {{"error", c.last_error()}});
  }
  if (c.has_complete()) {
    w.One("zshard_checkpoint_last_complete_step", "gauge",
          "Newest complete checkpoint (coordinator).",
          static_cast<double>(c.last_complete_step()));
  }
}

void Engine(const v1::GetStatusResponse& s, Writer& w) {
  const v1::ShardTimings& t = s.timings();
  w.One("zshard_optimizer_seconds_total", "counter",
        "Time the optimizer (AdamW on this shard's slices) took.",
        t.optimizer_seconds());
  w.One("zshard_optimizer_updates_total", "counter",
        "Group updates the optimizer ran.",
        static_cast<double>(t.optimizer_updates()));
  w.One("zshard_reduce_seconds_total", "counter",
        "Time folding gradient contributions took.", t.reduce_seconds());
  const v1::ShardMemory& m = s.memory();
  w.Family("zshard_memory_bytes", "gauge",
           "Training state memory by kind, as the store accounts it.");
  w.Sample("zshard_memory_bytes", static_cast<double>(m.state_bytes()),
           {{"kind", "state"}});
  w.Sample("zshard_memory_bytes", static_cast<double>(m.published_bytes()),
           {{"kind", "published"}});
  w.Sample("zshard_memory_bytes", static_cast<double>(m.landing_bytes()),
           {{"kind", "landing"}});
  w.Sample("zshard_memory_bytes", static_cast<double>(m.accumulator_bytes()),
           {{"kind", "accumulators"}});
}

void Reports(const StepHistory& h, Writer& w) {
  const std::vector<StepPoint> points = h.Points();
  w.One("zshard_step_reports_total", "counter",
        "Step reports the trainers sent (one per trainer and step).",
        static_cast<double>(h.reports()));
  if (points.empty()) return;
  const StepPoint& last = points.back();
  w.One("zshard_reported_step", "gauge", "The newest step a trainer reported.",
        static_cast<double>(last.step));
  w.One("zshard_loss", "gauge",
        "Mean training loss the trainers reported for the newest step.",
        last.loss);
  w.One("zshard_reported_step_seconds", "gauge",
        "The slowest trainer's wall time of the newest step.",
        last.step_seconds);
  w.One("zshard_reported_step_rpcs", "gauge",
        "The most gRPC calls one trainer made to the shards in the newest "
        "step.",
        static_cast<double>(last.rpcs));
}

}  // namespace

ProcessUsage ReadProcessUsage() {
  ProcessUsage u;
  const long page = sysconf(_SC_PAGESIZE);
  const long ticks = sysconf(_SC_CLK_TCK);
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (statm >> size >> resident) u.resident_bytes = resident * page;
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command (which may hold spaces) start at ") ".
    const size_t close = line.rfind(')');
    if (close != std::string::npos) {
      std::vector<std::string> f = absl::StrSplit(line.substr(close + 2), ' ');
      // utime, stime are fields 14 and 15 (1-based), 11 and 12 here.
      if (f.size() > 19 && ticks > 0) {
        u.cpu_seconds =
            (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(ticks);
        std::ifstream uptime_file("/proc/uptime");
        double uptime = 0;
        if (uptime_file >> uptime) {
          const double started_after_boot =
              std::stod(f[19]) / static_cast<double>(ticks);
          u.start_time_seconds =
              static_cast<double>(time(nullptr)) - uptime + started_after_boot;
        }
      }
    }
  }
  return u;
}

std::string PrometheusText(const v1::GetStatusResponse& status,
                           const StepHistory* history,
                           const ProcessUsage& process) {
  Writer w(status.shard_id());
  w.Family("zshard_shard_info", "gauge", "This shard; the value is 1.");
  w.Sample("zshard_shard_info", 1,
           {{"num_shards", absl::StrCat(status.num_shards())},
            {"transport", status.transport()},
            {"endpoint", status.endpoint()}});
  w.One("zshard_registered", "gauge", "1 once a model is registered.",
        status.registered() ? 1 : 0);
  w.One("zshard_slice_elements", "gauge",
        "Parameters this shard owns (elements of all its slices).",
        static_cast<double>(status.slice_elements()));
  Progress(status, w);
  Trainers(status, w);
  Checkpoints(status.checkpoint(), w);
  Engine(status, w);
  if (history) Reports(*history, w);
  w.One("process_resident_memory_bytes", "gauge", "Resident memory size.",
        static_cast<double>(process.resident_bytes));
  w.One("process_cpu_seconds_total", "counter",
        "User and system CPU time spent.", process.cpu_seconds);
  w.One("process_start_time_seconds", "gauge",
        "Start time of the process since the Unix epoch.",
        process.start_time_seconds);
  return w.Take();
}

}  // namespace zshard
