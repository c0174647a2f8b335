#include "server/checkpoint/checkpoint_writer.h"

#include <unistd.h>

#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/thread_name.h"
#include "common/checkpoint/chunk_codec.h"
#include "common/checkpoint/durable_file.h"

namespace zshard {

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const CheckpointWriterOptions& options,
    std::vector<StagedGroupShape> groups, CommitFn commit,
    TrainerStatesFn trainer_states, FailFn fail) {
  if (options.root.empty()) {
    return absl::InvalidArgumentError("checkpoint directory not set");
  }
  if (options.chunk_elements == 0 || options.chunk_elements > (1u << 28)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint chunk of ", options.chunk_elements, " elements is out of range"));
  }
  if (options.full_every == 0) {
    return absl::InvalidArgumentError("checkpoint full_every must be at least 1");
  }
  if (options.zstd_level < 1 || options.zstd_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint zstd_level must be in 1..19, got ", options.zstd_level));
  }
  absl::Status st = MakeDirs(options.root);
  if (!st.ok()) return st;
  return std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(options, std::move(groups), std::move(commit),
                           std::move(trainer_states), std::move(fail)));
}

CheckpointWriter::CheckpointWriter(const CheckpointWriterOptions& options,
                                   std::vector<StagedGroupShape> shapes,
                                   CommitFn commit,
                                   TrainerStatesFn trainer_states, FailFn fail)
    : options_(options),
      commit_(std::move(commit)),
      trainer_states_(std::move(trainer_states)),
      fail_(std::move(fail)) {
  const uint64_t c = options.chunk_elements;
  groups_.resize(shapes.size());
  for (size_t g = 0; g < shapes.size(); ++g) {
    Group& grp = groups_[g];
    grp.shape = shapes[g];
    if (grp.shape.size == 0) continue;
    ++groups_with_elements_;
    const size_t chunks = (grp.shape.size + c - 1) / c;
    for (int a = 0; a < kNumStateArrays; ++a) {
      // assign() touches the pages now, not during the first stall.
      grp.staging[a].assign(grp.shape.size, 0.0f);
      grp.base[a].assign(grp.shape.size, 0.0f);
      grp.dirty[a].assign(chunks, 1);
      grp.entries[a].resize(chunks);
    }
  }
  thread_ = std::thread([this] {
    NameCurrentThread("zs-ckpt-write");
    Run();
  });
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status CheckpointWriter::StageGroup(uint64_t step, uint32_t group,
                                          const float* master, const float* exp_avg,
                                          const float* exp_avg_sq, uint64_t version,
                                          uint64_t applied, absl::Time deadline) {
  const absl::Time start = absl::Now();
  bool base = false;
  {
    absl::MutexLock lock(&mu_);
    if (group >= groups_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: unknown group ", group));
    }
    if (groups_[group].shape.size == 0) return absl::OkStatus();
    if (draining_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, " not taken: the shard is stopping"));
    }
    if (phase_ == Phase::kWriting) {
      std::cerr << "zshard-server: shard " << options_.shard_id << ": checkpoint at step "
                << step << " waits for the write of step " << step_ << " to finish\n";
      auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return phase_ != Phase::kWriting;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "checkpoint at step ", step, " not taken: the write of step ", step_,
            " did not finish in time"));
      }
    }
    if (draining_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, " not taken: the shard is stopping"));
    }
    if (phase_ == Phase::kStaging && step_ != step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, " not taken: step ", step_, " is still being staged"));
    }
    if (phase_ == Phase::kIdle) {
      if (step <= last_step_) {
        return absl::AlreadyExistsError(absl::StrCat(
            "checkpoint at step ", step, " not taken: step ", last_step_, " was already"));
      }
      last_step_ = step;
      phase_ = Phase::kStaging;
      step_ = step;
      step_base_ = in_chain_ == 0 || in_chain_ >= options_.full_every;
      staged_ = 0;
      stall_seconds_ = 0;
      for (Group& g : groups_) g.staged = false;
    }
    if (groups_[group].staged) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, ": group ", group, " staged twice"));
    }
    base = step_base_;
  }
  // This group's buffers belong to this caller until it is marked staged.
  Group& g = groups_[group];
  const float* src[kNumStateArrays] = {master, exp_avg, exp_avg_sq};
  const uint64_t c = options_.chunk_elements;
  for (int a = 0; a < kNumStateArrays; ++a) {
    float* dst = g.staging[a].data();
    for (size_t k = 0; k < g.dirty[a].size(); ++k) {
      const uint64_t lo = k * c;
      const size_t bytes = (std::min(g.shape.size, lo + c) - lo) * sizeof(float);
      if (base || std::memcmp(dst + lo, src[a] + lo, bytes) != 0) {
        std::memcpy(dst + lo, src[a] + lo, bytes);
        g.dirty[a][k] = 1;
      } else {
        g.dirty[a][k] = 0;
      }
    }
  }
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", step, " not taken: the shard is stopping"));
  }
  g.version = version;
  g.applied = applied;
  g.staged = true;
  stall_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (++staged_ == groups_with_elements_) phase_ = Phase::kWriting;
  return absl::OkStatus();
}

