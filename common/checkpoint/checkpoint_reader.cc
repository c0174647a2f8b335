#include "common/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/chunk_codec.h"
#include "common/checkpoint/durable_file.h"
#include "common/model/model_spec.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& root, uint64_t step) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->root_ = root;
  const std::string dir = root + "/" + StepDirName(step);
  const std::string global_path = dir + "/" + kGlobalManifestName;
  absl::StatusOr<std::string> text = ReadWholeFile(global_path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("no complete checkpoint at step ",
                                              step, " (", global_path,
                                              " is missing)"));
    }
    return text.status();
  }
  absl::StatusOr<GlobalManifest> global =
      ParseGlobalManifest(*text, global_path);
  if (!global.ok()) return global.status();
  if (global->step != step) {
    return absl::DataLossError(
        absl::StrCat(global_path, " describes step ", global->step));
  }
  r->global_ = *global;
  const std::string spec_path = dir + "/" + kSpecFileName;
  absl::StatusOr<std::string> spec_bytes = ReadWholeFile(spec_path);
  if (!spec_bytes.ok())
    return absl::DataLossError(std::string(spec_bytes.status().message()));
  if (Crc32c(spec_bytes->data(), spec_bytes->size()) != global->spec_crc ||
      !r->spec_.ParseFromString(*spec_bytes)) {
    return absl::DataLossError(
        absl::StrCat(spec_path, " fails its checksum (corrupt)"));
  }
  for (uint32_t s = 0; s < global->num_shards; ++s) {
    const std::string path = dir + "/" + ShardManifestName(s);
    absl::StatusOr<std::string> mt = ReadWholeFile(path);
    if (!mt.ok())
      return absl::DataLossError(std::string(mt.status().message()));
    if (Crc32c(mt->data(), mt->size()) != global->shard_manifest_crcs[s]) {
      return absl::DataLossError(absl::StrCat(
          path, " does not match the checksum the global manifest recorded"));
    }
    absl::StatusOr<ShardManifest> m = ParseShardManifest(*mt, path);
    if (!m.ok()) return m.status();
    if (m->shard_id != s || m->step != step) {
      return absl::DataLossError(
          absl::StrCat(path, " belongs to another shard or step"));
    }
    for (size_t i = 0; i < m->chunks.size(); ++i) {
      const ChunkEntry& e = m->chunks[i];
      if (!m->files.count(e.file_step)) {
        return absl::DataLossError(
            absl::StrCat(path, " lists a chunk in an unlisted file"));
      }
      r->index_[{e.group, static_cast<uint32_t>(e.array)}].emplace_back(s, i);
    }
    r->shards_.push_back(std::move(*m));
  }
  for (auto& [key, list] : r->index_) {
    std::sort(list.begin(), list.end(), [&r](const auto& a, const auto& b) {
      return r->shards_[a.first].chunks[a.second].begin <
             r->shards_[b.first].chunks[b.second].begin;
    });
  }
  for (uint32_t s = 0; s < global->num_shards; ++s) {
    if (r->shards_[s].base_step != step) {
      absl::StatusOr<const ShardManifest*> b =
          r->BaseManifest(s, r->shards_[s].base_step);
      if (!b.ok()) return b.status();
    }
  }
  r->cache_.resize(global->num_shards);
  return r;
}

std::string CheckpointReader::DataPath(uint64_t file_step,
                                       uint32_t shard) const {
  return root_ + "/" + StepDirName(file_step) + "/" + ShardDataName(shard);
}

absl::StatusOr<const ShardManifest*> CheckpointReader::BaseManifest(
    uint32_t shard, uint64_t base_step) {
  if (base_step == shards_[shard].step) return &shards_[shard];
  auto key = std::make_pair(shard, base_step);
  auto it = bases_.find(key);
  if (it != bases_.end()) return it->second.get();
  const std::string path =
      root_ + "/" + StepDirName(base_step) + "/" + ShardManifestName(shard);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok())
    return absl::DataLossError(std::string(text.status().message()));
  absl::StatusOr<ShardManifest> m = ParseShardManifest(*text, path);
  if (!m.ok()) return m.status();
  if (m->step != base_step || m->base_step != base_step) {
    return absl::DataLossError(
        absl::StrCat(path, " is not the base the chain names"));
  }
  auto& slot = bases_[key];
  slot = std::make_unique<ShardManifest>(std::move(*m));
  return slot.get();
}

absl::Status CheckpointReader::VerifyDataFiles() const {
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (const ShardManifest& m : shards_) {
    for (const auto& [file_step, rec] : m.files) {
      if (!seen.insert({m.shard_id, file_step}).second) continue;
      const std::string path = DataPath(file_step, m.shard_id);
      absl::StatusOr<FileDigest> d = DigestFile(path);
      if (!d.ok()) return d.status();
      if (d->size != rec.size) {
        return absl::DataLossError(
            absl::StrCat(path, " is ", d->size, " bytes, the manifest says ",
                         rec.size, " (truncated or overwritten)"));
      }
      if (d->crc != rec.crc) {
        return absl::DataLossError(
            absl::StrCat(path, " fails its checksum (corrupt)"));
      }
    }
  }
  return absl::OkStatus();
}

