#include "server/contribution_buffer.h"

#include <algorithm>
#include <cstdlib>
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

// bf16 bits -> fp32 (exact: the bf16 value is the fp32's upper half).
inline float Widen(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
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
  if (b->elements_ > 0) {
    if (!options.pool) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", options.group, " has trainable elements on ",
                       "shard ", options.shard_id, " but no landing pool"));
    }
    if (options.pool->slot_bytes() < b->contribution_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", options.shard_id, ": landing slots of ",
          options.pool->slot_bytes(), " bytes cannot hold group ",
          options.group, "'s ", b->contribution_bytes(), "-byte contribution"));
    }
  }
  b->sums_.assign(b->elements_, 0.0f);
  if (b->elements_ > 0) {
    ZS_ASSIGN_OR_RETURN(b->kernels_, kernels::CpuKernels::Create());
  }
  if (options.quantized.quantized() && b->elements_ > 0) {
    b->unpacked_.assign(b->elements_, 0.0f);
  }
  absl::MutexLock lock(&b->mu_);
  b->step_ = step;
  b->state_.assign(b->slots_, State::kNone);
  b->slot_.assign(b->slots_, 0);
  b->received_.assign(b->slots_, 0);
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
  if (options_.roster) {
    absl::Status member = options_.roster->CheckContributor(rank, step);
    if (!member.ok()) {
      return absl::Status(
          member.code(),
          absl::StrCat("shard ", options_.shard_id, ": ", member.message()));
    }
  }
  if (options_.slice.size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " owns no elements of group ",
                     options_.group));
  }
  return absl::OkStatus();
}

absl::Status ContributionBuffer::CheckNewLocked(uint64_t step,
                                                uint32_t micro_step,
                                                uint32_t rank) const {
  ZS_RETURN_IF_ERROR(CheckLocked(step, micro_step, rank));
  if (state_[index(rank, micro_step)] != State::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed (part of) micro-step ", micro_step,
        " of step ", step, " for group ", options_.group));
  }
  return absl::OkStatus();
}

absl::Status ContributionBuffer::CheckNew(uint64_t step, uint32_t micro_step,
                                          uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return CheckNewLocked(step, micro_step, rank);
}

absl::StatusOr<bool> ContributionBuffer::InOrder(uint64_t step,
                                                 uint32_t micro_step,
                                                 uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckNewLocked(step, micro_step, rank));
  // The prefix as it stands now: positions of ranks the step no longer
  // waits for count as having a slot (a drop moves it without a Reserve).
  size_t prefix = reserved_prefix_;
  while (prefix < slots_ && (state_[prefix] != State::kNone ||
                             !ExpectedLocked(static_cast<uint32_t>(
                                 prefix % options_.world_size)))) {
    ++prefix;
  }
  return index(rank, micro_step) <= prefix;
}

void ContributionBuffer::AdvancePrefixLocked() {
  while (reserved_prefix_ < slots_ &&
         (state_[reserved_prefix_] != State::kNone ||
          !ExpectedLocked(
              static_cast<uint32_t>(reserved_prefix_ % options_.world_size)))) {
    ++reserved_prefix_;
  }
}

absl::Status ContributionBuffer::Reserve(uint64_t step, uint32_t micro_step,
                                         uint32_t rank, uint32_t slot) {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckNewLocked(step, micro_step, rank));
  const size_t k = index(rank, micro_step);
  state_[k] = State::kReserved;
  slot_[k] = slot;
  received_[k] = 0;
  AdvancePrefixLocked();
  return absl::OkStatus();
}

std::optional<uint32_t> ContributionBuffer::ReservedSlot(uint64_t step,
                                                         uint32_t micro_step,
                                                         uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  if (!CheckLocked(step, micro_step, rank).ok()) return std::nullopt;
  const size_t k = index(rank, micro_step);
  if (state_[k] != State::kReserved) return std::nullopt;
  return slot_[k];
}

ContributionBuffer::Arrival ContributionBuffer::LandLocked(size_t k) {
  state_[k] = State::kLanded;
  AdvancePrefixLocked();
  ++landed_;
  last_landed_ = absl::Now();
  Arrival a;
  // Next to fold once the positions before it that are only waiting to be
  // passed over (ranks the step no longer expects) are.
  size_t next = folded_;
  const bool members = !options_.roster || options_.roster->Quorate();
  while (members && next < k && state_[next] != State::kLanded &&
         !ExpectedLocked(static_cast<uint32_t>(next % options_.world_size))) {
    ++next;
  }
  a.fold = k == next;
  a.bytes = contribution_bytes();
  return a;
}

