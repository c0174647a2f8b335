#include "client/core/parameter_cache.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"

namespace zshard {
namespace {

// Extra time an Acquire waits beyond the fetch RPC's own deadline.
constexpr absl::Duration kWaitSlack = absl::Seconds(5);

}  // namespace

absl::Duration ParameterCache::FetchBound() const {
  // A lease made again while late trainers hold it (DataPlane::peer_wait),
  // its last try and the transfer: each within an RPC deadline.
  return 2 * options_.rpc_timeout + options_.data_plane->peer_wait() +
         kWaitSlack;
}

ParameterCache::ParameterCache(Cluster* cluster, const PartitionMap* map,
                               const ParameterCacheOptions& options)
    : cluster_(cluster),
      map_(map),
      options_(options),
      elem_(options.bf16 ? sizeof(uint16_t) : sizeof(float)),
      scratch_(static_cast<size_t>(2 * map->num_shards())) {
  if (options_.quantized.quantized()) {
    // One thread's kernels: no pool, so every fetch thread may call them.
    // Create fails only for a bad $ZSHARD_KERNELS_ISA; each fetch says so.
    auto k = kernels::CpuKernels::Create();
    if (k.ok()) {
      kernels_ = std::move(*k);
    } else {
      kernels_error_ = k.status();
    }
  }
  for (size_t g = 0; g < map_->num_groups(); ++g) {
    max_group_bytes_ = std::max(max_group_bytes_, Bytes(g));
    if (Persistent(g)) persistent_bytes_ += Bytes(g);
  }
  {
    absl::MutexLock lock(&mu_);
    entries_.resize(map_->num_groups());
    stats_.persistent_bytes = persistent_bytes_;
  }
  const int threads = options.fetch_threads > 0
                          ? options.fetch_threads
                          : 2 * static_cast<int>(map_->num_shards());
  pool_threads_ = std::make_unique<ThreadPool>(threads, "zs-fetch");
  if (options_.host_cache != nullptr) {
    host_reader_ = std::make_unique<ThreadPool>(1, "zs-host-read");
  }
}

ParameterCache::~ParameterCache() {
  if (host_reader_) {
    closing_ = true;
    options_.host_cache->WakeAll();
    host_reader_.reset();
  }
  pool_threads_.reset();
}

uint64_t ParameterCache::ResidentBound() const {
  return std::min(options_.prefetch_bytes, options_.max_live_bytes) +
         max_group_bytes_ + persistent_bytes_;
}

bool ParameterCache::IsCurrentLocked(size_t g) const {
  const Entry& e = entries_[g];
  return (e.state == State::kFetching || e.state == State::kReady) &&
         e.version == version_;
}

void ParameterCache::NoteResidentLocked() {
  stats_.resident_bytes = resident_bytes_;
  stats_.peak_resident_bytes =
      std::max(stats_.peak_resident_bytes, resident_bytes_);
}

std::unique_ptr<uint8_t[]> ParameterCache::TakeBufferLocked(size_t numel) {
  auto it = pool_.find(numel);
  if (it != pool_.end()) {
    auto buf = std::move(it->second);
    pool_.erase(it);
    return buf;
  }
  // Make room: free pooled buffers of other sizes before growing.
  const uint64_t bytes = numel * elem_;
  while (!pool_.empty() && resident_bytes_ + bytes > ResidentBound()) {
    resident_bytes_ -= pool_.begin()->first * elem_;
    pool_.erase(pool_.begin());
  }
  resident_bytes_ += bytes;
  NoteResidentLocked();
  return std::unique_ptr<uint8_t[]>(new uint8_t[numel * elem_]);
}

void ParameterCache::DropLocked(size_t g) {
  Entry& e = entries_[g];
  if (e.prefetched) {
    prefetched_bytes_ -= Bytes(g);
    e.prefetched = false;
  }
  e.state = State::kEmpty;
  e.error = absl::OkStatus();
  if (!e.data) return;
  if (resident_bytes_ <= ResidentBound()) {
    pool_.emplace(map_->group_numel(g), std::move(e.data));
  } else {
    resident_bytes_ -= Bytes(g);
    e.data.reset();
  }
  NoteResidentLocked();
}

void ParameterCache::MarkFetchingLocked(size_t g, bool prefetch) {
  Entry& e = entries_[g];
  if (!e.data) e.data = TakeBufferLocked(map_->group_numel(g));
  e.state = State::kFetching;
  e.version = version_;
  e.error = absl::OkStatus();
  e.pending = 0;
  if (prefetch && !e.prefetched) {
    e.prefetched = true;
    prefetched_bytes_ += Bytes(g);
  }
  ++stats_.group_fetches;
  for (uint32_t s = 0; s < map_->num_shards(); ++s) {
    if (map_->slice(g, s).size() > 0) ++e.pending;
  }
  ++fetches_in_flight_;
}

void ParameterCache::LaunchLocked(const std::vector<size_t>& groups) {
  const uint64_t version = version_;
  for (uint32_t s = 0; s < map_->num_shards(); ++s) {
    std::vector<DataPlane::FetchPiece> net, host;
    for (size_t g : groups) {
      const Slice& slice = map_->slice(g, s);
      if (slice.size() == 0) continue;
      (FromHostLocked(g, s, version) ? host : net)
          .push_back(DataPlane::FetchPiece{
              static_cast<uint32_t>(g),
              entries_[g].data.get() + slice.begin * elem_,
              slice.size() * elem_});
    }
    if (!net.empty()) {
      const bool publish = options_.host_cache != nullptr &&
                           s % options_.host_trainers == options_.host_index;
      pool_threads_->Schedule(
          [this, s, net = std::move(net), version, publish] {
            FetchSlices(s, net, version, publish);
          });
    }
    if (!host.empty()) {
      host_reader_->Schedule([this, s, host = std::move(host), version] {
        ReadFromHost(s, host, version);
      });
    }
  }
}

bool ParameterCache::FromHostLocked(size_t g, uint32_t shard,
                                    uint64_t version) const {
  if (options_.host_cache == nullptr) return false;
  const uint32_t publisher = shard % options_.host_trainers;
  if (publisher == options_.host_index) {
    return options_.host_cache->Has(g, shard, version);
  }
  return host_skipped_.count(publisher) == 0;
}

void ParameterCache::ReadFromHost(
    uint32_t shard, const std::vector<DataPlane::FetchPiece>& pieces,
    uint64_t version) {
  const absl::Time deadline = absl::Now() + options_.host_wait;
  std::vector<DataPlane::FetchPiece> missed;
  bool timed_out = false;
  for (const DataPlane::FetchPiece& p : pieces) {
    const Slice& slice = map_->slice(p.group, shard);
    const absl::Status st = options_.host_cache->Read(
        p.group, shard, version, slice.begin * elem_, p.dest, p.bytes,
        deadline, &closing_);
    if (st.ok()) {
      FetchDone(p.group, shard, st, 0, p.bytes);
    } else if (absl::IsCancelled(st)) {
      FetchDone(p.group, shard, st, 0);
    } else {
      timed_out |= absl::IsDeadlineExceeded(st);
      missed.push_back(p);
    }
  }
  if (missed.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    stats_.host_misses += missed.size();
    // A peer that let a wait run to its deadline (alive, but not fetching
    // what this trainer needs) is not waited for again: its shards come
    // over the network from now on.
    if (timed_out) host_skipped_.insert(shard % options_.host_trainers);
  }
  pool_threads_->Schedule([this, shard, missed = std::move(missed), version] {
    FetchSlices(shard, missed, version, /*publish=*/false);
    // A peer's shard is leased by its fetches alone: held on, these leases
    // would hold up the shard's publishing until their deadline.
    if (shard % options_.host_trainers != options_.host_index) {
      (void)options_.data_plane->Release(shard,
                                         absl::Now() + options_.rpc_timeout);
    }
  });
}

void ParameterCache::PublishSlice(const DataPlane::FetchPiece& piece,
                                  uint32_t shard, uint64_t version) {
  const Slice& slice = map_->slice(piece.group, shard);
  options_.host_cache->Publish(piece.group, shard, version,
                               slice.begin * elem_, piece.dest, piece.bytes);
}

void ParameterCache::StartFetchLocked(size_t g, bool prefetch) {
  MarkFetchingLocked(g, prefetch);
  LaunchLocked({g});
}

void ParameterCache::FetchSlices(
    uint32_t shard, const std::vector<DataPlane::FetchPiece>& pieces,
    uint64_t version, bool publish) {
  if (options_.quantized.quantized()) {
    FetchQuantized(shard, pieces, version, publish);
    return;
  }
  options_.data_plane->FetchMany(
      shard, pieces, version,
      options_.bf16 ? WireFormat::Bf16() : WireFormat::Fp32(),
      absl::Now() + options_.rpc_timeout,
      [&](size_t i, const absl::Status& st) {
        if (publish && st.ok()) PublishSlice(pieces[i], shard, version);
        FetchDone(pieces[i].group, shard, st, st.ok() ? pieces[i].bytes : 0);
      });
}

void ParameterCache::FetchQuantized(
    uint32_t shard, const std::vector<DataPlane::FetchPiece>& pieces,
    uint64_t version, bool publish) {
  const WireFormat& wire = options_.quantized;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const DataPlane::FetchPiece& p : pieces) {
    offsets.push_back(total);
    total += (wire.Bytes(p.bytes / elem_) + 7) & ~size_t{7};
  }
  std::vector<float> staging = scratch_.Take(total);
  char* base = reinterpret_cast<char*>(staging.data());
  std::vector<DataPlane::FetchPiece> wired = pieces;
  for (size_t i = 0; i < wired.size(); ++i) {
    wired[i].dest = base + offsets[i];
    wired[i].bytes = wire.Bytes(pieces[i].bytes / elem_);
  }
  options_.data_plane->FetchMany(
      shard, wired, version, wire, absl::Now() + options_.rpc_timeout,
      [&](size_t i, absl::Status st) {
        if (st.ok()) {
          st = Dequantize(wired[i].dest, pieces[i].bytes / elem_,
                          pieces[i].dest);
        }
        if (publish && st.ok()) PublishSlice(pieces[i], shard, version);
        FetchDone(pieces[i].group, shard, st, st.ok() ? wired[i].bytes : 0);
      });
  scratch_.Give(std::move(staging));
}