uint64_t CheckpointReader::applied(uint32_t group) const {
  for (const ShardManifest& m : shards_) {
    for (const GroupRecord& g : m.groups) {
      if (g.group == group) return g.applied;
    }
  }
  return 0;
}

absl::StatusOr<std::vector<float>> CheckpointReader::DecodeEntry(
    uint32_t shard, const ChunkEntry& e, const float* base) {
  const std::string path = DataPath(e.file_step, shard);
  absl::StatusOr<std::string> bytes = ReadFileRange(path, e.offset, e.length);
  if (!bytes.ok()) return bytes.status();
  bytes_read_ += e.length;
  if (Crc32c(bytes->data(), bytes->size()) != e.crc) {
    return absl::DataLossError(absl::StrCat(path, ": chunk at byte ", e.offset,
                                            " fails its checksum (corrupt)"));
  }
  std::vector<float> values(e.count);
  absl::Status st = DecodeChunk(*bytes, base, e.count, values.data());
  if (!st.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": chunk at byte ", e.offset, ": ", st.message()));
  }
  return values;
}

absl::Status CheckpointReader::Load(uint32_t shard, const ChunkEntry& e) {
  Cached& c = cache_[shard];
  if (c.valid && c.group == e.group && c.array == e.array &&
      c.begin == e.begin) {
    return absl::OkStatus();
  }
  c.valid = false;
  std::vector<float> base;
  if (e.against_base) {
    absl::StatusOr<const ShardManifest*> bm =
        BaseManifest(shard, shards_[shard].base_step);
    if (!bm.ok()) return bm.status();
    const ChunkEntry* be = nullptr;
    for (const ChunkEntry& x : (*bm)->chunks) {
      if (x.group == e.group && x.array == e.array && x.begin == e.begin) {
        be = &x;
        break;
      }
    }
    if (!be || be->count != e.count || be->against_base) {
      return absl::DataLossError(absl::StrCat(
          "the base of shard ", shard, "'s chain (step ", (*bm)->step,
          ") lacks the chunk at element ", e.begin, " of group ", e.group));
    }
    absl::StatusOr<std::vector<float>> b = DecodeEntry(shard, *be, nullptr);
    if (!b.ok()) return b.status();
    base = std::move(*b);
  }
  absl::StatusOr<std::vector<float>> v =
      DecodeEntry(shard, e, e.against_base ? base.data() : nullptr);
  if (!v.ok()) return v.status();
  c.values = std::move(*v);
  c.group = e.group;
  c.array = e.array;
  c.begin = e.begin;
  c.valid = true;
  return absl::OkStatus();
}

absl::Status CheckpointReader::Read(uint32_t group, StateArray array,
                                    uint64_t begin, uint64_t end, float* out) {
  if (group >= static_cast<uint32_t>(spec_.groups_size()) || begin > end ||
      end > GroupNumel(spec_.groups(static_cast<int>(group)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint read of elements [", begin, ", ", end,
                     ") of group ", group, " is outside the model"));
  }
  auto it = index_.find({group, static_cast<uint32_t>(array)});
  uint64_t pos = begin;
  if (pos < end && it == index_.end()) {
    return absl::DataLossError(absl::StrCat("checkpoint has no ",
                                            StateArrayName(array),
                                            " chunks for group ", group));
  }
  while (pos < end) {
    const auto& list = it->second;
    auto e_it = std::upper_bound(
        list.begin(), list.end(), pos,
        [this](uint64_t p, const std::pair<uint32_t, size_t>& x) {
          return p < shards_[x.first].chunks[x.second].begin;
        });
    if (e_it == list.begin()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint has no data for element ", pos, " of group ", group));
    }
    --e_it;
    const uint32_t shard = e_it->first;
    const ChunkEntry& e = shards_[shard].chunks[e_it->second];
    if (pos >= e.begin + e.count) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint has no data for element ", pos, " of group ", group));
    }
    absl::Status st = Load(shard, e);
    if (!st.ok()) return st;
    const uint64_t hi = std::min(end, e.begin + e.count);
    std::memcpy(out + (pos - begin),
                cache_[shard].values.data() + (pos - e.begin),
                (hi - pos) * sizeof(float));
    pos = hi;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FindRestorableCheckpoint(
    const std::string& root, uint64_t max_step,
    std::vector<std::string>* refused) {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(root);
  if (!steps.ok()) return steps.status();
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    if (*it > max_step) continue;
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r =
        CheckpointReader::Open(root, *it);
    absl::Status st = r.ok() ? (*r)->VerifyDataFiles() : r.status();
    if (st.ok()) return *it;
    if (refused)
      refused->push_back(absl::StrCat("step ", *it, ": ", st.message()));
  }
  return absl::NotFoundError(
      absl::StrCat("no complete, intact checkpoint under ", root));
}

}  // namespace zshard