absl::StatusOr<ContributionBuffer::Arrival> ContributionBuffer::Land(
    uint64_t step, uint32_t micro_step, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  ZS_RETURN_IF_ERROR(CheckLocked(step, micro_step, rank));
  const size_t k = index(rank, micro_step);
  const State s = state_[k];
  if (s == State::kLanded || s == State::kFolded ||
      (s == State::kReserved && received_[k] != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed (part of) micro-step ", micro_step,
        " of step ", step, " for group ", options_.group));
  }
  if (elements_ > 0 && s != State::kReserved) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " landed micro-step ", micro_step, " of step ", step,
        " for group ", options_.group, " on shard ", options_.shard_id,
        " without a landing slot reserved for it"));
  }
  return LandLocked(k);
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
  const size_t k = index(rank, micro_step);
  if (state_[k] == State::kLanded || state_[k] == State::kFolded) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " already pushed micro-step ", micro_step,
        " of step ", step, " for group ", options_.group));
  }
  if (elements_ > 0 && state_[k] != State::kReserved) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer ", rank, " pushed micro-step ", micro_step, " of step ", step,
        " for group ", options_.group, " on shard ", options_.shard_id,
        " without a landing slot reserved for it"));
  }
  uint64_t& received = received_[k];
  if (offset != s.begin + received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient chunk of group ", options_.group, " starts at element ",
        offset, " but element ", s.begin + received, " is expected next"));
  }
  if (options_.quantized.quantized()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", options_.group, " on shard ", options_.shard_id,
        " takes quantized contributions in landing slots, not in chunks"));
  }
  // Keep the chunk's trainable elements, at their compact positions.
  const size_t elem = options_.bf16 ? sizeof(uint16_t) : sizeof(float);
  char* const slot_base =
      elements_ > 0 ? options_.pool->slot_data(slot_[k]) : nullptr;
  const uint64_t lo = offset - s.begin, hi = lo + n;
  auto copy = [&](uint64_t a, uint64_t b, uint64_t compact) {
    if (a < b) {
      std::memcpy(slot_base + compact * elem,
                  static_cast<const char*>(data) + (a - lo) * elem,
                  (b - a) * elem);
    }
  };
  if (!options_.trainable) {
    copy(lo, hi, lo);
  } else {
    uint64_t compact = 0;
    for (const auto& [tlo, thi] : *options_.trainable) {
      const uint64_t a = std::max(tlo, lo), b = std::min(thi, hi);
      copy(a, b, compact + (a > tlo ? a - tlo : 0));
      compact += thi - tlo;
    }
  }
  received += n;
  if (received != s.size()) return Arrival{};
  return LandLocked(k);
}

void ContributionBuffer::Abort(uint64_t step, uint32_t micro_step,
                               uint32_t rank) {
  uint32_t give = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!CheckLocked(step, micro_step, rank).ok()) return;
    const size_t k = index(rank, micro_step);
    if (state_[k] != State::kReserved) return;
    state_[k] = State::kNone;
    received_[k] = 0;
    give = slot_[k];
    reserved_prefix_ = std::min(reserved_prefix_, k);
  }
  if (elements_ > 0) options_.pool->Give(give);
}

void ContributionBuffer::FoldSlot(uint32_t slot, bool first) {
  const size_t n = elements_;
  float* sum = sums_.data();
  const char* src = options_.pool->slot_data(slot);
  // Neither dequantizing nor adding can fail on the bytes (a scale that is
  // not finite gives Inf or NaN values, as an unquantized push of them
  // would); the sizes are ours.
  if (options_.quantized.quantized()) {
    float* out = first ? sum : unpacked_.data();
    if (!UnpackQuantized(*kernels_, options_.quantized, src, n, out).ok())
      std::abort();  // a bug
    if (!first && !kernels_->Accumulate(sum, out, n).ok()) std::abort();
    return;
  }
  if (options_.bf16) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(src);
    if (first) {
      for (size_t i = 0; i < n; ++i) sum[i] = Widen(b[i]);
    } else {
      for (size_t i = 0; i < n; ++i) sum[i] += Widen(b[i]);
    }
    return;
  }
  const float* f = reinterpret_cast<const float*>(src);
  if (first) {
    std::memcpy(sum, f, n * sizeof(float));
  } else if (!kernels_->Accumulate(sum, f, n).ok()) {
    std::abort();  // a bug
  }
}

void ContributionBuffer::FoldPair(uint32_t slot, uint32_t second) {
  const float* a =
      reinterpret_cast<const float*>(options_.pool->slot_data(slot));
  const float* b =
      reinterpret_cast<const float*>(options_.pool->slot_data(second));
  if (!kernels_->Add(sums_.data(), a, b, elements_).ok()) {
    std::abort();  // a bug: the sizes and pointers are ours
  }
}

