#include "server/contribution_buffer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace zshard {

namespace {

size_t TrainableElements(const ContributionBufferOptions& o) {
  if (!o.trainable) return o.slice.size();
  size_t n = 0;
  for (const auto& [lo, hi] : *o.trainable) n += hi - lo;
  return n;
}

}  // namespace

ContributionBuffer::ContributionBuffer(const ContributionBufferOptions& options)
    : options_(options),
      slots_(static_cast<size_t>(options.world_size) *
             options.accumulation_steps),
      elements_(TrainableElements(options)) {}

absl::StatusOr<std::unique_ptr<ContributionBuffer>> ContributionBuffer::Create(
    const ContributionBufferOptions& options, uint64_t step) {
  std::unique_ptr<ContributionBuffer> b(new ContributionBuffer(options));
  const size_t n = b->elements_ * b->slots_;
  const size_t landing_bytes =
      n * (options.bf16 ? sizeof(uint16_t) : sizeof(float));
  if (options.transport && n > 0) {
    // Memory the transport serves fastest (UCX: shared-memory peers put
    // into it directly).
    ZS_ASSIGN_OR_RETURN(b->landing_region_,
                        options.transport->Allocate(landing_bytes));
  }
  if (options.bf16) {
    if (b->landing_region_) {
      b->bf16_ = static_cast<uint16_t*>(b->landing_region_->data());
    } else {
      b->own_bf16_.assign(n, 0);
      b->bf16_ = b->own_bf16_.data();
    }
  }
  if (b->landing_region_ && !options.bf16) {
    b->sums_ = static_cast<float*>(b->landing_region_->data());
  } else {
    b->own_sums_.assign(n, 0.0f);
    b->sums_ = b->own_sums_.data();
  }
  absl::MutexLock lock(&b->mu_);
  b->step_ = step;
  b->received_.assign(b->slots_, 0);
  b->done_.assign(b->slots_, 0);
  return b;
}

absl::Status ContributionBuffer::CheckLocked(uint64_t step, uint32_t micro_step,
                                             uint32_t rank) const {
  if (rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("trainer rank ", rank,
                                                   " out of range (world size ",
                                                   options_.world_size, ")"));
  }
  if (micro_step >= options_.accumulation_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-step ", micro_step,
                     " out of range (gradient_accumulation_steps ",
                     options_.accumulation_steps, ")"));
  }
  if (step != step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient for step ", step, " of group ", options_.group,
                     " is from the ", step < step_ ? "past" : "future",
                     ": shard ", options_.shard_id, " is at version ", step_));
  }
  if (options_.slice.size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " owns no elements of group ",
                     options_.group));
  }
  return absl::OkStatus();
}

bool ContributionBuffer::CompleteLocked() {
  ++complete_;
  if (complete_ != slots_) return false;
  completed_at_ = absl::Now();
  return true;
}

absl::StatusOr<ContributionBuffer::Arrival> ContributionBuffer::Land(
    uint64_t step, uint32_t micro_step, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckLocked(step, micro_step, rank));
  const size_t k = slot(rank, micro_step);
  if (received_[k] != 0 || done_[k]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed (part of) micro-step ", micro_step,
        " of step ", step, " for group ", options_.group));
  }
  done_[k] = 1;
  Arrival a;
  a.bytes = static_cast<uint64_t>(elements_) *
            (options_.bf16 ? sizeof(uint16_t) : sizeof(float));
  a.complete = CompleteLocked();
  return a;
}