absl::Status ParameterCache::Dequantize(const void* wire, size_t numel,
                                        void* dest) {
  if (!kernels_) return kernels_error_;
  if (!options_.bf16) {
    return UnpackQuantized(*kernels_, options_.quantized, wire, numel,
                           static_cast<float*>(dest));
  }
  std::vector<float> wide = scratch_.Take(numel * sizeof(float));
  absl::Status st = UnpackQuantized(*kernels_, options_.quantized, wire,
                                    numel, wide.data());
  if (st.ok()) {
    st = kernels_->Fp32ToBf16(wide.data(), static_cast<uint16_t*>(dest),
                              numel);
  }
  scratch_.Give(std::move(wide));
  return st;
}

void ParameterCache::FetchDone(size_t g, uint32_t /*shard*/,
                               const absl::Status& st, uint64_t bytes,
                               uint64_t host_bytes) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[g];
  stats_.bytes_fetched += bytes;
  stats_.bytes_from_host += host_bytes;
  if (!st.ok() && e.error.ok()) e.error = st;
  if (--e.pending == 0) {
    e.state = e.error.ok() ? State::kReady : State::kFailed;
    --fetches_in_flight_;
  }
}

void ParameterCache::PrefetchFromLocked(size_t pos) {
  // Everything started here goes out as one batch: a lease round trip per
  // shard, not per (group, shard).
  std::vector<size_t> batch;
  for (size_t k = pos; k < plan_.size(); ++k) {
    const size_t h = plan_[k];
    Entry& e = entries_[h];
    if (e.acquired || IsCurrentLocked(h) || e.state == State::kFetching) {
      continue;
    }
    if (Persistent(h)) {
      MarkFetchingLocked(h, /*prefetch=*/false);  // refresh; always resident
      batch.push_back(h);
      continue;
    }
    if (prefetched_bytes_ + Bytes(h) > options_.prefetch_bytes ||
        acquired_bytes_ + prefetched_bytes_ + Bytes(h) >
            options_.max_live_bytes) {
      break;
    }
    if (e.state == State::kFailed) DropLocked(h);
    MarkFetchingLocked(h, /*prefetch=*/true);
    batch.push_back(h);
  }
  LaunchLocked(batch);
}

