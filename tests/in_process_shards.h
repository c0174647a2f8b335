// Unit-test helper: a cluster of real shard servers inside the test process,
// on 127.0.0.1 with port 0.
#ifndef ZSHARD_TESTS_IN_PROCESS_SHARDS_H_
#define ZSHARD_TESTS_IN_PROCESS_SHARDS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/shard_server.h"

namespace zshard {
namespace testing {

// Starts `shards` ShardServers from `base`, shard 0 first and the others
// announcing themselves to it; shard ids, the shard count and the
// coordinator are filled in. The first error, naming the shard.
inline absl::StatusOr<std::vector<std::unique_ptr<ShardServer>>> StartShards(
    ShardServerOptions base, uint32_t shards) {
  std::vector<std::unique_ptr<ShardServer>> out;
  for (uint32_t s = 0; s < shards; ++s) {
    ShardServerOptions o = base;
    o.service.store.shard_id = s;
    o.service.store.num_shards = shards;
    if (s > 0) o.coordinator = out[0]->endpoint();
    auto server = ShardServer::Start(o);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("shard ", s, ": ", server.status().message()));
    }
    out.push_back(std::move(*server));
  }
  return out;
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_IN_PROCESS_SHARDS_H_