void CheckpointWriter::SkipStepsUpTo(uint64_t step) {
  absl::MutexLock lock(&mu_);
  last_step_ = std::max(last_step_, step);
}

uint64_t CheckpointWriter::last_step() const {
  absl::MutexLock lock(&mu_);
  return last_step_;
}

absl::Status CheckpointWriter::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return phase_ == Phase::kIdle; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "checkpoint of step ", step_, " still in progress at the deadline"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Drain(absl::Time deadline, uint64_t* abandoned) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  *abandoned = 0;
  if (phase_ == Phase::kStaging) {
    *abandoned = step_;
    phase_ = Phase::kIdle;
    in_chain_ = 0;  // the staging area is part old, part new
  }
  auto written = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return phase_ != Phase::kWriting;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&written), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the write of checkpoint step ", step_, " did not finish in time"));
  }
  return absl::OkStatus();
}

CheckpointWriteStats CheckpointWriter::last_stats() const {
  absl::MutexLock lock(&mu_);
  return last_stats_;
}

absl::Status CheckpointWriter::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

uint64_t CheckpointWriter::writes_completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

void CheckpointWriter::Run() {
  for (;;) {
    uint64_t step;
    bool base;
    CheckpointWriteStats stats;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return phase_ == Phase::kWriting || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (phase_ != Phase::kWriting) return;  // stopping; a partial staging is dropped
      step = step_;
      base = step_base_;
      stats.stall_seconds = stall_seconds_;
    }
    // The trainers' states reported with step - 1, now that every group is
    // staged (and every contribution of step - 1, which carried them, has
    // landed): only the last few steps' are kept, and the write may end
    // several steps later.
    TrainerResume resume =
        trainer_states_ ? trainer_states_(step) : TrainerResume();
    {
      absl::MutexLock lock(&mu_);
      step_resume_ = std::move(resume);
    }
    const absl::Time start = absl::Now();
    absl::Status st = Write(step, base, &stats);
    stats.write_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    {
      absl::MutexLock lock(&mu_);
      if (st.ok()) {
        std::cerr << absl::StrFormat(
            "zshard-server: shard %d: checkpoint step %d (%s): %d bytes, %d of "
            "%d chunks, "
            "stall %.6f s, write %.3f s\n",
            options_.shard_id, step, base ? "base" : "delta",
            stats.bytes_written, stats.chunks_written, stats.chunks_total,
            stats.stall_seconds, stats.write_seconds);
        ++completed_;
        last_stats_ = stats;
        in_chain_ = base ? 1 : in_chain_ + 1;
      } else {
        std::cerr << "zshard-server: shard " << options_.shard_id
                  << ": checkpoint at step " << step
                  << " failed: " << st.message() << "\n";
        // The staging now differs from what the chain holds: restart with a
        // base.
        in_chain_ = 0;
      }
      last_error_ = st;
      phase_ = Phase::kIdle;
    }
    // After last_error_ is set (status shows it), outside mu_ (it may block).
    if (!st.ok() && fail_) fail_(step, st);
  }
}

