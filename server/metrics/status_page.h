// Shard 0's status page: one HTML document (no external resources) whose
// script polls /status.json every 2 s and renders the shards, the trainers,
// the step progress and who it waits for, the checkpoints, and the loss and
// throughput curves (SVG) from the trainers' step reports. StatusJson builds
// what it polls.
#ifndef ZSHARD_SERVER_METRICS_STATUS_PAGE_H_
#define ZSHARD_SERVER_METRICS_STATUS_PAGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/metrics/step_history.h"
#include "zshard/v1/admin.pb.h"

namespace zshard {

// The page (static).
const std::string& StatusPageHtml();

// One shard as shard 0 sees it: its status, or why it did not answer.
struct ShardView {
  uint32_t shard_id = 0;
  std::string endpoint;
  absl::StatusOr<v1::GetStatusResponse> status;
};

// {"nowUnixMs", "shards": [GetStatus as proto3 JSON, or {"shardId",
// "endpoint", "unreachable"}], "history": [[step, unixMs, loss, samples,
// stepSeconds, ranks], ...]}.
std::string StatusJson(const std::vector<ShardView>& shards,
                       const std::vector<StepPoint>& history, absl::Time now);

}  // namespace zshard

#endif  // ZSHARD_SERVER_METRICS_STATUS_PAGE_H_
