#include "common/checkpoint/safetensors_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint_reader.h"
#include "common/checkpoint/durable_file.h"
#include "common/model/model_spec.h"
#include "common/model/partition_map.h"
#include "nlohmann/json.hpp"
#include "zshard/kernels/cast.h"

namespace zshard {

absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    const SafetensorsExportOptions& options) {
  if (options.out_path.empty())
    return absl::InvalidArgumentError("no output path given");
  // The file is written under a temporary name and renamed over the target:
  // that would replace a device node or a symbolic link with a file.
  struct stat target;
  if (lstat(options.out_path.c_str(), &target) == 0 &&
      !S_ISREG(target.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output path '", options.out_path,
        "' exists and is not a regular file (a device, directory or "
        "symbolic link); give a new path or a regular file to replace"));
  }
  uint64_t step = options.step;
  if (step == UINT64_MAX) {
    absl::StatusOr<uint64_t> found =
        FindRestorableCheckpoint(options.checkpoint_dir, UINT64_MAX, nullptr);
    if (!found.ok()) return found.status();
    step = *found;
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> opened =
      CheckpointReader::Open(options.checkpoint_dir, step);
  if (!opened.ok()) return opened.status();
  CheckpointReader& r = **opened;
  const v1::ModelSpec& spec = r.spec();
  absl::StatusOr<PartitionMap> map = PartitionMap::Create(spec, 1, 1, 0);
  if (!map.ok()) return map.status();

  // Names: the tensor's own, or group.tensor when two groups share one.
  std::set<std::string> seen, dup;
  for (const auto& g : spec.groups()) {
    for (const auto& t : g.tensors()) {
      if (!seen.insert(t.name()).second) dup.insert(t.name());
    }
  }
  const size_t elem = options.bf16 ? 2 : 4;
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"},
                            {"zshard_step", std::to_string(step)},
                            {"zshard_model", spec.name()}};
  uint64_t offset = 0, tensors = 0;
  for (int g = 0; g < spec.groups_size(); ++g) {
    for (const auto& t : spec.groups(g).tensors()) {
      const std::string name = dup.count(t.name())
                                   ? spec.groups(g).name() + "." + t.name()
                                   : t.name();
      const uint64_t bytes = TensorNumel(t) * elem;
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      header[name] = {{"dtype", options.bf16 ? "BF16" : "F32"},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
      ++tensors;
    }
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  absl::StatusOr<DurableWriter> out = DurableWriter::Open(options.out_path);
  if (!out.ok()) return out.status();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  absl::Status st = out->Append(len, 8);
  if (st.ok()) st = out->Append(text.data(), text.size());
  if (!st.ok()) return st;

  const uint64_t piece = std::max<uint64_t>(
      1, r.shards().empty() ? 1 : r.shards()[0].chunk_elements);
  std::vector<float> values(piece);
  std::vector<uint16_t> halves(options.bf16 ? piece : 0);
  for (int g = 0; g < spec.groups_size(); ++g) {
    for (int t = 0; t < spec.groups(g).tensors_size(); ++t) {
      const uint64_t begin =
          map->tensor_offset(static_cast<size_t>(g), static_cast<size_t>(t));
      const uint64_t end = begin + TensorNumel(spec.groups(g).tensors(t));
      for (uint64_t lo = begin; lo < end; lo += piece) {
        const uint64_t n = std::min(piece, end - lo);
        st = r.Read(static_cast<uint32_t>(g), StateArray::kMaster, lo, lo + n,
                    values.data());
        if (!st.ok()) return st;
        if (options.bf16) {
          st = kernels::ReferenceFp32ToBf16(values.data(), halves.data(), n);
          if (st.ok()) st = out->Append(halves.data(), n * 2);
        } else {
          st = out->Append(values.data(), n * 4);
        }
        if (!st.ok()) return st;
      }
    }
  }
  SafetensorsExportResult result;
  result.step = step;
  result.tensors = tensors;
  result.bytes = out->size();
  st = out->Commit();
  if (!st.ok()) return st;
  return result;
}

}  // namespace zshard
