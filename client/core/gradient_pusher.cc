#include "client/core/gradient_pusher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/grpc_status.h"

namespace zshard {
namespace {

// Free gradient buffers kept per size for reuse.
constexpr size_t kPooledPerSize = 4;

}  // namespace

GradientPusher::GradientPusher(Cluster* cluster, const PartitionMap* map,
                               const GradientPusherOptions& options)
    : cluster_(cluster),
      map_(map),
      options_(options),
      elem_(options.bf16 ? sizeof(uint16_t) : sizeof(float)),
      scratch_(static_cast<size_t>(2 * map->num_shards())) {
  if (options_.quantized.quantized()) {
    // Create fails only for a bad $ZSHARD_KERNELS_ISA; each push says so.
    auto k = kernels::CpuKernels::Create();
    if (k.ok()) {
      kernels_ = std::move(*k);
    } else {
      kernels_error_ = k.status();
    }
  }
  for (size_t g = 0; g < map_->num_groups(); ++g) {
    max_group_bytes_ =
        std::max<uint64_t>(max_group_bytes_, map_->trainable_numel(g) * elem_);
  }
  const int threads = options.push_threads > 0
                          ? options.push_threads
                          : static_cast<int>(map_->num_shards());
  threads_ = std::make_unique<ThreadPool>(threads, "zs-push");
}

GradientPusher::~GradientPusher() { threads_.reset(); }

absl::Duration GradientPusher::SendBound() const {
  // A reservation made again while late trainers hold it
  // (DataPlane::peer_wait), its last try with the put and the Landed call,
  // and as long again queued behind other sends.
  return 3 * options_.rpc_timeout + options_.data_plane->peer_wait();
}

uint64_t GradientPusher::BufferCap() const {
  if (options_.hold_until_flush || options_.bucket_bytes == 0)
    return UINT64_MAX;
  return 2 * (options_.bucket_bytes + max_group_bytes_);
}

absl::Status GradientPusher::Push(size_t g, const void* grad, uint64_t step,
                                  uint32_t micro_step, bool trainable_only) {
  if (g >= map_->num_groups()) {
    return absl::NotFoundError(absl::StrCat("unknown group ", g));
  }
  auto p = std::make_shared<Pending>();
  p->numel = map_->trainable_numel(g);  // frozen tensors are not sent
  bool adopted = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto lent = lent_.find(g); lent != lent_.end()) {
      // Lent buffers hold the whole group, which is all trainable.
      adopted = !trainable_only && lent->second.get() == grad;
      if (adopted) {
        p->data = std::move(lent->second);
      } else {
        pool_.emplace(p->numel, std::move(lent->second));
      }
      lent_.erase(lent);
    }
    if (!adopted) p->data = TakeBufferLocked(p->numel);
    for (uint32_t s = 0; s < map_->num_shards(); ++s) {
      if (map_->slice(g, s).size() > 0) ++p->shards_left;
    }
  }
  uint8_t* out = p->data.get();
  if (adopted) {
    // Written in place by the caller.
  } else if (trainable_only) {
    if (p->numel > 0) std::memcpy(out, grad, p->numel * elem_);
  } else {
    for (const auto& [lo, hi] : map_->trainable_ranges(g)) {
      std::memcpy(out, static_cast<const uint8_t*>(grad) + lo * elem_,
                  (hi - lo) * elem_);
      out += (hi - lo) * elem_;
    }
  }
  absl::MutexLock lock(&mu_);
  held_.push_back(Held{p, g, step, micro_step});
  held_bytes_ += p->numel * elem_;
  if (!options_.hold_until_flush && held_bytes_ >= options_.bucket_bytes) {
    if (options_.bucket_bytes > 0) {
      // Stage 2: one bucket in flight while the next fills, no more.
      auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return in_flight_ == 0;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&idle),
                                 absl::Now() + SendBound())) {
        return absl::DeadlineExceededError(
            "the previous gradient bucket was not acknowledged before the "
            "deadline");
      }
    }
    SendHeldLocked();
  }
  return absl::OkStatus();
}

std::unique_ptr<uint8_t[]> GradientPusher::TakeBufferLocked(uint64_t numel) {
  auto it = pool_.find(numel);
  if (it != pool_.end()) {
    std::unique_ptr<uint8_t[]> data = std::move(it->second);
    pool_.erase(it);
    return data;
  }
  // Make room: drop pooled buffers of other sizes before growing.
  const uint64_t bytes = numel * elem_;
  while (!pool_.empty() && stats_.buffer_bytes + bytes > BufferCap()) {
    stats_.buffer_bytes -= pool_.begin()->first * elem_;
    pool_.erase(pool_.begin());
  }
  stats_.buffer_bytes += bytes;
  stats_.peak_buffer_bytes =
      std::max(stats_.peak_buffer_bytes, stats_.buffer_bytes);
  return std::unique_ptr<uint8_t[]>(
      new uint8_t[std::max<uint64_t>(numel, 1) * elem_]);
}

