// What a checkpoint directory holds and how its manifests are written
// (DESIGN.md, "Checkpoints"). Layout under the checkpoint root:
//
//   step-00000040/shard-00002.data           chunks shard 2 encoded at step 40
//   step-00000040/shard-00002.manifest.json  shard 2's manifest (its last file)
//   step-00000040/model_spec.pb              the model spec (shard 0)
//   step-00000040/MANIFEST.json              global manifest: written last, by
//                                            shard 0, once every shard committed
//
// A shard manifest lists every chunk of the shard's state at that step; a
// chunk that did not change since the shard's previous checkpoint points into
// that earlier step's data file. Delta chunks are encoded against the same
// chunk of the chain's base. Manifests are JSON carrying their own CRC-32C.
// Plain data and pure functions; thread-compatible.
#ifndef ZSHARD_COMMON_CHECKPOINT_MANIFEST_H_
#define ZSHARD_COMMON_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zshard {

// The three fp32 arrays a shard owns per group.
enum class StateArray : uint32_t { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };
constexpr int kNumStateArrays = 3;
const char* StateArrayName(StateArray a);

struct ChunkEntry {
  uint32_t group = 0;
  StateArray array = StateArray::kMaster;
  uint64_t begin = 0;  // global element offset within the group's flat vector
  uint64_t count = 0;
  uint64_t file_step = 0;  // data file: step-<file_step>/shard-<id>.data
  uint64_t offset = 0;     // byte range in that file
  uint64_t length = 0;
  uint32_t crc = 0;             // of the encoded bytes
  bool against_base = false;    // XOR against the base checkpoint's chunk
};

struct GroupRecord {
  uint32_t group = 0;
  uint64_t begin = 0, end = 0;  // the shard's slice
  uint64_t version = 0;
  uint64_t applied = 0;  // optimizer updates applied (AdamW's step)
};

struct DataFileRecord {
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct ShardManifest {
  uint64_t step = 0;
  uint64_t base_step = 0;  // == step for a base
  uint32_t shard_id = 0;
  uint32_t num_shards = 0;
  uint64_t chunk_elements = 0;
  std::vector<GroupRecord> groups;
  std::vector<ChunkEntry> chunks;
  // Every data file the chunks point into, by step.
  std::map<uint64_t, DataFileRecord> files;
  // Opaque per-trainer resume state (data position, loss scale), by rank.
  std::map<uint32_t, std::string> trainer_states;
  // Whether the step before this checkpoint was skipped (fp16 overflow): the
  // trainers' loss scalers resume from their states plus this outcome.
  bool last_step_skipped = false;
  // Bytes this checkpoint wrote (its own data file).
  uint64_t bytes_written = 0;
};

// One membership change (a trainer admitted, dropped, left, expired, or
// rolled back), as the coordinator's history records it.
struct MembershipRecord {
  std::string kind;  // "ADMITTED", "DROPPED", "LEFT", "EXPIRED", "ROLLED_BACK"
  uint32_t rank = 0;
  std::string identity;  // host:pid (instance ...)
  uint64_t step = 0;
  std::string reason;
  double unix_seconds = 0;
};

struct GlobalManifest {
  uint64_t step = 0;
  uint64_t base_step = 0;
  uint32_t num_shards = 0;
  uint32_t world_size = 0;
  uint32_t accumulation_steps = 0;
  uint64_t alignment = 0;
  uint64_t persistence_threshold = 0;
  uint64_t spec_hash = 0;
  uint64_t config_hash = 0;
  uint32_t spec_crc = 0;  // of model_spec.pb
  std::vector<uint32_t> shard_manifest_crcs;  // file CRC, by shard
  std::map<uint32_t, std::string> trainer_states;
  bool last_step_skipped = false;
  uint64_t bytes_written = 0;  // over all shards
  // The coordinator's membership history up to this checkpoint (oldest
  // first; the last 256 changes): with the same history a run gives the same
  // bits. Absent in older manifests.
  std::vector<MembershipRecord> membership_history;
};

std::string StepDirName(uint64_t step);  // "step-00000040"
std::string ShardDataName(uint32_t shard);      // "shard-00002.data"
std::string ShardManifestName(uint32_t shard);  // "shard-00002.manifest.json"
constexpr const char kGlobalManifestName[] = "MANIFEST.json";
constexpr const char kSpecFileName[] = "model_spec.pb";

std::string SerializeShardManifest(const ShardManifest& m);
// DATA_LOSS naming `what` when the text is not an intact manifest.
absl::StatusOr<ShardManifest> ParseShardManifest(const std::string& text,
                                                 const std::string& what);
std::string SerializeGlobalManifest(const GlobalManifest& m);
absl::StatusOr<GlobalManifest> ParseGlobalManifest(const std::string& text,
                                                   const std::string& what);

// Steps of the step-* directories under `root`, ascending (complete or not).
absl::StatusOr<std::vector<uint64_t>> ListCheckpointSteps(const std::string& root);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CHECKPOINT_MANIFEST_H_