void ParameterCache::BeginStep(uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return fetches_in_flight_ == 0;
  };
  // Fetches still in flight are bounded by their RPC deadline.
  mu_.AwaitWithDeadline(absl::Condition(&idle), absl::Now() + FetchBound());
  for (size_t g = 0; g < entries_.size(); ++g) {
    Entry& e = entries_[g];
    if (e.acquired || e.state == State::kFetching) continue;
    if (!Persistent(g) || e.state == State::kFailed) DropLocked(g);
  }
  if (!trace_.empty()) plan_ = std::move(trace_);
  trace_.clear();
  plan_pos_ = 0;
  version_ = version;
  PrefetchFromLocked(0);
}

absl::StatusOr<const void*> ParameterCache::Acquire(size_t g) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (g >= entries_.size()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown group ", g, " (the model has ", entries_.size(), " groups)"));
  }
  Entry& e = entries_[g];
  if (e.acquired) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", g, " is already acquired"));
  }
  trace_.push_back(g);
  // Follow the plan; after a divergence, resynchronise on g's next use.
  if (plan_pos_ < plan_.size() && plan_[plan_pos_] == g) {
    ++plan_pos_;
  } else {
    auto it = std::find(plan_.begin() + std::min(plan_pos_, plan_.size()),
                        plan_.end(), g);
    if (it != plan_.end())
      plan_pos_ = static_cast<size_t>(it - plan_.begin()) + 1;
  }
  if (IsCurrentLocked(g)) {
    ++stats_.prefetch_hits;
  } else {
    if (e.state == State::kFetching) {
      auto done = [&e]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return e.state != State::kFetching;
      };
      mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + FetchBound());
    }
    if (e.state == State::kFailed) DropLocked(g);
    StartFetchLocked(g, /*prefetch=*/false);
  }
  if (e.prefetched) {
    prefetched_bytes_ -= Bytes(g);
    e.prefetched = false;
  }
  e.acquired = true;
  if (!Persistent(g)) acquired_bytes_ += Bytes(g);
  PrefetchFromLocked(plan_pos_);
  auto ready = [&e]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return e.state != State::kFetching;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready),
                             absl::Now() + FetchBound())) {
    e.acquired = false;
    if (!Persistent(g)) acquired_bytes_ -= Bytes(g);
    return absl::DeadlineExceededError(
        absl::StrCat("group ", g, " did not arrive before the deadline"));
  }
  stats_.acquire_wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (e.state == State::kFailed) {
    absl::Status err = e.error;
    e.acquired = false;
    if (!Persistent(g)) acquired_bytes_ -= Bytes(g);
    DropLocked(g);
    return err;
  }
  return static_cast<const void*>(e.data.get());
}