void* GradientPusher::Lend(size_t g) {
  if (g >= map_->num_groups() ||
      map_->trainable_numel(g) != map_->group_numel(g)) {
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<uint8_t[]>& lent = lent_[g];
  if (!lent) lent = TakeBufferLocked(map_->group_numel(g));
  return lent.get();
}

void GradientPusher::SendHeldLocked() {
  for (const Held& h : held_) SendLocked(h);
  held_.clear();
  held_bytes_ = 0;
}

void GradientPusher::SendLocked(const Held& h) {
  in_flight_ += h.pending->shards_left;
  threads_->Schedule(
      [this, h] { SendGroup(h.pending, h.group, h.step, h.micro_step); });
}

void GradientPusher::SendGroup(std::shared_ptr<Pending> p, size_t g,
                               uint64_t step, uint32_t micro_step) {
  std::vector<Sent> sent;
  sent.reserve(map_->num_shards());
  for (uint32_t s = 0; s < map_->num_shards(); ++s) {
    if (map_->slice(g, s).size() == 0) continue;
    sent.push_back(StartSlice(*p, g, s, step, micro_step));
  }
  for (Sent& one : sent) {
    const uint32_t shard = one.push.shard;
    absl::Status st = options_.data_plane->FinishPush(std::move(one.push));
    if (!one.packed.empty()) scratch_.Give(std::move(one.packed));
    Finished(p, g, shard, step, st, st.ok() ? one.bytes : 0);
  }
}

GradientPusher::Sent GradientPusher::StartSlice(const Pending& p, size_t g,
                                                uint32_t shard, uint64_t step,
                                                uint32_t micro_step) {
  const Slice part = map_->compact_slice(g, shard);
  std::string state;
  if (shard == 0) {
    absl::MutexLock lock(&mu_);
    if (state_sent_step_ != step) {
      state = trainer_state_;
      state_sent_step_ = step;
    }
  }
  Sent sent;
  sent.push.shard = shard;
  const void* data = p.data.get() + part.begin * elem_;
  sent.bytes = part.size() * elem_;
  WireFormat wire = options_.bf16 ? WireFormat::Bf16() : WireFormat::Fp32();
  if (options_.quantized.quantized()) {
    wire = options_.quantized;
    sent.push.error = Quantize(data, part.size(), &sent.packed);
    if (!sent.push.error.ok()) return sent;
    data = sent.packed.data();
    sent.bytes = wire.Bytes(part.size());
  }
  sent.push = options_.data_plane->StartPush(
      shard, static_cast<uint32_t>(g), step, micro_step, wire, data, sent.bytes,
      state, absl::Now() + options_.rpc_timeout);
  return sent;
}

absl::Status GradientPusher::Quantize(const void* data, size_t numel,
                                      std::vector<float>* out) {
  if (!kernels_) return kernels_error_;
  *out = scratch_.Take(options_.quantized.Bytes(numel));
  const float* values = static_cast<const float*>(data);
  std::vector<float> wide;
  if (options_.bf16) {
    wide = scratch_.Take(numel * sizeof(float));
    absl::Status st = kernels_->Bf16ToFp32(static_cast<const uint16_t*>(data),
                                           wide.data(), numel);
    if (!st.ok()) return st;
    values = wide.data();
  }
  absl::Status st = PackQuantizedOrNan(*kernels_, options_.quantized, values,
                                       numel, out->data());
  if (!wide.empty()) scratch_.Give(std::move(wide));
  return st;
}

void GradientPusher::Finished(std::shared_ptr<Pending> p, size_t g,
                              uint32_t shard, uint64_t step,
                              const absl::Status& st, uint64_t sent) {
  absl::MutexLock lock(&mu_);
  if (st.ok()) stats_.bytes_pushed += sent;
  if (!st.ok() && first_error_.ok()) {
    first_error_ = cluster_->Annotate(
        shard,
        absl::Status(st.code(), absl::StrCat("pushing group ", g, " step ",
                                             step, ": ", st.message())));
  }
  --in_flight_;
  if (--p->shards_left == 0) {
    // Stages 1 and 2 hold many gradients at once: keep all their buffers.
    const size_t keep = options_.hold_until_flush || options_.bucket_bytes > 0
                            ? map_->num_groups()
                            : kPooledPerSize;
    if (pool_.count(p->numel) < keep && stats_.buffer_bytes <= BufferCap()) {
      pool_.emplace(p->numel, std::move(p->data));
    } else {
      stats_.buffer_bytes -= p->numel * elem_;
      p->data.reset();
    }
  }
}

void GradientPusher::SetTrainerState(std::string state) {
  absl::MutexLock lock(&mu_);
  trainer_state_ = std::move(state);
  state_sent_step_ = UINT64_MAX;
}

absl::Status GradientPusher::Flush() {
  absl::MutexLock lock(&mu_);
  SendHeldLocked();
  auto done = [this]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_ == 0; };
  // Each send is bounded by its RPC deadline; allow for queueing behind others.
  if (!mu_.AwaitWithDeadline(absl::Condition(&done),
                             absl::Now() + SendBound())) {
    return absl::DeadlineExceededError(absl::StrCat(
        in_flight_, " gradient sends still unacknowledged at the deadline"));
  }
  absl::Status err = first_error_;
  first_error_ = absl::OkStatus();
  return err;
}

GradientPusherStats GradientPusher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zshard