absl::StatusOr<ContributionBuffer::Arrival> ContributionBuffer::Accept(
    uint64_t step, uint32_t micro_step, uint32_t rank, uint64_t offset,
    const void* data, size_t n) {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckLocked(step, micro_step, rank));
  const Slice& s = options_.slice;
  if (!s.Contains(offset, n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient range [", offset, ", ", offset + n, ") of group ",
        options_.group, " is outside shard ", options_.shard_id, "'s slice [",
        s.begin, ", ", s.end, ")"));
  }
  const size_t k = slot(rank, micro_step);
  uint64_t& received = received_[k];
  if (done_[k]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed micro-step ", micro_step,
        " of step ", step, " for group ", options_.group));
  }
  if (offset != s.begin + received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient chunk of group ", options_.group, " starts at element ",
        offset, " but element ", s.begin + received, " is expected next"));
  }
  // Keep the chunk's trainable elements, at their compact positions.
  const size_t elem = options_.bf16 ? sizeof(uint16_t) : sizeof(float);
  char* const slot_base = options_.bf16
                              ? reinterpret_cast<char*>(bf16_ + k * elements_)
                              : reinterpret_cast<char*>(sums_ + k * elements_);
  const uint64_t lo = offset - s.begin, hi = lo + n;
  auto copy = [&](uint64_t a, uint64_t b, uint64_t compact) {
    if (a < b) {
      std::memcpy(slot_base + compact * elem,
                  static_cast<const char*>(data) + (a - lo) * elem,
                  (b - a) * elem);
    }
  };
  uint64_t kept = 0;
  if (!options_.trainable) {
    copy(lo, hi, lo);
    kept = n;
  } else {
    uint64_t compact = 0;
    for (const auto& [tlo, thi] : *options_.trainable) {
      const uint64_t a = std::max(tlo, lo), b = std::min(thi, hi);
      copy(a, b, compact + (a > tlo ? a - tlo : 0));
      if (a < b) kept += b - a;
      compact += thi - tlo;
    }
  }
  received += n;
  Arrival a;
  a.bytes = kept * elem;
  if (received == s.size()) {
    done_[k] = 1;
    a.complete = CompleteLocked();
  }
  return a;
}

void ContributionBuffer::Abort(uint64_t step, uint32_t micro_step,
                               uint32_t rank) {
  absl::MutexLock lock(&mu_);
  if (!CheckLocked(step, micro_step, rank).ok()) return;
  const size_t k = slot(rank, micro_step);
  if (!done_[k]) received_[k] = 0;
}

float* ContributionBuffer::Reduce(kernels::CpuKernels& kernels) {
  const size_t n = elements_;
  if (options_.bf16 && n > 0) {
    // Sizes are ours and non-null; a failure is a bug.
    if (!kernels.Bf16ToFp32(bf16_, sums_, n * slots_).ok()) std::abort();
  }
  // Fixed order: slot 0 += slot 1 += ... so the bits do not depend on which
  // trainer arrived first.
  for (size_t c = 1; c < slots_; ++c) {
    const float* src = sums_ + c * n;
    for (size_t i = 0; i < n; ++i) sums_[i] += src[i];
  }
  return sums_;
}

void ContributionBuffer::Reset(uint64_t next_step) {
  absl::MutexLock lock(&mu_);
  step_ = next_step;
  complete_ = 0;
  completed_at_ = absl::InfinitePast();
  std::fill(received_.begin(), received_.end(), 0);
  std::fill(done_.begin(), done_.end(), 0);
}

std::vector<uint32_t> ContributionBuffer::MissingRanksLocked() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < options_.world_size; ++r) {
    for (uint32_t a = 0; a < options_.accumulation_steps; ++a) {
      if (!done_[slot(r, a)]) {
        out.push_back(r);
        break;
      }
    }
  }
  return out;
}

std::vector<uint32_t> ContributionBuffer::MissingRanks() const {
  absl::MutexLock lock(&mu_);
  return MissingRanksLocked();
}

ContributionBuffer::Progress ContributionBuffer::GetProgress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.step = step_;
  p.complete = complete_;
  p.completed_at = completed_at_;
  const bool any =
      complete_ > 0 || std::any_of(received_.begin(), received_.end(),
                                   [](uint64_t r) { return r > 0; });
  if (any) p.waiting_for = MissingRanksLocked();
  return p;
}

bool ContributionBuffer::Quiet() const {
  absl::MutexLock lock(&mu_);
  return complete_ == 0 && std::all_of(received_.begin(), received_.end(),
                                       [](uint64_t r) { return r == 0; });
}

}  // namespace zshard