absl::Status ParameterCache::Release(size_t g) {
  absl::MutexLock lock(&mu_);
  if (g >= entries_.size() || !entries_[g].acquired) {
    return absl::FailedPreconditionError(
        absl::StrCat("release of group ", g, " which is not acquired"));
  }
  Entry& e = entries_[g];
  e.acquired = false;
  if (Persistent(g)) return absl::OkStatus();
  acquired_bytes_ -= Bytes(g);
  // Reused soon (e.g. the last layer: forward, then backward at once).
  if (ReusedSoonLocked(g) &&
      prefetched_bytes_ + Bytes(g) <= options_.prefetch_bytes &&
      acquired_bytes_ + prefetched_bytes_ + Bytes(g) <=
          options_.max_live_bytes) {
    e.prefetched = true;
    prefetched_bytes_ += Bytes(g);
    return absl::OkStatus();
  }
  DropLocked(g);
  return absl::OkStatus();
}

bool ParameterCache::ReusedSoonLocked(size_t g) const {
  uint64_t distance = 0;
  for (size_t k = plan_pos_; k < plan_.size(); ++k) {
    if (plan_[k] == g) return true;
    distance += map_->group_numel(plan_[k]);
    if (distance > options_.max_reuse_distance) return false;
  }
  return false;
}

ParameterCacheStats ParameterCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zshard
