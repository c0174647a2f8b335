// Streams a checkpoint's consolidated weights into one safetensors file
// (https://huggingface.co/docs/safetensors: 8-byte little-endian header
// length, JSON header of dtype/shape/data_offsets per tensor, then the data),
// in the model spec's tensor order. Memory: one decoded chunk per shard that
// wrote the checkpoint plus one piece of output; never the whole model.
// Blocks on the filesystem; thread-compatible.
#ifndef ZSHARD_COMMON_CHECKPOINT_SAFETENSORS_EXPORT_H_
#define ZSHARD_COMMON_CHECKPOINT_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace zshard {

struct SafetensorsExportOptions {
  std::string checkpoint_dir;
  // Step to export; UINT64_MAX: the newest intact checkpoint.
  uint64_t step = UINT64_MAX;
  bool bf16 = false;  // F32 (default) or BF16 (round to nearest even)
  std::string out_path;
};

struct SafetensorsExportResult {
  uint64_t step = 0;
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // file size
};

// Writes out_path through a temporary name (the file appears only once
// complete). Errors name the checkpoint file or the output path.
absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    const SafetensorsExportOptions& options);

}  // namespace zshard

#endif  // ZSHARD_COMMON_CHECKPOINT_SAFETENSORS_EXPORT_H_
