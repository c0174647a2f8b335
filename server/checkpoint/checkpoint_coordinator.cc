#include "server/checkpoint/checkpoint_coordinator.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/chunk_codec.h"
#include "common/checkpoint/durable_file.h"

namespace zshard {
namespace {

// Removes a step directory and the files in it (it has no subdirectories).
void RemoveStepDir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace

CheckpointCoordinator::CheckpointCoordinator(const CheckpointCoordinatorOptions& options)
    : options_(options) {}

absl::Status CheckpointCoordinator::Commit(const ShardCommit& commit,
                                           const v1::ModelSpec& spec) {
  const uint32_t shards = options_.cluster.num_shards;
  if (commit.shard_id >= shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint commit from shard ", commit.shard_id, " of ", shards));
  }
  std::vector<ShardCommit> parts;
  {
    absl::MutexLock lock(&mu_);
    if (complete_.count(commit.step)) return absl::OkStatus();  // repeated commit
    if (!commit.error.ok()) {
      failed_[commit.step] = absl::Status(
          commit.error.code(),
          absl::StrCat("checkpoint at step ", commit.step, " failed on shard ",
                       commit.shard_id, ": ", commit.error.message()));
      pending_.erase(commit.step);
      while (failed_.size() > 16) failed_.erase(failed_.begin());
      return absl::OkStatus();
    }
    if (failed_.count(commit.step)) return absl::OkStatus();  // already failed
    auto& slot = pending_[commit.step];
    if (slot.empty()) slot.resize(shards);
    slot[commit.shard_id] = commit;
    for (const auto& p : slot) {
      if (!p) return absl::OkStatus();  // not everyone yet
    }
    for (const auto& p : slot) parts.push_back(*p);
    pending_.erase(commit.step);
    // Older steps that never completed will not: a shard moved past them.
    while (!pending_.empty() && pending_.begin()->first < commit.step) {
      pending_.erase(pending_.begin());
    }
    ++finishing_;
  }
  absl::Status st = Finish(commit.step, parts, spec);
  absl::MutexLock lock(&mu_);
  if (!st.ok()) failed_[commit.step] = st;
  --finishing_;
  return st;
}

absl::Status CheckpointCoordinator::Finish(uint64_t step, const std::vector<ShardCommit>& parts,
                                           const v1::ModelSpec& spec) {
  const std::string dir = options_.root + "/" + StepDirName(step);
  GlobalManifest g = options_.cluster;
  g.step = step;
  // The oldest base any shard's chain needs (a shard that started over,
  // e.g. a replacement, has a newer one): garbage collection keeps it.
  g.base_step = parts[0].base_step;
  for (const ShardCommit& p : parts)
    g.base_step = std::min(g.base_step, p.base_step);
  g.trainer_states = parts[0].trainer_states;
  g.last_step_skipped = parts[0].last_step_skipped;
  g.shard_manifest_crcs.clear();
  g.bytes_written = 0;
  for (const ShardCommit& p : parts) {
    g.shard_manifest_crcs.push_back(p.manifest_crc);
    g.bytes_written += p.bytes_written;
  }
  if (options_.history) g.membership_history = options_.history();
  const std::string spec_bytes = spec.SerializeAsString();
  g.spec_crc = Crc32c(spec_bytes.data(), spec_bytes.size());
  absl::Status st = WriteFileDurably(dir + "/" + kSpecFileName, spec_bytes);
  if (!st.ok()) return st;
  st = WriteFileDurably(dir + "/" + kGlobalManifestName, SerializeGlobalManifest(g));
  if (!st.ok()) return st;
  {
    absl::MutexLock lock(&mu_);
    complete_[step] = g;
    while (complete_.size() > 16) complete_.erase(complete_.begin());
  }
  std::cerr << "zshard-server: checkpoint at step " << step << " complete ("
            << (g.base_step == step ? "base" : "delta") << ", " << g.bytes_written
            << " bytes) in " << dir << "\n";
  CollectGarbage();
  return absl::OkStatus();
}

void CheckpointCoordinator::CollectGarbage() {
  absl::StatusOr<std::vector<uint64_t>> steps = ListCheckpointSteps(options_.root);
  if (!steps.ok()) return;
  // Complete bases, newest first.
  std::vector<uint64_t> bases;
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    const std::string path =
        options_.root + "/" + StepDirName(*it) + "/" + kGlobalManifestName;
    absl::StatusOr<std::string> text = ReadWholeFile(path);
    if (!text.ok()) continue;
    absl::StatusOr<GlobalManifest> m = ParseGlobalManifest(*text, path);
    if (m.ok() && m->base_step == m->step) bases.push_back(m->step);
  }
  if (bases.size() <= options_.keep_bases || options_.keep_bases == 0) return;
  const uint64_t oldest_kept = bases[options_.keep_bases - 1];
  for (uint64_t s : *steps) {
    if (s >= oldest_kept) break;
    RemoveStepDir(options_.root + "/" + StepDirName(s));
  }
  SyncDir(options_.root).IgnoreError();
}

absl::StatusOr<GlobalManifest> CheckpointCoordinator::WaitComplete(uint64_t step,
                                                                   absl::Time deadline) {
  {
    // Complete before this process (the checkpoint a restore loaded)?
    const std::string path = options_.root + "/" + StepDirName(step) + "/" + kGlobalManifestName;
    absl::StatusOr<std::string> text = ReadWholeFile(path);
    absl::MutexLock lock(&mu_);
    if (text.ok() && !complete_.count(step) && !pending_.count(step)) {
      absl::StatusOr<GlobalManifest> m = ParseGlobalManifest(*text, path);
      if (m.ok()) return *m;
    }
  }
  absl::MutexLock lock(&mu_);
  auto done = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return complete_.count(step) > 0 || failed_.count(step) > 0;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    std::string missing;
    auto it = pending_.find(step);
    for (uint32_t s = 0; s < options_.cluster.num_shards; ++s) {
      if (it == pending_.end() || !it->second[s]) {
        absl::StrAppend(&missing, missing.empty() ? "" : ",", s);
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "checkpoint at step ", step, " not complete by the deadline; shards ", missing,
        " have not committed (has the cluster reached step ", step, "?)"));
  }
  auto f = failed_.find(step);
  if (f != failed_.end()) return f->second;
  return complete_.at(step);
}

absl::Status CheckpointCoordinator::WaitSettled(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return pending_.empty() && finishing_ == 0;
  };
  if (mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::OkStatus();
  }
  std::string waiting = finishing_ > 0 ? "a global manifest is being written" : "";
  for (const auto& [step, parts] : pending_) {
    std::string missing;
    for (uint32_t s = 0; s < parts.size(); ++s) {
      if (!parts[s]) absl::StrAppend(&missing, missing.empty() ? "" : ",", s);
    }
    absl::StrAppend(&waiting, waiting.empty() ? "" : "; ", "step ", step,
                    " waits for shards ", missing);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("checkpoints not complete by the deadline: ", waiting));
}

bool CheckpointCoordinator::last_complete(uint64_t* step) const {
  absl::MutexLock lock(&mu_);
  if (complete_.empty()) return false;
  *step = complete_.rbegin()->first;
  return true;
}

}  // namespace zshard