ContributionBuffer::Folded ContributionBuffer::Fold() {
  Folded f;
  bool quarantined = false;
  for (;;) {
    size_t k;
    uint32_t slot, second;
    bool first, pair;
    {
      absl::MutexLock lock(&mu_);
      // Pass over the positions of ranks the step no longer waits for, once
      // some trainer is a member (with none, the step waits: the next one
      // admitted may still contribute to it).
      const bool members = !options_.roster || options_.roster->Quorate();
      while (members && folded_ < slots_ && state_[folded_] != State::kLanded &&
             !ExpectedLocked(
                 static_cast<uint32_t>(folded_ % options_.world_size))) {
        if (state_[folded_] == State::kReserved && elements_ > 0) {
          options_.pool->Quarantine(
              static_cast<uint32_t>(folded_ % options_.world_size),
              slot_[folded_]);
          quarantined = true;
          ++excused_reserved_;
        }
        state_[folded_] = State::kExcused;
        ++folded_;
      }
      AdvancePrefixLocked();
      if (folded_ == slots_) {
        // Nobody contributed: skipped once a trainer is there to go on with
        // the next step; until then the group waits.
        if (summed_ == 0 && !members) break;
        f.complete = true;
        f.summed = summed_;
        if (completed_at_ == absl::InfinitePast()) {
          completed_at_ =
              last_landed_ == absl::InfinitePast() ? absl::Now() : last_landed_;
        }
        break;
      }
      if (state_[folded_] != State::kLanded) break;
      k = folded_;
      slot = slot_[k];
      first = summed_ == 0;
      // The first two in one pass when the next has landed too.
      pair = first && elements_ > 0 && !options_.bf16 &&
             !options_.quantized.quantized() && k + 1 < slots_ &&
             state_[k + 1] == State::kLanded;
      second = pair ? slot_[k + 1] : 0;
    }
    // Landed and next: nobody else touches their slots or the accumulator.
    if (pair) {
      FoldPair(slot, second);
    } else if (elements_ > 0) {
      FoldSlot(slot, first);
    }
    const size_t folded = pair ? 2 : 1;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = k; i < k + folded; ++i) state_[i] = State::kFolded;
      folded_ += folded;
      summed_ += static_cast<uint32_t>(folded);
    }
    if (elements_ > 0) options_.pool->Give(slot);
    if (pair) options_.pool->Give(second);
    f.contributions += folded;
  }
  if (quarantined) options_.pool->Notify();
  return f;
}

void ContributionBuffer::Reset(uint64_t next_step) {
  absl::MutexLock lock(&mu_);
  step_ = next_step;
  folded_ = 0;
  reserved_prefix_ = 0;
  landed_ = 0;
  summed_ = 0;
  excused_reserved_ = 0;
  last_landed_ = absl::InfinitePast();
  completed_at_ = absl::InfinitePast();
  std::fill(state_.begin(), state_.end(), State::kNone);
  std::fill(received_.begin(), received_.end(), 0);
}

std::vector<uint32_t> ContributionBuffer::MissingRanksLocked() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < options_.world_size; ++r) {
    if (!ExpectedLocked(r)) continue;
    for (uint32_t a = 0; a < options_.accumulation_steps; ++a) {
      const State s = state_[index(r, a)];
      if (s != State::kLanded && s != State::kFolded) {
        out.push_back(r);
        break;
      }
    }
  }
  return out;
}

bool ContributionBuffer::AnyLocked() const {
  return std::any_of(state_.begin(), state_.end(),
                     [](State s) { return s != State::kNone; });
}

std::vector<uint32_t> ContributionBuffer::MissingRanks() const {
  absl::MutexLock lock(&mu_);
  return MissingRanksLocked();
}

ContributionBuffer::Progress ContributionBuffer::GetProgress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.step = step_;
  p.complete = landed_;
  p.completed_at = completed_at_;
  if (AnyLocked()) p.waiting_for = MissingRanksLocked();
  return p;
}

bool ContributionBuffer::BegunLocked() const {
  if (excused_reserved_ > 0) return true;
  return std::any_of(state_.begin(), state_.end(), [](State s) {
    return s == State::kReserved || s == State::kLanded || s == State::kFolded;
  });
}

void ContributionBuffer::Rewind() {
  absl::MutexLock lock(&mu_);
  if (BegunLocked()) return;
  std::fill(state_.begin(), state_.end(), State::kNone);
  folded_ = 0;
  reserved_prefix_ = 0;
  completed_at_ = absl::InfinitePast();
}

bool ContributionBuffer::RankTouched(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  if (rank >= options_.world_size) return false;
  for (uint32_t a = 0; a < options_.accumulation_steps; ++a) {
    if (state_[index(rank, a)] != State::kNone) return true;
  }
  return false;
}

std::pair<uint64_t, uint64_t> ContributionBuffer::LandedMask(
    uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  uint64_t mask = 0;
  for (uint32_t a = 0; a < options_.accumulation_steps && a < 64; ++a) {
    if (rank >= options_.world_size) break;
    const State st = state_[index(rank, a)];
    if (st == State::kLanded || st == State::kFolded) mask |= uint64_t{1} << a;
  }
  return {step_, mask};
}

bool ContributionBuffer::Quiet() const {
  absl::MutexLock lock(&mu_);
  return !BegunLocked();
}

}  // namespace zshard