absl::Status CheckpointWriter::Write(uint64_t step, bool base,
                                     CheckpointWriteStats* stats) {
  const std::string dir = options_.root + "/" + StepDirName(step);
  absl::Status st = MakeDirs(dir);
  if (!st.ok()) return st;
  if (options_.shard_id == 0) {
    // A global manifest left by an earlier run at this step no longer holds.
    ::unlink((dir + "/" + kGlobalManifestName).c_str());
  }
  absl::StatusOr<DurableWriter> out = DurableWriter::Open(dir + "/" + ShardDataName(options_.shard_id));
  if (!out.ok()) return out.status();
  stats->step = step;
  stats->base = base;
  uint32_t file_crc = 0;
  const uint64_t c = options_.chunk_elements;
  for (uint32_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    for (int a = 0; a < kNumStateArrays; ++a) {
      for (size_t k = 0; k < g.entries[a].size(); ++k) {
        ++stats->chunks_total;
        if (!base && !g.dirty[a][k]) continue;  // the previous entry still holds
        const uint64_t lo = k * c;
        const size_t n = std::min(g.shape.size, lo + c) - lo;
        const float* values = g.staging[a].data() + lo;
        absl::StatusOr<std::string> enc = EncodeChunk(
            values, base ? nullptr : g.base[a].data() + lo, n, options_.zstd_level);
        if (!enc.ok()) return enc.status();
        ChunkEntry& e = g.entries[a][k];
        e.group = gi;
        e.array = static_cast<StateArray>(a);
        e.begin = g.shape.begin + lo;
        e.count = n;
        e.file_step = step;
        e.offset = out->size();
        e.length = enc->size();
        e.crc = Crc32c(enc->data(), enc->size());
        e.against_base = !base;
        file_crc = Crc32c(enc->data(), enc->size(), file_crc);
        st = out->Append(enc->data(), enc->size());
        if (!st.ok()) return st;
        if (base) std::memcpy(g.base[a].data() + lo, values, n * sizeof(float));
        ++stats->chunks_written;
        if (options_.testing_chunk_delay > absl::ZeroDuration()) {
          absl::SleepFor(options_.testing_chunk_delay);
        }
      }
    }
  }
  const uint64_t size = out->size();
  st = out->Commit();
  if (!st.ok()) return st;
  stats->bytes_written = size;
  if (base) {
    base_step_ = step;
    files_.clear();
  }
  files_[step] = DataFileRecord{size, file_crc};

  ShardManifest m;
  m.step = step;
  m.base_step = base_step_;
  m.shard_id = options_.shard_id;
  m.num_shards = options_.num_shards;
  m.chunk_elements = c;
  m.bytes_written = size;
  for (uint32_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    if (g.shape.size == 0) continue;
    m.groups.push_back(GroupRecord{gi, g.shape.begin, g.shape.begin + g.shape.size,
                                   g.version, g.applied});
    for (int a = 0; a < kNumStateArrays; ++a) {
      for (const ChunkEntry& e : g.entries[a]) {
        m.chunks.push_back(e);
        m.files[e.file_step] = files_.at(e.file_step);
      }
    }
  }
  // The base's file is needed to decode every delta chunk.
  m.files[base_step_] = files_.at(base_step_);
  // Forget files the chain no longer references.
  for (auto it = files_.begin(); it != files_.end();) {
    it = m.files.count(it->first) ? std::next(it) : files_.erase(it);
  }
  {
    absl::MutexLock lock(&mu_);
    m.trainer_states = step_resume_.states;
    m.last_step_skipped = step_resume_.last_step_skipped;
  }
  const std::string text = SerializeShardManifest(m);
  st = WriteFileDurably(dir + "/" + ShardManifestName(options_.shard_id), text);
  if (!st.ok()) return st;
  if (commit_) return commit_(m, Crc32c(text.data(), text.size()));
  return absl::OkStatus();
}

}  // namespace zshard
