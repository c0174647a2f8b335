// A shard's metrics in the Prometheus text exposition format (0.0.4):
// rendered from its GetStatus answer (one source of truth with zshardctl
// status), the process's resource use and, on shard 0, the trainers' step
// reports. Names follow Prometheus conventions (zshard_ prefix, base units,
// _total for counters, _seconds, _bytes); every series has a shard label.
#ifndef ZSHARD_SERVER_METRICS_PROMETHEUS_TEXT_H_
#define ZSHARD_SERVER_METRICS_PROMETHEUS_TEXT_H_

#include <cstdint>
#include <string>

#include "server/metrics/step_history.h"
#include "zshard/v1/admin.pb.h"

namespace zshard {

struct ProcessUsage {
  uint64_t resident_bytes = 0;
  double cpu_seconds = 0;
  double start_time_seconds = 0;  // since the epoch
};
// This process's, from /proc/self (zeros where unreadable).
ProcessUsage ReadProcessUsage();

// `history` is null on shards other than 0.
std::string PrometheusText(const v1::GetStatusResponse& status,
                           const StepHistory* history,
                           const ProcessUsage& process);

}  // namespace zshard

#endif  // ZSHARD_SERVER_METRICS_PROMETHEUS_TEXT_H_
