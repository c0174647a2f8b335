// CheckpointReader: reads one complete checkpoint (DESIGN.md, "Checkpoints")
// for restore and export, onto any number of shards: Read() returns any
// element range of any group's master weights or AdamW moments by decoding
// only the chunks that overlap it, whichever old shard wrote them.
//
// Memory: the manifests plus one decoded chunk per old shard (and, while a
// delta chunk is decoded, its base chunk). Not thread-safe (the chunk cache);
// use one reader per thread.
#ifndef ZSHARD_COMMON_CHECKPOINT_CHECKPOINT_READER_H_
#define ZSHARD_COMMON_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/manifest.h"
#include "zshard/v1/model.pb.h"

namespace zshard {

class CheckpointReader {
 public:
  // Opens the checkpoint of `step` under `root`: the global manifest, the
  // model spec and every shard manifest, each checked against its checksum.
  // NOT_FOUND when step-N has no global manifest (never completed); DATA_LOSS
  // naming the file that is corrupt or truncated.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& root, uint64_t step);

  // Reads every data file the checkpoint uses, whole, against its recorded
  // size and CRC. DATA_LOSS naming the first bad file.
  absl::Status VerifyDataFiles() const;

  const GlobalManifest& global() const { return global_; }
  const v1::ModelSpec& spec() const { return spec_; }
  const std::vector<ShardManifest>& shards() const { return shards_; }
  uint64_t step() const { return global_.step; }
  // Optimizer updates applied to `group` (AdamW's step count); 0 when no
  // shard owns any of it.
  uint64_t applied(uint32_t group) const;

  // Fills out[0 .. end-begin) with elements [begin, end) of `group`'s
  // `array`. INVALID_ARGUMENT when the range is outside the group; DATA_LOSS
  // naming the file when a chunk fails its checksum or does not decode.
  absl::Status Read(uint32_t group, StateArray array, uint64_t begin,
                    uint64_t end, float* out);

  // Bytes of encoded chunks read so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  CheckpointReader() = default;
  std::string DataPath(uint64_t file_step, uint32_t shard) const;
  // Decodes `e` of `shard` into the shard's cache slot.
  absl::Status Load(uint32_t shard, const ChunkEntry& e);
  absl::StatusOr<const ShardManifest*> BaseManifest(uint32_t shard,
                                                    uint64_t base_step);
  absl::StatusOr<std::vector<float>> DecodeEntry(uint32_t shard,
                                                 const ChunkEntry& e,
                                                 const float* base);

  std::string root_;
  GlobalManifest global_;
  v1::ModelSpec spec_;
  std::vector<ShardManifest> shards_;
  // (group, array) -> (shard, index into that shard's chunks), sorted by begin.
  std::map<std::pair<uint32_t, uint32_t>,
           std::vector<std::pair<uint32_t, size_t>>>
      index_;
  std::map<std::pair<uint32_t, uint64_t>, std::unique_ptr<ShardManifest>>
      bases_;
  struct Cached {
    bool valid = false;
    uint32_t group = 0;
    StateArray array = StateArray::kMaster;
    uint64_t begin = 0;
    std::vector<float> values;
  };
  std::vector<Cached> cache_;  // one per old shard
  uint64_t bytes_read_ = 0;
};

// The newest checkpoint under `root` that opens and whose data files verify,
// at or below `max_step` (UINT64_MAX: any). Each newer one refused is
// described in `refused` (file and reason). NOT_FOUND when none qualifies.
absl::StatusOr<uint64_t> FindRestorableCheckpoint(
    const std::string& root, uint64_t max_step,
    std::vector<std::string>* refused);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CHECKPOINT_CHECKPOINT_READER_H_
